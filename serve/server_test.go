package serve

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/llmpool"
	"github.com/recal-project/recal/router"
)

func TestMain(m *testing.M) {
	// No goroutine of a server, a backend or a pool outlives the tests.
	goleak.VerifyTestMain(m)
}

// setCallTokens sets a call's token counts.
func setCallTokens(c *router.Call, in, out int) { c.PromptTokens, c.CompletionTokens = in, out }

// simPool is a pool of two simulated models answering after latency.
func simPool(t testing.TB, latency time.Duration) *llmpool.Pool {
	t.Helper()
	cfg := llmpool.Config{Cache: llmpool.CacheOff, Models: []llmpool.ModelConfig{
		{Name: "sim-a", Description: "simulated A", PriceIn: 1, PriceOut: 2, Provider: "sim",
			Sim: &llmpool.SimConfig{DefaultAccuracy: 0.5, Latency: latency, TokensIn: 10, TokensOut: 5}},
		{Name: "sim-b", Description: "simulated B", PriceIn: 3, PriceOut: 4, Provider: "sim",
			Sim: &llmpool.SimConfig{DefaultAccuracy: 0.5, Latency: latency, TokensIn: 10, TokensOut: 5}},
	}}
	p, err := llmpool.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

type fixture struct {
	srv     *Server
	http    *httptest.Server
	backend *scriptBackend
	log     *syncBuffer
	trace   *syncBuffer
}

// syncBuffer is a bytes.Buffer safe for the server's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// newFixture starts a test server over a scripted backend making calls pool
// calls per question; edit changes the options first.
func newFixture(t *testing.T, pool *llmpool.Pool, calls int, edit func(*Options)) *fixture {
	t.Helper()
	cfg := config.DefaultServe()
	cfg.MaxBatch, cfg.MaxQueue = 4, 8
	f := &fixture{backend: newScriptBackend(pool, cfg.MaxBatch, calls), log: &syncBuffer{}, trace: &syncBuffer{}}
	opt := Options{Config: cfg, Name: "recal-test", Models: pool.Models(), MaxTurns: 3, Backend: f.backend,
		Log: slog.New(slog.NewJSONHandler(f.log, nil)), Trace: f.trace}
	if edit != nil {
		edit(&opt)
	}
	f.backend.rows = make(chan struct{}, opt.Config.MaxBatch)
	srv, err := New(opt)
	if err != nil {
		t.Fatal(err)
	}
	srv.SetReady(true)
	f.srv = srv
	f.http = httptest.NewServer(srv.Handler())
	t.Cleanup(f.http.Close)
	return f
}

func (f *fixture) post(t *testing.T, body string, header ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, f.http.URL+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := f.http.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

func (f *fixture) get(t *testing.T, path string) (*http.Response, []byte) {
	t.Helper()
	resp, err := f.http.Client().Get(f.http.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func chatBody(question string, extra string) string {
	q, _ := json.Marshal(question)
	if extra != "" {
		extra = "," + extra
	}
	return fmt.Sprintf(`{"model":"recal-test","messages":[{"role":"system","content":"be brief"},{"role":"user","content":%s}]%s}`, q, extra)
}

// The plain completion is a chat.completion as OpenAI's SDKs parse it, with
// recal's trace, usage breakdown and headers.
func TestChatCompletion(t *testing.T) {
	f := newFixture(t, simPool(t, 0), 2, nil)
	resp, body := f.post(t, chatBody("Who wrote Hamlet?", `"temperature":0.5,"max_tokens":40,"user":"u1","recal":{"models":["SIM-B","sim-a"],"max_turns":2,"max_cost_usd":0.5}`))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d, want 200: %s", resp.StatusCode, body)
	}
	var got struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		Model   string `json:"model"`
		Choices []struct {
			Index   int `json:"index"`
			Message struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			Prompt, Completion, Total int
		} `json:"-"`
		RawUsage map[string]int `json:"usage"`
		Recal    struct {
			Trace        []RoutingTurn `json:"trace"`
			TotalCostUSD float64       `json:"total_cost_usd"`
			End          string        `json:"end"`
			Usage        recalUsage    `json:"usage"`
			ModelsCalled []string      `json:"models_called"`
			Response     string        `json:"response"`
		} `json:"recal"`
	}
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("the body is not JSON: %v: %s", err, body)
	}
	checks := []struct {
		what string
		ok   bool
	}{
		{"id starts with chatcmpl-", strings.HasPrefix(got.ID, "chatcmpl-")},
		{"object is chat.completion", got.Object == "chat.completion"},
		{"created is now", time.Since(time.Unix(got.Created, 0)) < time.Minute},
		{"model is the router", got.Model == "recal-test"},
		{"one choice at index 0", len(got.Choices) == 1 && got.Choices[0].Index == 0},
		{"assistant message holds the answer", len(got.Choices) == 1 && got.Choices[0].Message.Role == "assistant" && got.Choices[0].Message.Content == "echo: Who wrote Hamlet?"},
		{"finish_reason stop", len(got.Choices) == 1 && got.Choices[0].FinishReason == "stop"},
		{"two trace entries", len(got.Recal.Trace) == 2},
		{"end answer", got.Recal.End == "answer"},
		{"models called in order", strings.Join(got.Recal.ModelsCalled, ",") == "sim-b,sim-a"},
		{"response holds the information blocks", strings.Contains(got.Recal.Response, "<information>")},
		{"usage adds policy and pool tokens", got.RawUsage["prompt_tokens"] == 100+20 && got.RawUsage["completion_tokens"] == 20+10 && got.RawUsage["total_tokens"] == 150},
		{"usage breakdown", got.Recal.Usage == recalUsage{PolicyPromptTokens: 100, PolicyCompletionTokens: 20, PoolPromptTokens: 20, PoolCompletionTokens: 10}},
		{"X-Recal-Models", resp.Header.Get("X-Recal-Models") == "sim-b,sim-a"},
		{"X-Request-Id in the id", resp.Header.Get("X-Request-Id") != "" && strings.HasSuffix(got.ID, resp.Header.Get("X-Request-Id"))},
		{"JSON content type", resp.Header.Get("Content-Type") == "application/json"},
	}
	// sim-b: 10·3 + 5·4 = 50, sim-a: 10·1 + 5·2 = 20 µUSD.
	wantCost := 70e-6
	if c, err := strconv.ParseFloat(resp.Header.Get("X-Recal-Cost-USD"), 64); err != nil || abs(c-wantCost) > 1e-12 || abs(got.Recal.TotalCostUSD-wantCost) > 1e-12 {
		t.Errorf("cost header %q and total_cost_usd %g, want %g", resp.Header.Get("X-Recal-Cost-USD"), got.Recal.TotalCostUSD, wantCost)
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("%s: not so in %s (headers %v)", c.what, body, resp.Header)
		}
	}
	if len(got.Recal.Trace) == 2 {
		e := got.Recal.Trace[0]
		if e.Turn != 0 || e.Model != "sim-b" || e.SubQuery != "Who wrote Hamlet?" || e.Failed || abs(e.CostUSD-50e-6) > 1e-12 ||
			e.PromptTokens != 10 || e.CompletionTokens != 5 {
			t.Errorf("first trace entry %+v, want turn 0 of sim-b asking the question, 10 + 5 tokens for 50 µUSD", e)
		}
	}
	q := f.backend.lastQuery()
	if q.Sampling.Temperature != 0.5 || q.MaxTokens != 40 || q.MaxTurns != 2 || q.MaxCostUSD != 0.5 || strings.Join(q.Models, ",") != "sim-b,sim-a" {
		t.Errorf("the backend got %+v, want the request's temperature, max_tokens and recal object with canonical model names", q)
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// Content may be an array of text parts; only the last user message counts.
func TestQuestionParts(t *testing.T) {
	f := newFixture(t, simPool(t, 0), 0, nil)
	body := `{"messages":[{"role":"user","content":"old question"},{"role":"assistant","content":"old answer"},
		{"role":"user","content":[{"type":"text","text":"Who"},{"type":"text","text":"wrote it?"}]}]}`
	resp, b := f.post(t, body)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d, want 200: %s", resp.StatusCode, b)
	}
	if q := f.backend.lastQuery().Question; q != "Who\nwrote it?" {
		t.Errorf("question %q, want the last user message's text parts joined by a newline", q)
	}
	if q := f.backend.lastQuery(); q.Sampling.Temperature != 0 || q.Models != nil || q.MaxTurns != 0 {
		t.Errorf("defaults %+v, want greedy, every model, the configured turns", q)
	}
}

// sseEvents reads server-sent events until [DONE] or the end.
func sseEvents(t *testing.T, r io.Reader, each func(data string)) {
	t.Helper()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("line %q is not a data line", line)
		}
		each(data)
		if data == "[DONE]" {
			return
		}
	}
}

type chunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Delta        map[string]any `json:"delta"`
		FinishReason *string        `json:"finish_reason"`
	} `json:"choices"`
	Usage *usage          `json:"usage"`
	Recal json.RawMessage `json:"recal"`
	Error *apiError       `json:"error"`
}

// A streamed completion sends each turn's trace entry as soon as its reply
// arrives (before the answer exists), then the answer, the finish reason,
// the usage and [DONE].
func TestStream(t *testing.T) {
	f := newFixture(t, simPool(t, 0), 2, nil)
	f.backend.hold = make(chan struct{})
	req, _ := http.NewRequest(http.MethodPost, f.http.URL+"/v1/chat/completions",
		strings.NewReader(chatBody("Who wrote Hamlet?", `"stream":true,"stream_options":{"include_usage":true}`)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := f.http.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d, content type %q; want 200 text/event-stream", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var chunks []chunk
	var done bool
	sseEvents(t, resp.Body, func(data string) {
		if data == "[DONE]" {
			done = true
			return
		}
		var c chunk
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("event %q is not JSON: %v", data, err)
		}
		chunks = append(chunks, c)
		if len(chunks) == 2 {
			close(f.backend.hold) // both turns arrived while the answer was still held back
		}
	})
	if !done {
		t.Fatal("the stream did not end with data: [DONE]")
	}
	// turn, turn, role, content, finish, usage
	if len(chunks) != 6 {
		t.Fatalf("%d chunks, want 6 (2 turns, role, content, finish, usage): %+v", len(chunks), chunks)
	}
	for i, c := range chunks {
		if c.Object != "chat.completion.chunk" || !strings.HasPrefix(c.ID, "chatcmpl-") || c.ID != chunks[0].ID || c.Model != "recal-test" {
			t.Errorf("chunk %d: id %q object %q model %q, want one chatcmpl- id, chat.completion.chunk, recal-test", i, c.ID, c.Object, c.Model)
		}
	}
	for i := range 2 {
		var rr struct {
			Trace []RoutingTurn `json:"trace"`
		}
		json.Unmarshal(chunks[i].Recal, &rr)
		if len(chunks[i].Choices) != 1 || len(chunks[i].Choices[0].Delta) != 0 || len(rr.Trace) != 1 || rr.Trace[0].Turn != i {
			t.Errorf("chunk %d: %+v recal %s; want an empty delta and the trace entry of turn %d", i, chunks[i], chunks[i].Recal, i)
		}
	}
	if d := chunks[2].Choices[0].Delta; d["role"] != "assistant" {
		t.Errorf("the first content delta %v has no role assistant", d)
	}
	if d := chunks[3].Choices[0].Delta; d["content"] != "echo: Who wrote Hamlet?" {
		t.Errorf("content delta %v, want the answer", d)
	}
	fin := chunks[4]
	if fin.Choices[0].FinishReason == nil || *fin.Choices[0].FinishReason != "stop" || !strings.Contains(string(fin.Recal), `"total_cost_usd"`) || strings.Contains(string(fin.Recal), `"trace"`) {
		t.Errorf("final chunk %+v recal %s, want finish_reason stop and the cost summary without the trace", fin, fin.Recal)
	}
	for i := range 4 {
		if chunks[i].Choices[0].FinishReason != nil {
			t.Errorf("chunk %d has a finish_reason before the end", i)
		}
	}
	u := chunks[5]
	if u.Choices == nil || len(u.Choices) != 0 || u.Usage == nil || u.Usage.TotalTokens != 150 {
		t.Errorf("usage chunk %+v, want choices [] and 150 tokens", u)
	}
}

// Without include_usage there is no usage chunk; the cost is in the final
// chunk, not in a header (the headers left before it was known).
func TestStreamWithoutUsage(t *testing.T) {
	f := newFixture(t, simPool(t, 0), 1, nil)
	resp, body := f.post(t, chatBody("Q?", `"stream":true`))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if strings.Contains(string(body), `"usage":{"prompt_tokens"`) {
		t.Errorf("usage chunk sent without stream_options.include_usage: %s", body)
	}
	if !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
		t.Errorf("stream %q does not end with data: [DONE]", body)
	}
	if resp.Header.Get("X-Recal-Cost-USD") != "" {
		t.Errorf("a streamed response has a cost header %q, which cannot know the cost yet", resp.Header.Get("X-Recal-Cost-USD"))
	}
}

