package llmpool

import (
	"context"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// This file holds the retry policy of the openai provider as small functions
// (after hashicorp/go-retryablehttp's client.go): which replies are retried,
// how long to wait, and a context-aware sleep.

// retryableStatus reports whether an HTTP status is worth retrying: 408,
// 429 and every 5xx. Other 4xx are permanent (bad request, bad key, unknown
// model id) and are returned at once.
func retryableStatus(code int) bool {
	return code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || (code >= 500 && code <= 599)
}

// retryAfter returns the wait a server asked for, from "Retry-After-Ms"
// (milliseconds, sent by OpenAI-style APIs) or "Retry-After" (delay seconds,
// possibly fractional, or an HTTP-date relative to now). ok is false when no
// usable header is present. A date in the past gives 0.
func retryAfter(h http.Header, now time.Time) (d time.Duration, ok bool) {
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

// backoffWait returns the wait before retry number n (1 for the first
// retry): exponential backoff base·2^(n-1), capped at maxWait, with "equal
// jitter" (half fixed, half uniform) so the wait is never below half the
// exponential step and concurrent callers spread out.
func backoffWait(base, maxWait time.Duration, n int) time.Duration {
	d := base
	for i := 1; i < n && d < maxWait; i++ {
		d *= 2
	}
	d = min(d, maxWait)
	if d <= 0 {
		return 0
	}
	half := d / 2
	return half + time.Duration(rand.Int64N(int64(d-half)+1))
}

// retryWait combines the two: the server's Retry-After when it sent one,
// else the backoff; either way at most maxWait.
func retryWait(base, maxWait time.Duration, n int, serverWait time.Duration, hasServerWait bool) time.Duration {
	if hasServerWait {
		return min(serverWait, maxWait)
	}
	return backoffWait(base, maxWait, n)
}

// sleepCtx waits for d or until ctx is done, whichever comes first, and
// returns ctx's error in the second case.
func sleepCtx(ctx context.Context, d time.Duration) error {
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
