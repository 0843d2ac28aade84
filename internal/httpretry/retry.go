// Package httpretry is how recal's providers call an OpenAI-compatible
// JSON endpoint (llmpool's chat models, embed's embedding models): one
// reused http.Client per provider that follows no redirect, one POST per
// attempt under its own timeout, every reply classified as a success, a
// permanent failure or worth another attempt, and a retry policy of small
// functions that honour Retry-After and return at once when ctx ends
// (after hashicorp/go-retryablehttp's client.go).
package httpretry

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Policy says how often and how long a call is retried.
type Policy struct {
	// Retries is the number of attempts after the first (0: none).
	Retries int
	// Base is the first step of the exponential backoff.
	Base time.Duration
	// Max caps every wait, a server's Retry-After included.
	Max time.Duration
}

// Result is the outcome of one attempt: Err is nil on success; otherwise
// Retry says whether another attempt is worth it, and Wait the wait the
// server asked for (when HasWait).
type Result struct {
	Err     error
	Retry   bool
	Wait    time.Duration
	HasWait bool
}

// Do calls attempt until it succeeds, fails for good, the retries are spent
// or ctx ends, sleeping p.Wait between attempts. Before each sleep it calls
// retrying, when not nil, with the number of the coming attempt, the wait
// and the last error (for a log line). It returns the successful attempt's
// value, the number of attempts made, and the error: ctx's own error when
// ctx ended, else the last attempt's error as "WHAT: attempt N: ERR" (not
// retryable) or "WHAT: gave up after N attempts: ERR".
func Do[T any](ctx context.Context, p Policy, what string, attempt func() (T, Result),
	retrying func(next int, wait time.Duration, err error)) (T, int, error) {
	var zero T
	for n := 1; ; n++ {
		v, res := attempt()
		if res.Err == nil {
			return v, n, nil
		}
		if err := ctx.Err(); err != nil {
			return zero, n, err
		}
		if !res.Retry {
			return zero, n, fmt.Errorf("%s: attempt %d: %w", what, n, res.Err)
		}
		if n > p.Retries {
			return zero, n, fmt.Errorf("%s: gave up after %d attempts: %w", what, n, res.Err)
		}
		wait := p.Wait(n, res.Wait, res.HasWait)
		if retrying != nil {
			retrying(n+1, wait, res.Err)
		}
		if err := Sleep(ctx, wait); err != nil {
			return zero, n, err
		}
	}
}

// Retryable reports whether an HTTP status is worth retrying: 408, 429 and
// every 5xx. Other statuses are permanent (a bad request, a bad key, an
// unknown model id, a redirect) and are returned at once.
func Retryable(status int) bool {
	return status == http.StatusRequestTimeout || status == http.StatusTooManyRequests || (status >= 500 && status <= 599)
}

// RetryAfter returns the wait a server asked for, from "Retry-After-Ms"
// (milliseconds, sent by OpenAI-style APIs) or "Retry-After" (delay
// seconds, possibly fractional, or an HTTP-date relative to now). ok is
// false when no usable header is present. A date in the past gives 0.
func RetryAfter(h http.Header, now time.Time) (d time.Duration, ok bool) {
	if v := strings.TrimSpace(h.Get("Retry-After-Ms")); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms >= 0 && ms < 1e12 {
			return time.Duration(ms * float64(time.Millisecond)), true
		}
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		if !(s >= 0 && s <= 1e9) { // NaN too
			return 0, false
		}
		return time.Duration(s * float64(time.Second)), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}

// Backoff returns the wait before retry number n (1 for the first retry):
// exponential backoff base·2^(n-1), capped at most, with "equal jitter"
// (half fixed, half uniform) so the wait is never below half the
// exponential step and concurrent callers spread out.
func Backoff(base, most time.Duration, n int) time.Duration {
	d := base
	for i := 1; i < n && d < most; i++ {
		d *= 2
	}
	d = min(d, most)
	if d <= 0 {
		return 0
	}
	half := d / 2
	return half + time.Duration(rand.Int64N(int64(d-half)+1))
}

// Wait is the wait before retry number n: the server's Retry-After when it
// sent one (hasAsked), else Backoff; either way at most p.Max.
func (p Policy) Wait(n int, asked time.Duration, hasAsked bool) time.Duration {
	if hasAsked {
		return min(asked, p.Max)
	}
	return Backoff(p.Base, p.Max, n)
}

// Sleep waits for d or until ctx is done, whichever comes first, and
// returns ctx's error in the second case.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