// Every bad request is a clear 4xx in OpenAI's error shape, and never
// reaches the backend.
func TestBadRequests(t *testing.T) {
	f := newFixture(t, simPool(t, 0), 0, nil)
	huge := chatBody(strings.Repeat("a", 2<<20), "")
	cases := []struct {
		name   string
		method string
		path   string
		body   string
		status int
		param  string
		says   string // in the message
	}{
		{"2 MiB body", "POST", "/v1/chat/completions", huge, 413, "", "max_body_bytes"},
		{"invalid JSON", "POST", "/v1/chat/completions", `{"messages":[`, 400, "", "not valid JSON"},
		{"not an object", "POST", "/v1/chat/completions", `[1,2]`, 400, "", "want a JSON"},
		{"empty body", "POST", "/v1/chat/completions", ``, 400, "", "empty"},
		{"trailing garbage", "POST", "/v1/chat/completions", chatBody("q", "") + `{}`, 400, "", "more than one"},
		{"no messages", "POST", "/v1/chat/completions", `{"model":"recal-test"}`, 400, "messages", "user message"},
		{"no user message", "POST", "/v1/chat/completions", `{"messages":[{"role":"system","content":"hi"}]}`, 400, "messages", "no user message"},
		{"unknown role", "POST", "/v1/chat/completions", `{"messages":[{"role":"wizard","content":"hi"}]}`, 400, "messages[0].role", "wizard"},
		{"empty question", "POST", "/v1/chat/completions", chatBody("   ", ""), 400, "messages[1].content", "empty"},
		{"50,000-character question", "POST", "/v1/chat/completions", chatBody(strings.Repeat("é", 50000), ""), 400, "messages[1].content", "50000 characters"},
		{"invalid UTF-8", "POST", "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"caf\xe9\"}]}", 400, "", "UTF-8"},
		{"image part", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, 400, "messages[0].content[0]", "text parts"},
		{"content a number", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":7}]}`, 400, "messages[0].content", "string"},
		{"unknown pool model", "POST", "/v1/chat/completions", chatBody("q", `"recal":{"models":["sim-a","gpt-17"]}`), 400, "recal.models", `"gpt-17"`},
		{"no pool model", "POST", "/v1/chat/completions", chatBody("q", `"recal":{"models":[]}`), 400, "recal.models", "empty"},
		{"unknown router", "POST", "/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":"q"}]}`, 404, "model", `"gpt-4o"`},
		{"n=3", "POST", "/v1/chat/completions", chatBody("q", `"n":3`), 400, "n", "n must be 1"},
		{"too many turns", "POST", "/v1/chat/completions", chatBody("q", `"recal":{"max_turns":4}`), 400, "recal.max_turns", "[1, 3]"},
		{"negative cost cap", "POST", "/v1/chat/completions", chatBody("q", `"recal":{"max_cost_usd":-1}`), 400, "recal.max_cost_usd", "> 0"},
		{"unknown recal key", "POST", "/v1/chat/completions", chatBody("q", `"recal":{"budget":3}`), 400, "budget", "unsupported parameter"},
		{"unsupported parameter", "POST", "/v1/chat/completions", chatBody("q", `"tools":[]`), 400, "tools", "unsupported parameter"},
		{"temperature out of range", "POST", "/v1/chat/completions", chatBody("q", `"temperature":3`), 400, "temperature", "[0, 2]"},
		{"temperature a string", "POST", "/v1/chat/completions", chatBody("q", `"temperature":"hot"`), 400, "temperature", "number"},
		{"max_tokens 0", "POST", "/v1/chat/completions", chatBody("q", `"max_tokens":0`), 400, "max_tokens", "≥ 1"},
		{"stream_options without stream", "POST", "/v1/chat/completions", chatBody("q", `"stream_options":{"include_usage":true}`), 400, "stream_options", "stream"},
		{"penalty", "POST", "/v1/chat/completions", chatBody("q", `"presence_penalty":1`), 400, "presence_penalty", "only 0"},
		{"GET on chat", "GET", "/v1/chat/completions", "", 405, "", "takes POST"},
		{"unknown path", "GET", "/v1/embeddings", "", 404, "", "no endpoint"},
		{"unknown model id", "GET", "/v1/models/nope", "", 404, "model", `"nope"`},
		// Numbers that do not fit their field are named as such, not as
		// "want a JSON number, got number".
		{"max_tokens 1e12", "POST", "/v1/chat/completions", chatBody("q", `"max_tokens":1e12`), 400, "max_tokens", "max_tokens = 1e12: want a whole number"},
		{"max_tokens 1.5", "POST", "/v1/chat/completions", chatBody("q", `"max_tokens":1.5`), 400, "max_tokens", "max_tokens = 1.5: want a whole number"},
		{"max_tokens past int64", "POST", "/v1/chat/completions", chatBody("q", `"max_tokens":9223372036854775808`), 400, "max_tokens", "at most 9223372036854775807"},
		{"temperature 1e309", "POST", "/v1/chat/completions", chatBody("q", `"temperature":1e309`), 400, "temperature", "temperature = 1e309: out of the range of a 64-bit float"},
		// An error quotes the client's input briefly, never in full.
		{"900 KB parameter name", "POST", "/v1/chat/completions", chatBody("q", `"`+strings.Repeat("x", 900_000)+`":1`), 400, strings.Repeat("x", maxErrorParam) + "…", "unsupported parameter"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest(c.method, f.http.URL+c.path, strings.NewReader(c.body))
			if c.method == http.MethodPost {
				req.Header.Set("Content-Type", "application/json")
			}
			resp, err := f.http.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.status, b)
			}
			var e struct {
				Error map[string]*string `json:"error"`
			}
			if err := json.Unmarshal(b, &e); err != nil || e.Error == nil {
				t.Fatalf("body %s is not an OpenAI error object", b)
			}
			for _, k := range []string{"message", "type", "param", "code"} {
				if _, ok := e.Error[k]; !ok {
					t.Errorf("error object lacks %q: %s", k, b)
				}
			}
			if m := e.Error["message"]; m == nil || !strings.Contains(*m, c.says) {
				t.Errorf("message %s does not say %q", b, c.says)
			}
			param := ""
			if p := e.Error["param"]; p != nil {
				param = *p
			}
			if param != c.param {
				t.Errorf("param %q, want %q", param, c.param)
			}
			if len(b) > 2000 {
				t.Errorf("a %d-byte error: the client's input must not be echoed in full", len(b))
			}
		})
	}
	t.Run("2 MiB chunked body", func(t *testing.T) {
		// No Content-Length: the limit is found while reading.
		req, _ := http.NewRequest(http.MethodPost, f.http.URL+"/v1/chat/completions", io.MultiReader(strings.NewReader(huge)))
		req.Header.Set("Content-Type", "application/json")
		resp, err := f.http.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if req.ContentLength != 0 || resp.StatusCode != 413 || !strings.Contains(string(b), `"code":"request_too_large"`) {
			t.Errorf("status %d %s (content length %d), want 413 request_too_large", resp.StatusCode, b, req.ContentLength)
		}
	})
	if n := len(f.backend.queries); n != 0 {
		t.Errorf("%d bad requests reached the backend, want 0", n)
	}
}

// What a web page can make a browser send is refused before the body is
// read (authentication is off by default, so a page the user opens could
// otherwise make the server spend pool money): a body not declared JSON
// (415; a CORS "simple" request carries text/plain or a form), a gzipped
// body (415), an Origin not in serve.allowed_origins (403) and, when
// serve.allowed_hosts is set, another Host (403). A listed origin works,
// its preflight included.
func TestHostileRequests(t *testing.T) {
	f := newFixture(t, simPool(t, 0), 0, func(o *Options) {
		o.Config.AllowedOrigins = []string{"https://app.example.com"}
		o.Config.AllowedHosts = []string{"127.0.0.1", "localhost"}
	})
	open := newFixture(t, simPool(t, 0), 0, nil) // the defaults: no origin, any host
	body := chatBody("q", "")
	cases := []struct {
		name   string
		f      *fixture
		method string
		header []string // name, value, …; Content-Type is application/json unless given
		status int
		code   string
	}{
		{"text/plain", f, "POST", []string{"Content-Type", "text/plain"}, 415, "unsupported_media_type"},
		{"form", f, "POST", []string{"Content-Type", "application/x-www-form-urlencoded"}, 415, "unsupported_media_type"},
		{"no Content-Type", f, "POST", []string{"Content-Type", ""}, 415, "unsupported_media_type"},
		{"Latin-1", f, "POST", []string{"Content-Type", "application/json; charset=iso-8859-1"}, 415, "unsupported_media_type"},
		{"gzip", f, "POST", []string{"Content-Encoding", "gzip"}, 415, "unsupported_media_type"},
		{"foreign origin", f, "POST", []string{"Origin", "https://evil.example"}, 403, "origin_not_allowed"},
		{"foreign origin, text/plain, default config", open, "POST", []string{"Origin", "https://evil.example", "Content-Type", "text/plain"}, 403, "origin_not_allowed"},
		{"any origin, default config", open, "GET", []string{"Origin", "http://localhost:3000"}, 403, "origin_not_allowed"},
		{"null origin", f, "POST", []string{"Origin", "null"}, 403, "origin_not_allowed"},
		{"foreign host", f, "POST", []string{"Host", "evil.example"}, 403, "host_not_allowed"},
		{"foreign host on the port", f, "GET", []string{"Host", "rebound.example:8080"}, 403, "host_not_allowed"},
		{"JSON with a charset", f, "POST", []string{"Content-Type", "application/json; charset=utf-8"}, 200, ""},
		{"listed origin", f, "POST", []string{"Origin", "https://app.example.com"}, 200, ""},
		{"listed host with a port", f, "POST", []string{"Host", "localhost:8080"}, 200, ""},
		{"preflight of a listed origin", f, "OPTIONS", []string{"Origin", "https://app.example.com", "Access-Control-Request-Method", "POST"}, 204, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := "/v1/chat/completions"
			if c.method == "GET" {
				path = "/v1/models"
			}
			req, _ := http.NewRequest(c.method, c.f.http.URL+path, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			for i := 0; i+1 < len(c.header); i += 2 {
				switch {
				case c.header[i] == "Host":
					req.Host = c.header[i+1]
				case c.header[i+1] == "":
					req.Header.Del(c.header[i])
				default:
					req.Header.Set(c.header[i], c.header[i+1])
				}
			}
			resp, err := c.f.http.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != c.status || (c.code != "" && !strings.Contains(string(b), `"code":"`+c.code+`"`)) {
				t.Fatalf("status %d %s, want %d %s", resp.StatusCode, b, c.status, c.code)
			}
			if c.status == 204 && resp.Header.Get("Access-Control-Allow-Origin") != "https://app.example.com" {
				t.Errorf("preflight headers %v, want Access-Control-Allow-Origin of the listed origin", resp.Header)
			}
		})
	}
	if n := len(f.backend.queries) + len(open.backend.queries); n != 3 {
		t.Errorf("%d requests reached the backends, want the 3 allowed POSTs", n)
	}
}

// Beyond max_batch + max_queue requests in flight, 500 more are turned
// away at once with 429 and Retry-After; the admitted ones finish.
func TestQueueFull(t *testing.T) {
	f := newFixture(t, simPool(t, 0), 0, func(o *Options) { o.Config.MaxBatch, o.Config.MaxQueue = 2, 3 })
	f.backend.hold = make(chan struct{})
	admitted := make(chan int, 5)
	for range 5 {
		go func() {
			resp, err := f.http.Client().Post(f.http.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("q", "")))
			if err != nil {
				admitted <- -1
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			admitted <- resp.StatusCode
		}()
	}
	waitFor(t, "2 rows decoding and 3 waiting", func() bool { a, w := f.backend.Stats(); return a == 2 && w == 3 })
	var wg sync.WaitGroup
	codes := make(chan string, 500)
	for range 500 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := f.http.Client().Post(f.http.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("q", "")))
			if err != nil {
				codes <- err.Error()
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(b), `"code":"queue_full"`) {
				codes <- fmt.Sprintf("%d %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), b)
				return
			}
			codes <- "429"
		}()
	}
	wg.Wait()
	close(codes)
	n := 0
	for c := range codes {
		if c != "429" {
			t.Errorf("a request beyond the queue got %s, want 429 with Retry-After and code queue_full", c)
		} else {
			n++
		}
	}
	if n != 500 {
		t.Errorf("%d of 500 requests beyond the queue were refused", n)
	}
	close(f.backend.hold)
	for range 5 {
		if c := <-admitted; c != 200 {
			t.Errorf("an admitted request ended with %d, want 200", c)
		}
	}
	_, m := f.get(t, "/metrics")
	if !strings.Contains(string(m), "recal_serve_rejected_total 500") || !strings.Contains(string(m), `recal_serve_requests_total{code="429",handler="/v1/chat/completions"} 500`) {
		t.Errorf("metrics do not count the 500 refusals:\n%s", grep(string(m), "recal_serve_re"))
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func grep(text, sub string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// A streaming client that hangs up mid-answer cancels its row and its pool
// call in flight; the server goes on serving.
func TestStreamDisconnect(t *testing.T) {
	pool := simPool(t, time.Hour) // the second call never returns by itself
	f := newFixture(t, pool, 2, nil)
	f.backend.calls = 1
	f.backend.hold = make(chan struct{}) // the answer never comes by itself
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.http.URL+"/v1/chat/completions", strings.NewReader(chatBody("q", `"stream":true`)))
	req.Header.Set("Content-Type", "application/json")
	go func() {
		<-f.backend.started
		time.Sleep(20 * time.Millisecond)
		cancel() // hang up while the row waits on the pool
	}()
	resp, err := f.http.Client().Do(req)
	if err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	waitFor(t, "the backend to see the cancellation", func() bool { return f.backend.canceled.Load() == 1 })
	waitFor(t, "the row to be freed", func() bool { a, w := f.backend.Stats(); return a == 0 && w == 0 })
	waitFor(t, "the 499 to be logged", func() bool { return strings.Contains(f.log.String(), `"status":499`) })
	if u := pool.Usage()["sim-a"]; u.Calls != 1 || u.Failures != 1 {
		t.Errorf("pool usage %+v: want the one call in flight cancelled (a failure)", u)
	}
	close(f.backend.hold)
	f.backend.calls = 0
	if resp, b := f.post(t, chatBody("again", "")); resp.StatusCode != 200 {
		t.Errorf("after a disconnect: status %d, want 200: %s", resp.StatusCode, b)
	}
}

// serve.request_timeout ends a request with 504 and cancels its row.
func TestRequestTimeout(t *testing.T) {
	f := newFixture(t, simPool(t, 0), 0, func(o *Options) { o.Config.RequestTimeout = 50 * time.Millisecond })
	f.backend.hold = make(chan struct{})
	defer close(f.backend.hold)
	resp, b := f.post(t, chatBody("q", ""))
	if resp.StatusCode != 504 || !strings.Contains(string(b), "request_timeout") {
		t.Errorf("status %d %s, want 504 naming serve.request_timeout", resp.StatusCode, b)
	}
	if f.backend.canceled.Load() != 1 {
		t.Errorf("the backend saw %d cancellations, want 1", f.backend.canceled.Load())
	}
	resp, b = f.post(t, chatBody("q", `"stream":true`))
	if !strings.Contains(string(b), `"code":"timeout"`) {
		t.Errorf("a streamed request that times out: %d %s, want an error event with code timeout", resp.StatusCode, b)
	}
}

// errBackend fails every query with err.
type errBackend struct{ err error }

func (b errBackend) Answer(context.Context, Query) (Result, error) { return Result{}, b.err }
func (b errBackend) Stats() (int, int)                             { return 0, 0 }

// Backend errors: the client's (ErrInvalidQuery) are 400 with the reason;
// the server's are 500 without internals, which go to the log.
func TestBackendErrors(t *testing.T) {
	cases := []struct {
		name   string
		err    error
		status int
		says   string
		hidden string
	}{
		{"too long for the context", fmt.Errorf("%w: the question takes 3000 tokens; the policy's context leaves 1500", ErrInvalidQuery), 400, "3000 tokens", ""},
		{"internal", errors.New("torchbridge: /secret/path/model.safetensors: out of memory"), 500, "server log", "/secret/path"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, simPool(t, 0), 0, func(o *Options) { o.Backend = errBackend{c.err} })
			resp, b := f.post(t, chatBody("q", ""))
			if resp.StatusCode != c.status || !strings.Contains(string(b), c.says) {
				t.Errorf("status %d %s, want %d saying %q", resp.StatusCode, b, c.status, c.says)
			}
			if c.hidden != "" && strings.Contains(string(b), c.hidden) {
				t.Errorf("the response %s shows the internal error", b)
			}
			if c.hidden != "" && !strings.Contains(f.log.String(), c.hidden) {
				t.Errorf("the log lacks the internal error: %s", f.log.String())
			}
		})
	}
}

func TestAuth(t *testing.T) {
	f := newFixture(t, simPool(t, 0), 0, func(o *Options) { o.APIKey = "client-token-123" })
	cases := []struct {
		name   string
		header []string
		status int
	}{
		{"no token", nil, 401},
		{"wrong token", []string{"Authorization", "Bearer client-token-124"}, 401},
		{"prefix of the token", []string{"Authorization", "Bearer client-token"}, 401},
		{"not bearer", []string{"Authorization", "Basic client-token-123"}, 401},
		{"no scheme", []string{"Authorization", "client-token-123"}, 401},
		{"scheme glued to the token", []string{"Authorization", "Bearerclient-token-123"}, 401},
		{"empty token", []string{"Authorization", "Bearer "}, 401},
		{"right token", []string{"Authorization", "Bearer client-token-123"}, 200},
		// RFC 7235 section 2.1: the scheme's name is case-insensitive.
		{"lower-case scheme", []string{"Authorization", "bearer client-token-123"}, 200},
		{"upper-case scheme", []string{"Authorization", "BEARER client-token-123"}, 200},
		{"mixed-case scheme, spaces around the token", []string{"Authorization", "bEaReR   client-token-123 "}, 200},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, b := f.post(t, chatBody("q", ""), c.header...)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.status, b)
			}
			if c.status == 401 && (!strings.Contains(string(b), `"code":"invalid_api_key"`) || resp.Header.Get("WWW-Authenticate") == "") {
				t.Errorf("401 %s (headers %v), want code invalid_api_key and WWW-Authenticate", b, resp.Header)
			}
		})
	}
	for _, p := range []string{"/healthz", "/readyz"} {
		if resp, _ := f.get(t, p); resp.StatusCode != 200 {
			t.Errorf("%s: %d without a token, want 200 (probes need no token)", p, resp.StatusCode)
		}
	}
	for _, p := range []string{"/v1/models", "/metrics"} {
		if resp, _ := f.get(t, p); resp.StatusCode != 401 {
			t.Errorf("%s without a token: %d, want 401", p, resp.StatusCode)
		}
	}
	if strings.Contains(f.log.String(), "client-token-123") {
		t.Error("the log holds the client token")
	}
}

func TestModels(t *testing.T) {
	f := newFixture(t, simPool(t, 0), 0, nil)
	resp, b := f.get(t, "/v1/models")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	var list struct {
		Object string        `json:"object"`
		Data   []modelObject `json:"data"`
	}
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatal(err)
	}
	if list.Object != "list" || len(list.Data) != 3 {
		t.Fatalf("%s: want a list of the router and its 2 pool models", b)
	}
	r, a := list.Data[0], list.Data[1]
	if r.ID != "recal-test" || r.Object != "model" || r.Recal.Role != "router" || r.OwnedBy == "" {
		t.Errorf("first entry %+v, want the router", r)
	}
	if a.ID != "sim-a" || a.Recal.Role != "pool" || a.Recal.Description != "simulated A" || a.Recal.PriceIn == nil || *a.Recal.PriceIn != 1 || *a.Recal.PriceOut != 2 || !a.Recal.Simulated {
		t.Errorf("pool entry %+v, want sim-a with its description and prices", a)
	}
	resp, b = f.get(t, "/v1/models/sim-b")
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"id":"sim-b"`) {
		t.Errorf("GET /v1/models/sim-b: %d %s", resp.StatusCode, b)
	}
}

