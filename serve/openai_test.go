package serve

import (
	"bytes"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/recal-project/recal/config"
)

// chatSeeds are request bodies for the fuzz targets' seed corpus: valid
// requests using every implemented parameter, and the hostile and malformed
// ones of TestBadRequests.
var chatSeeds = []string{
	`{"model":"recal-test","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"Who wrote Hamlet?"}]}`,
	`{"messages":[{"role":"user","content":[{"type":"text","text":"part one"},{"type":"text","text":"part two"}]}],"temperature":0.7,"top_p":0.9,"max_tokens":64,"max_completion_tokens":32,"n":1,"user":"u-1","presence_penalty":0,"frequency_penalty":0,"logprobs":false}`,
	`{"messages":[{"role":"user","content":"q"}],"stream":true,"stream_options":{"include_usage":true}}`,
	`{"messages":[{"role":"developer","content":"x"},{"role":"user","content":"q"},{"role":"assistant","content":null,"tool_calls":[{"id":"1"}],"refusal":null},{"role":"tool","tool_call_id":"1","content":"r"},{"role":"user","content":"last"}],"recal":{"models":["SIM-A"," sim-b ","sim-a"],"max_turns":2,"max_cost_usd":0.01}}`,
	`{"messages":[`,
	`[1,2]`,
	``,
	`{"messages":[{"role":"user","content":"q"}]}{}`,
	`{"model":"recal-test"}`,
	`{"messages":[{"role":"wizard","content":"hi"}]}`,
	`{"messages":[{"role":"user","content":"   "}]}`,
	"{\"messages\":[{\"role\":\"user\",\"content\":\"caf\xe9\"}]}",
	`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`,
	`{"messages":[{"role":"user","content":7}]}`,
	`{"messages":[{"role":"user","content":"q"}],"recal":{"models":[]}}`,
	`{"messages":[{"role":"user","content":"q"}],"recal":{"max_turns":4,"max_cost_usd":-1,"budget":3}}`,
	`{"messages":[{"role":"user","content":"q"}],"tools":[]}`,
	`{"messages":[{"role":"user","content":"q"}],"temperature":"hot","top_p":0}`,
	`{"messages":[{"role":"user","content":"q"}],"temperature":1e400}`,
	`{"messages":[{"role":"user","content":"q"}],"max_tokens":-9223372036854775808}`,
	`{"messages":[{"role":"user","content":"q"}],"stream_options":{"include_usage":true}}`,
	`{"model":"gpt-4o","messages":[{"role":"user","content":"q"}]}`,
	`{"messages":[{"role":"user","content":"\ud800 \u0000 ` + "\u202e" + `"}],"user":"` + strings.Repeat("é", 300) + `"}`,
	`{"messages":null,"messages":[{"role":"user","content":"dup"}]}`,
}

func fuzzLimits() limits {
	return limits{name: "recal-test", models: map[string]string{"sim-a": "sim-a", "sim-b": "sim-b"}, modelList: "sim-a, sim-b",
		maxTurns: 3, maxQuestionChars: 50}
}

// parseChat never panics, and what it accepts is within every limit: a
// non-empty question of at most max_question_chars, sampling in range,
// known pool models without repeats, turns within router.max_turns, a
// finite positive budget. What it refuses is a 4xx in OpenAI's shape with a
// short message that quotes the input cut.
func FuzzParseChat(f *testing.F) {
	for _, s := range chatSeeds {
		f.Add([]byte(s))
	}
	lim := fuzzLimits()
	f.Fuzz(func(t *testing.T, body []byte) {
		req, aerr := parseChat(body, lim)
		if aerr != nil {
			checkAPIError(t, aerr)
			return
		}
		q := req.query
		switch {
		case q.Question == "" || q.Question != strings.TrimSpace(q.Question) || !utf8.ValidString(q.Question):
			t.Errorf("accepted question %q: want non-empty, trimmed, valid UTF-8", q.Question)
		case utf8.RuneCountInString(q.Question) > lim.maxQuestionChars:
			t.Errorf("accepted a question of %d characters; max_question_chars is %d", utf8.RuneCountInString(q.Question), lim.maxQuestionChars)
		case !(q.Sampling.Temperature >= 0 && q.Sampling.Temperature <= 2) || !(q.Sampling.TopP >= 0 && q.Sampling.TopP <= 1) || q.Sampling.TopK != 0:
			t.Errorf("accepted sampling %+v: want temperature in [0, 2], top_p in [0, 1], no top_k", q.Sampling)
		case q.MaxTokens < 0 || q.MaxTurns < 0 || q.MaxTurns > lim.maxTurns:
			t.Errorf("accepted max tokens %d, max turns %d: want ≥ 0 and turns ≤ %d", q.MaxTokens, q.MaxTurns, lim.maxTurns)
		case !(q.MaxCostUSD >= 0) || math.IsInf(q.MaxCostUSD, 0):
			t.Errorf("accepted a budget of %v USD: want a finite number ≥ 0", q.MaxCostUSD)
		case req.includeUsage && !req.stream:
			t.Errorf("include_usage without stream was accepted")
		case utf8.RuneCountInString(req.user) > 256:
			t.Errorf("accepted a user of %d characters: want at most 256", utf8.RuneCountInString(req.user))
		}
		if q.Models != nil && len(q.Models) == 0 {
			t.Errorf("accepted an empty, non-nil model list: the backend would read it as all models")
		}
		seen := map[string]bool{}
		for _, m := range q.Models {
			if _, ok := lim.models[m]; !ok || seen[m] {
				t.Errorf("accepted models %q: want canonical pool names, each once", q.Models)
			}
			seen[m] = true
		}
		if again, aerr := parseChat(body, lim); aerr != nil || !sameRequest(again, req) {
			t.Errorf("parsing the same body twice gave %+v, %v, then %+v", req, aerr, again)
		}
	})
}

