package httpretry

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"
)

func TestRetryAfterParsing(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name   string
		header map[string]string
		want   time.Duration
		wantOK bool
	}{
		{name: "none", header: nil},
		{name: "seconds", header: map[string]string{"Retry-After": "2"}, want: 2 * time.Second, wantOK: true},
		{name: "fractional seconds", header: map[string]string{"Retry-After": "0.25"}, want: 250 * time.Millisecond, wantOK: true},
		{name: "http date", header: map[string]string{"Retry-After": now.Add(7 * time.Second).Format(http.TimeFormat)}, want: 7 * time.Second, wantOK: true},
		{name: "past date", header: map[string]string{"Retry-After": now.Add(-time.Hour).Format(http.TimeFormat)}, want: 0, wantOK: true},
		{name: "negative", header: map[string]string{"Retry-After": "-3"}},
		{name: "garbage", header: map[string]string{"Retry-After": "soon"}},
		{name: "milliseconds win", header: map[string]string{"Retry-After-Ms": "120", "Retry-After": "5"}, want: 120 * time.Millisecond, wantOK: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tc.header {
				h.Set(k, v)
			}
			got, ok := RetryAfter(h, now)
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("RetryAfter(%v) = %v, %v; want %v, %v", tc.header, got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

func TestBackoffWaitBounds(t *testing.T) {
	t.Parallel()
	base, maxWait := 100*time.Millisecond, time.Second
	p := Policy{Base: base, Max: maxWait}
	for n := 1; n <= 8; n++ {
		step := min(base<<(n-1), maxWait)
		for range 200 {
			w := Backoff(base, maxWait, n)
			if w < step/2 || w > step {
				t.Fatalf("Backoff(retry %d) = %v, want within [%v, %v] (equal jitter, capped)", n, w, step/2, step)
			}
		}
	}
	if w := p.Wait(1, 10*time.Second, true); w != maxWait {
		t.Errorf("Wait with Retry-After 10s = %v, want the cap %v", w, maxWait)
	}
	if w := p.Wait(1, 300*time.Millisecond, true); w != 300*time.Millisecond {
		t.Errorf("Wait with Retry-After 300ms = %v, want exactly 300ms", w)
	}
}

// TestDo: Do retries only what is worth retrying, at most Policy.Retries
// times, counts the attempts it made, names the call and the attempts in
// its error, and returns ctx's own error at once when ctx ends in a wait.
func TestDo(t *testing.T) {
	t.Parallel()
	errTransient := errors.New("transient")
	errPermanent := errors.New("permanent")
	tests := []struct {
		name         string
		results      []Result // one per attempt; success after the last
		retries      int
		cancelInWait bool
		wantAttempts int
		wantErr      error  // errors.Is
		wantMsg      string // the error's text ("" with no error)
		why          string
	}{
		{name: "success at once", wantAttempts: 1, why: "a success is not retried"},
		{name: "success after two retries", results: []Result{{Err: errTransient, Retry: true}, {Err: errTransient, Retry: true}},
			retries: 2, wantAttempts: 3, why: "retryable failures are retried up to Retries times"},
		{name: "permanent failure", results: []Result{{Err: errPermanent}}, retries: 5, wantAttempts: 1,
			wantErr: errPermanent, wantMsg: "call x: attempt 1: permanent", why: "a failure that is not retryable ends the call"},
		{name: "retries spent", results: []Result{{Err: errTransient, Retry: true}, {Err: errTransient, Retry: true}, {Err: errTransient, Retry: true}},
			retries: 2, wantAttempts: 3, wantErr: errTransient, wantMsg: "call x: gave up after 3 attempts: transient",
			why: "the first attempt and Retries retries, then the last error"},
		{name: "ctx ends in a long Retry-After", results: []Result{{Err: errTransient, Retry: true, Wait: time.Hour, HasWait: true}},
			retries: 2, cancelInWait: true, wantAttempts: 1, wantErr: context.Canceled, wantMsg: "context canceled",
			why: "ctx's own error, at once, without the attempt that was not sent"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			p := Policy{Retries: tc.retries, Base: time.Millisecond, Max: 2 * time.Hour}
			calls := 0
			var waits []int
			start := time.Now()
			v, n, err := Do(ctx, p, "call x", func() (int, Result) {
				calls++
				if calls <= len(tc.results) {
					return 0, tc.results[calls-1]
				}
				return 42, Result{}
			}, func(next int, wait time.Duration, err error) {
				waits = append(waits, next)
				if tc.cancelInWait {
					cancel()
				}
			})
			if n != tc.wantAttempts || calls != tc.wantAttempts {
				t.Errorf("Do made %d attempts and reported %d, want %d (%s)", calls, n, tc.wantAttempts, tc.why)
			}
			for i, next := range waits {
				if next != i+2 {
					t.Errorf("retry %d announced attempt %d, want %d (the number of the coming attempt, for logs)", i+1, next, i+2)
				}
			}
			if tc.wantErr == nil {
				if err != nil || v != 42 {
					t.Errorf("Do = %d, %v; want 42, nil (%s)", v, err, tc.why)
				}
				return
			}
			if !errors.Is(err, tc.wantErr) || err.Error() != tc.wantMsg || v != 0 {
				t.Errorf("Do = %d, %v; want 0 and the error %q wrapping %v (%s)", v, err, tc.wantMsg, tc.wantErr, tc.why)
			}
			if took := time.Since(start); took > 10*time.Second {
				t.Errorf("Do took %v, want it to return at once when ctx ends in a wait", took)
			}
		})
	}
}

// TestHTTPErrorNamesTheTable: a redirect's message names the base_url key
// of the caller's config table, so the user knows what to fix.
func TestHTTPErrorNamesTheTable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		err  HTTPError
		want string
	}{
		{HTTPError{StatusCode: 307, Location: "http://x/v1", Table: "embedding.openai"},
			"http 307: redirect to http://x/v1 not followed (fix embedding.openai.base_url)"},
		{HTTPError{StatusCode: 301, Table: "openai", Message: "moved"},
			"http 301: redirect to (no Location) not followed (fix openai.base_url): moved"},
		{HTTPError{StatusCode: 429, Code: "rate_limit", Message: "slow down", Table: "openai"},
			"http 429 (code rate_limit): slow down"},
	}
	for _, tc := range tests {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("HTTPError %+v says %q, want %q", tc.err, got, tc.want)
		}
	}
}