func TestHealthReady(t *testing.T) {
	f := newFixture(t, simPool(t, 0), 0, nil)
	f.srv.SetReady(false)
	if resp, _ := f.get(t, "/healthz"); resp.StatusCode != 200 {
		t.Errorf("/healthz %d, want 200 whenever the process runs", resp.StatusCode)
	}
	if resp, _ := f.get(t, "/readyz"); resp.StatusCode != 503 {
		t.Errorf("/readyz %d before the backend runs, want 503", resp.StatusCode)
	}
	f.srv.SetReady(true)
	if resp, b := f.get(t, "/readyz"); resp.StatusCode != 200 {
		t.Errorf("/readyz %d %s once ready, want 200", resp.StatusCode, b)
	}
}

// A <search> that made no call is a refusal in the metrics and a failed,
// flagged entry in the trace; calls of models the server was not told
// about share one label.
func TestMetricsRefusals(t *testing.T) {
	m := newMetrics(errBackend{}, []string{"sim-a"})
	calls := []router.Call{
		{Model: "sim-a", Cost: 0.5},
		{Model: "gpt-typo-from-the-policy", Failed: true, Unknown: true, Reply: "[router: unknown model]"},
		{Model: "sim-a", Failed: true, Refused: true, Reply: router.BudgetText},
		{Model: "later-added", Failed: true},
	}
	for _, c := range calls {
		m.call(c)
	}
	srv := httptest.NewServer(m.handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(b)
	for _, want := range []string{
		`recal_serve_pool_calls_total{model="sim-a"} 1`,
		`recal_serve_pool_cost_usd_total{model="sim-a"} 0.5`,
		`recal_serve_pool_calls_total{model="(unknown)"} 1`,
		`recal_serve_pool_failures_total{model="(unknown)"} 1`,
		`recal_serve_search_refusals_total{reason="unknown_model"} 1`,
		`recal_serve_search_refusals_total{reason="budget"} 1`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q:\n%s", want, grep(text, "recal_"))
		}
	}
	if strings.Contains(text, "gpt-typo") {
		t.Error("a model name the policy wrote became a metric label")
	}
	e := routingTurn(calls[2])
	if !e.Failed || !e.Refused || e.Failure != router.BudgetText {
		t.Errorf("trace entry of a refused search %+v, want failed, refused and the budget text", e)
	}
}

