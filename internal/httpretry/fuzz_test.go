package httpretry

import (
	"net/http"
	"testing"
	"time"
)

// FuzzRetryAfter feeds arbitrary Retry-After and Retry-After-Ms values to
// the retry policy: a wait it takes from a server is never negative.
func FuzzRetryAfter(f *testing.F) {
	for _, s := range [][2]string{{"", "1.5"}, {"250", ""}, {"", "Wed, 21 Oct 2015 07:28:00 GMT"}, {"", "NaN"}, {"nan", "inf"},
		{"-1", "-1"}, {"1e11", "1e9"}, {"", "Fri, 31 Dec 9999 23:59:59 GMT"}, {"0x10", "+Inf"}} {
		f.Add(s[0], s[1])
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p := Policy{Base: time.Millisecond, Max: time.Second}
	f.Fuzz(func(t *testing.T, ms, secs string) {
		h := http.Header{}
		h.Set("Retry-After-Ms", ms)
		h.Set("Retry-After", secs)
		d, ok := RetryAfter(h, now)
		if ok && d < 0 {
			t.Fatalf("RetryAfter(Retry-After-Ms %q, Retry-After %q) = %v; want a wait ≥ 0", ms, secs, d)
		}
		if !ok && d != 0 {
			t.Fatalf("RetryAfter(Retry-After-Ms %q, Retry-After %q) = %v, false; want 0 without a usable header", ms, secs, d)
		}
		if w := p.Wait(1, d, ok); w < 0 || w > time.Second {
			t.Fatalf("Wait with the server's %v = %v; want a wait in [0, max]", d, w)
		}
	})
}

func TestRetryAfterRefusesNaN(t *testing.T) {
	for _, v := range []string{"NaN", "nan", "-NaN"} {
		h := http.Header{}
		h.Set("Retry-After", v)
		if d, ok := RetryAfter(h, time.Now()); ok {
			t.Errorf("Retry-After %q gave a wait of %v; want no usable header (NaN converts to a negative duration)", v, d)
		}
	}
}