func sameRequest(a, b request) bool {
	qa, qb := a.query, b.query
	return qa.Question == qb.Question && slices.Equal(qa.Models, qb.Models) && qa.MaxTurns == qb.MaxTurns &&
		qa.MaxCostUSD == qb.MaxCostUSD && qa.Sampling == qb.Sampling && qa.MaxTokens == qb.MaxTokens &&
		a.stream == b.stream && a.includeUsage == b.includeUsage && a.user == b.user
}

// checkAPIError fails unless e is a client error in OpenAI's shape whose
// message is short, valid UTF-8 and encodes as JSON.
func checkAPIError(t *testing.T, e *apiError) {
	t.Helper()
	if e.Status < 400 || e.Status > 499 || e.Type != typeInvalid || e.Message == "" {
		t.Errorf("error %+v: want a 4xx invalid_request_error with a message", e)
	}
	if !utf8.ValidString(e.Message) || len(e.Message) > 1500 {
		t.Errorf("error message of %d bytes (valid UTF-8: %v): want a short one that cuts what it quotes", len(e.Message), utf8.ValidString(e.Message))
	}
	if e.Param != nil && *e.Param == "" {
		t.Errorf("error %+v: an empty param must be null", e)
	}
	if _, err := json.Marshal(map[string]*apiError{"error": e}); err != nil {
		t.Errorf("error %+v does not encode: %v", e, err)
	}
}

// Any body POSTed to /v1/chat/completions gets a complete answer: a
// chat.completion (or its event stream) echoing the question, or an error
// in OpenAI's shape with a 4xx status. Nothing panics, nothing hangs.
func FuzzChatCompletions(f *testing.F) {
	for _, s := range chatSeeds {
		f.Add([]byte(s))
	}
	pool := simPool(f, 0)
	opt := Options{Config: config.DefaultServe(), Name: "recal-test", Models: pool.Models(), MaxTurns: 3}
	backend := newScriptBackend(pool, opt.Config.MaxBatch, 1)
	opt.Backend = backend
	srv, err := New(opt)
	if err != nil {
		f.Fatal(err)
	}
	srv.SetReady(true)
	h := srv.Handler()
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		h.ServeHTTP(rec, r)
		out := rec.Body.Bytes()
		if rec.Code == http.StatusOK {
			req, aerr := parseChat(body, srv.lim)
			if aerr != nil {
				t.Fatalf("200 for a body parseChat refuses (%s): %s", aerr.Message, out)
			}
			echo, _ := json.Marshal("echo: " + req.query.Question)
			if req.stream {
				if !bytes.HasSuffix(out, []byte("data: [DONE]\n\n")) || !bytes.Contains(out, echo[1:len(echo)-1]) {
					t.Errorf("stream %q: want the answer and data: [DONE]", out)
				}
				return
			}
			var c chatCompletion
			if err := json.Unmarshal(out, &c); err != nil || c.Object != "chat.completion" || len(c.Choices) != 1 ||
				c.Choices[0].Message == nil || c.Choices[0].Message.Content == nil || *c.Choices[0].Message.Content != "echo: "+req.query.Question {
				t.Errorf("200 %s: want a chat.completion answering %q", out, req.query.Question)
			}
			return
		}
		var e struct {
			Error *apiError `json:"error"`
		}
		if err := json.Unmarshal(out, &e); err != nil || e.Error == nil {
			t.Fatalf("status %d with %q: want an OpenAI error object", rec.Code, out)
		}
		e.Error.Status = rec.Code
		checkAPIError(t, e.Error)
		if len(out) > 2000 {
			t.Errorf("a %d-byte error: the client's input must not be echoed in full", len(out))
		}
	})
}