func TestMetrics(t *testing.T) {
	f := newFixture(t, simPool(t, 0), 2, nil)
	for range 3 {
		if resp, b := f.post(t, chatBody("q", "")); resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
	}
	f.post(t, "{")
	resp, b := f.get(t, "/metrics")
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("/metrics: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	text := string(b)
	for _, want := range []string{
		`recal_serve_requests_total{code="200",handler="/v1/chat/completions"} 3`,
		`recal_serve_requests_total{code="400",handler="/v1/chat/completions"} 1`,
		`recal_serve_request_duration_seconds_count{handler="/v1/chat/completions"} 4`,
		`recal_serve_pool_calls_total{model="sim-a"} 3`,
		`recal_serve_pool_calls_total{model="sim-b"} 3`,
		`recal_serve_pool_failures_total{model="sim-a"} 0`,
		`recal_serve_pool_cost_usd_total{model="sim-b"} 0.00015`,
		`recal_serve_tokens_total{kind="policy_prompt"} 300`,
		`recal_serve_queue_depth 0`,
		`recal_serve_batch_rows 0`,
		`process_resident_memory_bytes`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q:\n%s", want, grep(text, "recal_"))
		}
	}
}

// /metrics needs the API key when one is set, unless serve.metrics_open; on
// serve.metrics_addr it is served alone (and addr does not serve it), with
// the same rule.
func TestMetricsAccess(t *testing.T) {
	const key = "client-token-123"
	cases := []struct {
		name      string
		apiKey    string
		open      bool
		ownAddr   bool
		noToken   int // /metrics without a token
		withToken int
	}{
		{"no API key", "", false, false, 200, 200},
		{"API key", key, false, false, 401, 200},
		{"API key, metrics_open", key, true, false, 200, 200},
		{"own address, API key", key, false, true, 401, 200},
		{"own address, API key, metrics_open", key, true, true, 200, 200},
		{"own address, no API key", "", false, true, 200, 200},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var metricsLn net.Listener
			f := newFixture(t, simPool(t, 0), 0, func(o *Options) {
				o.APIKey, o.Config.MetricsOpen = c.apiKey, c.open
				if c.ownAddr {
					ln, err := net.Listen("tcp", "127.0.0.1:0")
					if err != nil {
						t.Fatal(err)
					}
					metricsLn, o.MetricsListener, o.Config.MetricsAddr = ln, ln, ln.Addr().String()
				}
			})
			f.http.Close() // Serve, with both listeners
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ctx, stop := context.WithCancel(context.Background())
			served := make(chan error, 1)
			go func() { served <- f.srv.Serve(ctx, ln) }()
			client := &http.Client{Transport: &http.Transport{}}
			t.Cleanup(func() {
				client.CloseIdleConnections()
				stop()
				if err := <-served; err != nil {
					t.Errorf("Serve: %v", err)
				}
			})
			get := func(base, path string, token bool) (int, string) {
				t.Helper()
				req, _ := http.NewRequest(http.MethodGet, "http://"+base+path, nil)
				if token {
					req.Header.Set("Authorization", "Bearer "+key)
				}
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp.StatusCode, string(b)
			}
			metricsAt := ln.Addr().String()
			if c.ownAddr {
				metricsAt = metricsLn.Addr().String()
				if code, b := get(ln.Addr().String(), "/metrics", true); code != 404 || !strings.Contains(b, "serve.metrics_addr") {
					t.Errorf("/metrics on serve.addr: %d %s; want 404 saying it is on serve.metrics_addr", code, b)
				}
				if code, _ := get(metricsAt, "/v1/models", true); code != 404 {
					t.Errorf("/v1/models on serve.metrics_addr: %d; want 404 (it serves /metrics alone)", code)
				}
			}
			if code, b := get(metricsAt, "/metrics", false); code != c.noToken {
				t.Errorf("/metrics without a token: %d, want %d: %s", code, c.noToken, cut(b, 200))
			}
			code, b := get(metricsAt, "/metrics", true)
			if code != c.withToken || !strings.Contains(b, "recal_serve_requests_total") {
				t.Errorf("/metrics with the token: %d, want %d with the metrics: %s", code, c.withToken, cut(b, 200))
			}
		})
	}
}

