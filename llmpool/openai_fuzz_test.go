package llmpool

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/recal-project/recal/internal/httpretry"
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
	p := fuzzProvider()
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
			if !printable(herr.Message) || utf8.RuneCountInString(herr.Message) > 300 {
				t.Fatalf("%s: message %q: want one printable line of at most 300 characters", what, herr.Message)
			}
			if !printable(herr.Code) || utf8.RuneCountInString(herr.Code) > 40 || strings.ContainsAny(herr.Code, " \t") {
				t.Fatalf("%s: code %q: want a short printable word", what, herr.Code)
			}
			if !printable(herr.Error()) {
				t.Fatalf("%s: Error() = %q is not one printable line", what, herr.Error())
			}
		}
		c, res := p.parse(httpretry.Reply{Status: 200, Body: body}, "a query")
		if res.Err != nil {
			checkErr("parse", res.Err)
		} else if c.InputTokens < 0 || c.OutputTokens < 0 {
			t.Fatalf("parse(%q) = %d input and %d output tokens; want counts ≥ 0 (they are billed as costs)", body, c.InputTokens, c.OutputTokens)
		}
		// The body read as an error object of any status (the shared
		// client's reading of error replies).
		if err := p.client.Refusal(httpretry.Reply{Status: status, Body: body}).Err; err != nil {
			checkErr("refusal", err)
		}
	})
}

// fuzzProvider is an openAI provider whose API key is fuzzKey.
func fuzzProvider() *openAI {
	p := &openAI{name: "m", cfg: OpenAIConfig{Model: "test/m"}}
	p.client = httpretry.NewClient(httpretry.Options{URL: "http://127.0.0.1:1/v1/chat/completions", APIKey: fuzzKey, Timeout: time.Second, MaxReplyBytes: 1 << 20, Table: "openai"})
	return p
}

func TestParseHostileReplies(t *testing.T) {
	p := fuzzProvider()
	t.Run("negative usage is estimated", func(t *testing.T) {
		c, res := p.parse(httpretry.Reply{Status: 200, Body: []byte(`{"choices":[{"message":{"content":"twelve chars"}}],"usage":{"prompt_tokens":-1000000,"completion_tokens":3}}`)}, "a query")
		if res.Err != nil || !c.Estimated || c.InputTokens != 2+chatOverheadTokens || c.OutputTokens != 3 {
			t.Fatalf("got %+v, %v; want the estimate (%d in, 3 out): a negative count would make the call pay back", c, res.Err, 2+chatOverheadTokens)
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
			_, res := p.parse(httpretry.Reply{Status: 200, Body: []byte(tc.body)}, "q")
			var herr *HTTPError
			if !errors.As(res.Err, &herr) {
				t.Fatalf("parse(%s) error %v; want an *HTTPError", tc.body, res.Err)
			}
			if herr.Message != tc.wantMsg || herr.Code != tc.wantCode {
				t.Fatalf("parse(%s): message %q, code %q; want %q, %q (one printable line for logs)", tc.body, herr.Message, herr.Code, tc.wantMsg, tc.wantCode)
			}
		})
	}
}
