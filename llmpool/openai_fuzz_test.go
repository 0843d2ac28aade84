package llmpool

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"
)

// fuzzKey is the API key of the fuzzed provider; a reply may echo it.
const fuzzKey = "sk-fuzz-0123456789"

// printable reports whether s is valid UTF-8 free of control characters,
// fit for one line of a log or an error.
func printable(s string) bool {
	return utf8.ValidString(s) && strings.IndexFunc(s, unicode.IsControl) < 0
}

// FuzzOpenAIReply feeds arbitrary bodies of an OpenAI-compatible provider
// (2xx or error statuses) to the reply parser. A provider is outside recal:
// no body may panic, a reply's token counts must be usable as costs (never
// negative), and an error must be one printable line of bounded size
// without the API key.
func FuzzOpenAIReply(f *testing.F) {
	for _, s := range []string{
		`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Paris"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}`,
		`{"choices":[{"message":{"content":null}}]}`,
		`{"choices":[]}`,
		`{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":-1000000,"completion_tokens":3}}`,
		`{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":9223372036854775807,"completion_tokens":1}}`,
		`{"error":{"message":"Invalid API key sk-fuzz-0123456789","code":"invalid_api_key","type":"auth"}}`,
		`{"error":{"message":"rate limited","code":429}}`,
		`{"error":{"message":"x","code":{"nested":` + "\n" + `"sk-fuzz-0123456789"}}}`,
		`{"error":"upstream \u0000 failed` + "\xff" + `"}`,
		`{"error":null,"choices":[{"message":{"content":"ok"}}]}`,
		`<html>502 Bad Gateway</html>`,
		`{"choices":[{"message":{"content":"` + strings.Repeat("é", 400) + `"}}]}`,
		``,
	} {
		f.Add(200, []byte(s))
	}
	f.Add(429, []byte(`{"error":{"message":"slow down","code":"429"}}`))
	f.Add(500, []byte("Internal error\r\nsk-fuzz-0123456789\r\n"))
	p := &openAI{name: "m", cfg: OpenAIConfig{Model: "test/m"}, apiKey: fuzzKey}
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		checkErr := func(what string, err error) {
			t.Helper()
			if strings.Contains(err.Error(), fuzzKey) {
				t.Fatalf("%s: error %q holds the API key", what, err)
			}
			var herr *HTTPError
			if !errors.As(err, &herr) {
				return
			}
			if !printable(herr.Message) || utf8.RuneCountInString(herr.Message) > maxErrorChars {
				t.Fatalf("%s: message %q: want one printable line of at most %d characters", what, herr.Message, maxErrorChars)
			}
			if !printable(herr.Code) || utf8.RuneCountInString(herr.Code) > 40 || strings.ContainsAny(herr.Code, " \t") {
				t.Fatalf("%s: code %q: want a short printable word", what, herr.Code)
			}
			if !printable(herr.Error()) {
				t.Fatalf("%s: Error() = %q is not one printable line", what, herr.Error())
			}
		}
		c, res := p.parse(200, body, "a query", 0, false)
		if res.err != nil {
			checkErr("parse", res.err)
		} else if c.InputTokens < 0 || c.OutputTokens < 0 {
			t.Fatalf("parse(%q) = %d input and %d output tokens; want counts ≥ 0 (they are billed as costs)", body, c.InputTokens, c.OutputTokens)
		}
		checkErr("httpError", p.httpError(status, body))
	})
}

// FuzzRetryAfter feeds arbitrary Retry-After and Retry-After-Ms values to
// the retry policy: a wait it takes from a server is never negative.
func FuzzRetryAfter(f *testing.F) {
	for _, s := range [][2]string{{"", "1.5"}, {"250", ""}, {"", "Wed, 21 Oct 2015 07:28:00 GMT"}, {"", "NaN"}, {"nan", "inf"},
		{"-1", "-1"}, {"1e11", "1e9"}, {"", "Fri, 31 Dec 9999 23:59:59 GMT"}, {"0x10", "+Inf"}} {
		f.Add(s[0], s[1])
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, ms, secs string) {
		h := http.Header{}
		h.Set("Retry-After-Ms", ms)
		h.Set("Retry-After", secs)
		d, ok := retryAfter(h, now)
		if ok && d < 0 {
			t.Fatalf("retryAfter(Retry-After-Ms %q, Retry-After %q) = %v; want a wait ≥ 0", ms, secs, d)
		}
		if !ok && d != 0 {
			t.Fatalf("retryAfter(Retry-After-Ms %q, Retry-After %q) = %v, false; want 0 without a usable header", ms, secs, d)
		}
		if w := retryWait(time.Millisecond, time.Second, 1, d, ok); w < 0 || w > time.Second {
			t.Fatalf("retryWait with the server's %v = %v; want a wait in [0, max]", d, w)
		}
	})
}

func TestParseHostileReplies(t *testing.T) {
	p := &openAI{name: "m", cfg: OpenAIConfig{Model: "test/m"}, apiKey: fuzzKey}
	t.Run("negative usage is estimated", func(t *testing.T) {
		c, res := p.parse(200, []byte(`{"choices":[{"message":{"content":"twelve chars"}}],"usage":{"prompt_tokens":-1000000,"completion_tokens":3}}`), "a query", 0, false)
		if res.err != nil || !c.Estimated || c.InputTokens != 2+chatOverheadTokens || c.OutputTokens != 3 {
			t.Fatalf("got %+v, %v; want the estimate (%d in, 3 out): a negative count would make the call pay back", c, res.err, 2+chatOverheadTokens)
		}
	})
	for _, tc := range []struct {
		name, body        string
		wantMsg, wantCode string
	}{
		{"control characters in the message", `{"error":"upstream \u0000 failed\u001b[31m"}`, "upstream failed[31m", ""},
		{"object as code", `{"error":{"message":"x","code":{"nested":` + "\n" + `"v"}}}`, "x", ""},
		{"escaped string code", `{"error":{"message":"x","code":"rate\u005flimit"}}`, "x", "rate_limit"},
		{"number code", `{"error":{"message":"x","code":429}}`, "x", "429"},
		{"null code", `{"error":{"message":"x","code":null}}`, "x", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, res := p.parse(200, []byte(tc.body), "q", 0, false)
			var herr *HTTPError
			if !errors.As(res.err, &herr) {
				t.Fatalf("parse(%s) error %v; want an *HTTPError", tc.body, res.err)
			}
			if herr.Message != tc.wantMsg || herr.Code != tc.wantCode {
				t.Fatalf("parse(%s): message %q, code %q; want %q, %q (one printable line for logs)", tc.body, herr.Message, herr.Code, tc.wantMsg, tc.wantCode)
			}
		})
	}
}

func TestRetryAfterRefusesNaN(t *testing.T) {
	for _, v := range []string{"NaN", "nan", "-NaN"} {
		h := http.Header{}
		h.Set("Retry-After", v)
		if d, ok := retryAfter(h, time.Now()); ok {
			t.Errorf("Retry-After %q gave a wait of %v; want no usable header (NaN converts to a negative duration)", v, d)
		}
	}
}