// The access log has one line per request with its id and no content; the
// trace has one JSON line per answered request in rollouts.jsonl's shape.
func TestLogsAndTrace(t *testing.T) {
	for _, logContent := range []bool{false, true} {
		t.Run(fmt.Sprint("log_content=", logContent), func(t *testing.T) {
			f := newFixture(t, simPool(t, 0), 1, func(o *Options) { o.Config.LogContent = logContent })
			resp, _ := f.post(t, chatBody("secret question about zebras", ""))
			id := resp.Header.Get("X-Request-Id")
			var line map[string]any
			for _, l := range strings.Split(strings.TrimSpace(f.log.String()), "\n") {
				var m map[string]any
				if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "serve: request" {
					line = m
				}
			}
			if line == nil || line["request_id"] != id || line["status"] != float64(200) || line["path"] != "/v1/chat/completions" {
				t.Fatalf("access log line %v, want request %s with status 200", line, id)
			}
			if has := strings.Contains(f.log.String(), "zebras"); has != logContent {
				t.Errorf("question in the log: %v, want %v (log_content)", has, logContent)
			}
			var tr map[string]any
			if err := json.Unmarshal([]byte(f.trace.String()), &tr); err != nil {
				t.Fatalf("trace %q is not one JSON line: %v", f.trace.String(), err)
			}
			for _, k := range []string{"question", "response", "calls", "end", "policy_tokens", "request_id", "cost_usd", "usage"} {
				if _, ok := tr[k]; !ok {
					t.Errorf("trace line lacks %q: %v", k, tr)
				}
			}
			if tr["request_id"] != id || len(tr["calls"].([]any)) != 1 {
				t.Errorf("trace line %v, want request %s with its one call", tr, id)
			}
		})
	}
}

