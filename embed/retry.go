package embed

import (
	"context"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The openai provider's retry policy, as small functions (the pattern of
// hashicorp/go-retryablehttp and of llmpool's retry.go): what is retried,
// how long to wait, and a sleep that ends with ctx.

// retryable reports whether an HTTP status is worth another attempt: 408,
// 429 and 5xx. Other statuses (a bad key, an unknown model, a redirect) are
// permanent.
func retryable(status int) bool {
	return status == http.StatusRequestTimeout || status == http.StatusTooManyRequests || (status >= 500 && status <= 599)
}

// serverWait reads the wait a server asks for: Retry-After-Ms
// (milliseconds), or Retry-After in seconds or as an HTTP date. ok is false
// without a usable header.
func serverWait(h http.Header, now time.Time) (time.Duration, bool) {
	if v := strings.TrimSpace(h.Get("Retry-After-Ms")); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms >= 0 && ms < 1e12 {
			return time.Duration(ms * float64(time.Millisecond)), true
		}
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil && s >= 0 && s < 1e9 {
		return time.Duration(s * float64(time.Second)), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}

// backoff is the wait before retry n (1 = the first): base·2^(n-1) capped
// at most, half of it fixed and half uniform ("equal jitter"). A wait the
// server asked for replaces it, capped at most too.
func backoff(base, most time.Duration, n int, asked time.Duration, hasAsked bool) time.Duration {
	if hasAsked {
		return min(asked, most)
	}
	d := base
	for i := 1; i < n && d < most; i++ {
		d *= 2
	}
	d = min(d, most)
	if d <= 0 {
		return 0
	}
	return d/2 + time.Duration(rand.Int64N(int64(d-d/2)+1))
}

// sleep waits d or until ctx ends, returning ctx's error then.
func sleep(ctx context.Context, d time.Duration) error {
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