// Pool API keys appear in no response, header, log line or trace, even when
// the provider echoes the key in its error.
func TestNoSecrets(t *testing.T) {
	const key = "sk-pool-secret-0123456789"
	t.Setenv("RECAL_TEST_POOL_KEY", key)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprintf(w, `{"error":{"message":"Incorrect API key provided: %s","type":"invalid_request_error","code":"invalid_api_key"}}`,
			strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
	}))
	defer upstream.Close()
	var poolLog syncBuffer
	pool, err := llmpool.New(llmpool.Config{Cache: llmpool.CacheOff, Models: []llmpool.ModelConfig{{Name: "real", Description: "d", Provider: "openai",
		OpenAI: &llmpool.OpenAIConfig{BaseURL: upstream.URL + "/v1", Model: "m", APIKeyEnv: "RECAL_TEST_POOL_KEY", MaxRetries: -1}}}},
		llmpool.WithLogger(slog.New(slog.NewTextHandler(&poolLog, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	f := newFixture(t, pool, 1, func(o *Options) { o.Config.LogContent = true })
	var seen strings.Builder
	for _, body := range []string{chatBody("q", ""), chatBody("q", `"stream":true,"stream_options":{"include_usage":true}`)} {
		resp, b := f.post(t, body)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		fmt.Fprintf(&seen, "%v\n%s\n", resp.Header, b)
	}
	if !strings.Contains(seen.String(), `"failed":true`) {
		t.Fatalf("the pool call should have failed (401 upstream): %s", seen.String())
	}
	for what, text := range map[string]string{"responses and headers": seen.String(), "access log": f.log.String(), "trace": f.trace.String(), "pool log": poolLog.String()} {
		if strings.Contains(text, key) {
			t.Errorf("the pool API key is in the %s", what)
		}
	}
}

// SIGTERM's path: Serve stops accepting, the requests in flight finish,
// and no goroutine of the server survives it.
func TestServeDrains(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	pool := simPool(t, 0)
	f := newFixture(t, pool, 1, nil)
	f.http.Close()
	f.backend.decode = 300 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- f.srv.Serve(ctx, ln) }()
	url := "http://" + ln.Addr().String()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	codes := make(chan int, 6)
	for range 6 {
		go func() {
			resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("q", "")))
			if err != nil {
				codes <- -1
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	waitFor(t, "4 rows decoding and 2 waiting", func() bool { a, w := f.backend.Stats(); return a == 4 && w == 2 })
	stop()
	for range 6 {
		if c := <-codes; c != 200 {
			t.Errorf("a request in flight at shutdown ended with %d, want 200", c)
		}
	}
	if err := <-served; err != nil {
		t.Errorf("Serve: %v, want nil after a clean drain", err)
	}
	if _, err := client.Get(url + "/healthz"); err == nil {
		t.Error("the server still accepts connections after the drain")
	}
}

// A request that outlives serve.drain_timeout is cut: its row is cancelled
// and Serve says so.
func TestServeDrainTimeout(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	f := newFixture(t, simPool(t, 0), 0, func(o *Options) { o.Config.DrainTimeout = 100 * time.Millisecond })
	f.http.Close()
	f.backend.hold = make(chan struct{})
	defer close(f.backend.hold)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- f.srv.Serve(ctx, ln) }()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	got := make(chan error, 1)
	go func() {
		resp, err := client.Post("http://"+ln.Addr().String()+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("q", `"stream":true`)))
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		got <- err
	}()
	waitFor(t, "the request to start", func() bool { a, _ := f.backend.Stats(); return a == 1 })
	stop()
	if err := <-served; !errors.Is(err, ErrDrainTimeout) {
		t.Errorf("Serve: %v, want ErrDrainTimeout", err)
	}
	<-got
	if f.backend.canceled.Load() != 1 {
		t.Errorf("the cut request's row was not cancelled")
	}
}

// Serve fails at once when the listener does.
func TestServeListenerClosed(t *testing.T) {
	f := newFixture(t, simPool(t, 0), 0, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	if err := f.srv.Serve(context.Background(), ln); err == nil || !strings.HasPrefix(err.Error(), "serve: ") {
		t.Errorf("Serve on a closed listener: %v, want a serve: error", err)
	}
}

func TestNewRejects(t *testing.T) {
	pool := simPool(t, 0)
	good := Options{Config: config.DefaultServe(), Name: "r", Models: pool.Models(), Backend: errBackend{}}
	cases := []struct {
		name string
		edit func(*Options)
		says string
	}{
		{"no backend", func(o *Options) { o.Backend = nil }, "no backend"},
		{"no name", func(o *Options) { o.Name = "" }, "no name"},
		{"bad config", func(o *Options) { o.Config.MaxBatch = 0 }, "serve.max_batch"},
		{"metrics_addr without its listener", func(o *Options) { o.Config.MetricsAddr = "127.0.0.1:9" }, "serve.metrics_addr"},
		{"a metrics listener without metrics_addr", func(o *Options) { o.MetricsListener = &net.TCPListener{} }, "serve.metrics_addr is empty"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := good
			c.edit(&o)
			if _, err := New(o); err == nil || !strings.Contains(err.Error(), c.says) {
				t.Errorf("New: %v, want an error saying %q", err, c.says)
			}
		})
	}
}

// Costs are sums of float prices; they go out without float noise.
func TestCostFormat(t *testing.T) {
	cases := []struct {
		usd    float64
		header string
		json   string
	}{
		{0.2*17/1e6 + 0.2*15/1e6, "0.0000064", "0.0000064"},
		{0.00007000000000000001, "0.00007", "0.00007"},
		{0, "0", "0"},
		{1.5, "1.5", "1.5"},
	}
	for _, c := range cases {
		b, _ := json.Marshal(roundUSD(c.usd))
		if h := formatCost(c.usd); h != c.header || string(b) != c.json {
			t.Errorf("%v: header %q and JSON %s, want %q and %s", c.usd, h, b, c.header, c.json)
		}
	}
}
