package llmpool

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// step is one scripted server reply.
type step struct {
	status  int
	header  map[string]string
	body    string
	sleep   time.Duration // before replying, honouring client disconnect
	cutBody bool          // announce a longer body and close the connection mid-way
}

// scripted replies with steps in order; after the last step, with OK.
func scripted(steps ...step) func(int64, chatRequestSeen, http.ResponseWriter, *http.Request) {
	return func(n int64, body chatRequestSeen, w http.ResponseWriter, r *http.Request) {
		if int(n) > len(steps) {
			writeOK(w, "ok after "+fmt.Sprint(n-1), 10, 5)
			return
		}
		s := steps[n-1]
		if s.sleep > 0 {
			select {
			case <-time.After(s.sleep):
			case <-r.Context().Done():
				return
			}
		}
		for k, v := range s.header {
			w.Header().Set(k, v)
		}
		if s.cutBody {
			w.Header().Set("Content-Length", "1000")
			w.WriteHeader(http.StatusOK)
			fmt.Fprint(w, s.body)
			w.(http.Flusher).Flush()
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		status := s.status
		if status == 0 {
			status = http.StatusOK
		}
		w.WriteHeader(status)
		fmt.Fprint(w, s.body)
	}
}

const okBody = `{"choices":[{"message":{"role":"assistant","content":"fine"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`

func TestOpenAIRetries(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		steps        []step
		mod          func(*OpenAIConfig)
		wantRequests int64
		wantFailed   bool
		wantStatus   int    // HTTPError status expected on failure (0: any error)
		wantErrText  string // substring of Err on failure
		minElapsed   time.Duration
		maxElapsed   time.Duration
	}{
		{name: "429 then ok", steps: []step{{status: 429}}, wantRequests: 2},
		{name: "500 twice then ok", steps: []step{{status: 500}, {status: 500}}, wantRequests: 3},
		{name: "503 then ok", steps: []step{{status: 503, body: "upstream down"}}, wantRequests: 2},
		{name: "502 bad gateway then ok", steps: []step{{status: 502}}, wantRequests: 2},
		{name: "408 then ok", steps: []step{{status: 408}}, wantRequests: 2},
		{name: "400 is permanent", steps: []step{{status: 400, body: `{"error":{"message":"bad max_tokens","code":"invalid"}}`}},
			wantRequests: 1, wantFailed: true, wantStatus: 400, wantErrText: "bad max_tokens"},
		{name: "401 is permanent", steps: []step{{status: 401, body: "unauthorized"}}, wantRequests: 1, wantFailed: true, wantStatus: 401},
		{name: "404 is permanent", steps: []step{{status: 404, body: "no such model"}}, wantRequests: 1, wantFailed: true, wantStatus: 404},
		{name: "200 with error object is retried", steps: []step{{body: `{"error":{"message":"provider overloaded","code":502}}`}}, wantRequests: 2},
		{name: "200 with error string is retried", steps: []step{{body: `{"error":"try later"}`}}, wantRequests: 2},
		{name: "200 with 4xx error object is permanent", steps: []step{{body: `{"error":{"message":"context too long","code":400}}`}},
			wantRequests: 1, wantFailed: true, wantStatus: 200, wantErrText: "context too long"},
		{name: "malformed body is retried", steps: []step{{body: "<html>gateway</html>"}}, wantRequests: 2},
		{name: "truncated json is retried", steps: []step{{body: `{"choices":[{"message":{"content":"Par`}}, wantRequests: 2},
		{name: "connection cut mid-body is retried", steps: []step{{cutBody: true, body: `{"choices":[{"mess`}}, wantRequests: 2},
		{name: "no choices is retried", steps: []step{{body: `{"choices":[]}`}, {body: `{"id":"x"}`}}, wantRequests: 3},
		{name: "retries run out", steps: []step{{status: 500}, {status: 500}, {status: 500}, {status: 500}},
			mod: func(o *OpenAIConfig) { o.MaxRetries = 2 }, wantRequests: 3, wantFailed: true, wantStatus: 500, wantErrText: "gave up after 3 attempts"},
		{name: "max_retries -1 sends one request", steps: []step{{status: 500}},
			mod: func(o *OpenAIConfig) { o.MaxRetries = -1 }, wantRequests: 1, wantFailed: true, wantStatus: 500},
		{name: "Retry-After seconds honoured", steps: []step{{status: 429, header: map[string]string{"Retry-After": "1"}}},
			mod: func(o *OpenAIConfig) { o.RetryMax = 5 * time.Second }, wantRequests: 2, minElapsed: time.Second},
		{name: "Retry-After-Ms honoured", steps: []step{{status: 503, header: map[string]string{"Retry-After-Ms": "150"}}},
			mod: func(o *OpenAIConfig) { o.RetryMax = 5 * time.Second }, wantRequests: 2, minElapsed: 150 * time.Millisecond},
		{name: "Retry-After capped by retry_max", steps: []step{{status: 429, header: map[string]string{"Retry-After": "100"}}},
			mod: func(o *OpenAIConfig) { o.RetryMax = 30 * time.Millisecond }, wantRequests: 2, maxElapsed: 3 * time.Second},
		// The timeout leaves room for the quick second reply on a loaded
		// machine (a 100 ms one timed out a second time there).
		{name: "timeout then ok", steps: []step{{sleep: 4 * time.Second}},
			mod: func(o *OpenAIConfig) { o.Timeout = 600 * time.Millisecond }, wantRequests: 2,
			minElapsed: 600 * time.Millisecond, maxElapsed: 3500 * time.Millisecond},
		{name: "every attempt times out", steps: []step{{sleep: 4 * time.Second}, {sleep: 4 * time.Second}},
			mod: func(o *OpenAIConfig) { o.Timeout = 500 * time.Millisecond; o.MaxRetries = 1 }, wantRequests: 2, wantFailed: true,
			wantErrText: "timed out", minElapsed: time.Second, maxElapsed: 3500 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newFakeLLM(t, scripted(tc.steps...))
			p := newTestPool(t, testConfig(openaiModel("m", srv.baseURL(), tc.mod)))
			start := time.Now()
			resp := p.Call(ctxTimeout(t, 10*time.Second), Request{Model: "m", Query: "capital of France"})
			elapsed := time.Since(start)
			if got := srv.requests.Load(); got != tc.wantRequests {
				t.Errorf("server saw %d requests, want %d (retry policy)", got, tc.wantRequests)
			}
			if resp.Failed != tc.wantFailed {
				t.Fatalf("Failed = %v (err %v), want %v", resp.Failed, resp.Err, tc.wantFailed)
			}
			if tc.wantFailed {
				if resp.Text != "[pool error: model m unavailable]" {
					t.Errorf("Text = %q, want the failure text", resp.Text)
				}
				var herr *HTTPError
				if tc.wantStatus != 0 && (!errors.As(resp.Err, &herr) || herr.StatusCode != tc.wantStatus) {
					t.Errorf("Err = %v, want an *HTTPError with status %d", resp.Err, tc.wantStatus)
				}
				if tc.wantErrText != "" && !strings.Contains(resp.Err.Error(), tc.wantErrText) {
					t.Errorf("Err = %q, want it to mention %q", resp.Err, tc.wantErrText)
				}
				if u := p.Usage()["m"]; u.Failures != 1 || u.Retries != tc.wantRequests-1 {
					t.Errorf("usage %+v, want 1 failure and %d retries", u, tc.wantRequests-1)
				}
			} else {
				if !strings.HasPrefix(resp.Text, "ok after") {
					t.Errorf("Text = %q, want the reply of the first good attempt", resp.Text)
				}
				if u := p.Usage()["m"]; u.Retries != tc.wantRequests-1 || u.Failures != 0 {
					t.Errorf("usage %+v, want %d retries and no failure", u, tc.wantRequests-1)
				}
			}
			if elapsed < tc.minElapsed {
				t.Errorf("took %v, want at least %v (the wait must happen)", elapsed, tc.minElapsed)
			}
			if tc.maxElapsed > 0 && elapsed > tc.maxElapsed {
				t.Errorf("took %v, want at most %v", elapsed, tc.maxElapsed)
			}
		})
	}
}

func TestOpenAIConnectionRefusedFailsAfterRetries(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	p := newTestPool(t, testConfig(openaiModel("m", "http://"+addr+"/v1", func(o *OpenAIConfig) { o.MaxRetries = 2 })))
	resp := p.Call(context.Background(), Request{Model: "m", Query: "q"})
	if !resp.Failed || !strings.Contains(resp.Err.Error(), "gave up after 3 attempts") {
		t.Fatalf("got Failed=%v err=%v, want a failure after 3 attempts on a refused connection", resp.Failed, resp.Err)
	}
	if u := p.Usage()["m"]; u.Retries != 2 {
		t.Errorf("usage.Retries = %d, want 2", u.Retries)
	}
}

func TestOpenAIContextCancelStopsAtOnce(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		steps []step
	}{
		{name: "during request", steps: []step{{sleep: 5 * time.Second}}},
		{name: "during Retry-After wait", steps: []step{{status: 429, header: map[string]string{"Retry-After": "10"}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			arrived := make(chan struct{}, 10)
			reply := scripted(tc.steps...)
			srv := newFakeLLM(t, func(n int64, body chatRequestSeen, w http.ResponseWriter, r *http.Request) {
				arrived <- struct{}{}
				reply(n, body, w, r)
			})
			p := newTestPool(t, testConfig(openaiModel("m", srv.baseURL(), func(o *OpenAIConfig) { o.RetryMax = 30 * time.Second })))
			ctx, cancel := context.WithCancel(context.Background())
			cancelledAt := make(chan time.Time, 1)
			go func() {
				<-arrived // cancel once the request is at the server
				time.Sleep(50 * time.Millisecond)
				cancelledAt <- time.Now()
				cancel()
			}()
			resp := p.Call(ctx, Request{Model: "m", Query: "q"})
			if el := time.Since(<-cancelledAt); el > 2*time.Second {
				t.Errorf("Call returned %v after cancel, want a prompt return", el)
			}
			if !resp.Failed || !errors.Is(resp.Err, context.Canceled) {
				t.Errorf("got Failed=%v err=%v, want Failed with context.Canceled", resp.Failed, resp.Err)
			}
			if got := srv.requests.Load(); got != 1 {
				t.Errorf("server saw %d requests, want 1 (no retry after cancel)", got)
			}
		})
	}
}

func TestOpenAIRequestBody(t *testing.T) {
	t.Parallel()
	srv := newFakeLLM(t, echoOK)
	seed := int64(42)
	p := newTestPool(t, testConfig(
		openaiModel("plain", srv.baseURL(), nil),
		openaiModel("tuned", srv.baseURL()+"/", func(o *OpenAIConfig) {
			o.Seed = &seed
			o.Temperature = 0.1
			o.MaxTokens = 64
			o.APIKeyEnv = "TEST_KEY"
			o.PromptTemplate = "Sub-question: {query}\n"
			o.Extra = map[string]any{"provider": map[string]any{"sort": "price"}, "top_k": 5}
		}),
	), withEnv("TEST_KEY", "k-123"))

	r1 := p.Call(context.Background(), Request{Model: "plain", Query: "  who wrote Hamlet  "})
	r2 := p.Call(context.Background(), Request{Model: "TUNED", Query: "who wrote Hamlet"})
	if r1.Failed || r2.Failed {
		t.Fatalf("calls failed: %v / %v", r1.Err, r2.Err)
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	b1, b2 := srv.bodies[0], srv.bodies[1]
	if b1.Model != "test/plain" || len(b1.Messages) != 1 || b1.Messages[0].Role != "user" || b1.query() != "who wrote Hamlet" {
		t.Errorf("plain body %+v, want model test/plain and the trimmed query as the only user message", b1)
	}
	if b1.Temperature == nil || *b1.Temperature != 0 || b1.TopP == nil || *b1.TopP != 1 || b1.MaxTokens != 512 || b1.Seed != nil {
		t.Errorf("plain body %+v, want temperature 0 sent explicitly, top_p 1, max_tokens 512, no seed (Router-R1 defaults)", b1)
	}
	if srv.auths[0] != "" {
		t.Errorf("plain model sent Authorization %q, want none without api_key_env", srv.auths[0])
	}
	if b2.Seed == nil || *b2.Seed != 42 || *b2.Temperature != 0.1 || b2.MaxTokens != 64 || b2.query() != "Sub-question: who wrote Hamlet\n" {
		t.Errorf("tuned body %+v, want seed 42, temperature 0.1, max_tokens 64 and the templated query", b2)
	}
	if srv.auths[1] != "Bearer k-123" {
		t.Errorf("Authorization = %q, want the key from TEST_KEY", srv.auths[1])
	}
	if prov, _ := srv.raw[1]["provider"].(map[string]any); prov["sort"] != "price" || srv.raw[1]["top_k"] != float64(5) {
		t.Errorf("body %v, want openai.extra merged in", srv.raw[1])
	}
	if srv.raw[0]["stream"] != false {
		t.Errorf("body %v, want stream false", srv.raw[0])
	}
}

func TestOpenAIQueryIsCappedAndValidUTF8(t *testing.T) {
	t.Parallel()
	srv := newFakeLLM(t, echoOK)
	cfg := testConfig(openaiModel("m", srv.baseURL(), nil))
	cfg.MaxQueryChars = 100
	p := newTestPool(t, cfg)
	huge := "é\xff\xfe" + strings.Repeat("x", 50_000)
	resp := p.Call(context.Background(), Request{Model: "m", Query: huge})
	if resp.Failed {
		t.Fatal(resp.Err)
	}
	srv.mu.Lock()
	q := srv.bodies[0].query()
	srv.mu.Unlock()
	if n := utf8.RuneCountInString(q); n != 100 || !utf8.ValidString(q) || !strings.HasPrefix(q, "éxxx") {
		t.Errorf("server got a %d-rune query (valid UTF-8: %v, prefix %q), want exactly 100 valid runes starting éxxx", n, utf8.ValidString(q), q[:min(8, len(q))])
	}
}

func TestOpenAIEmptyQueryMakesNoRequest(t *testing.T) {
	t.Parallel()
	srv := newFakeLLM(t, echoOK)
	p := newTestPool(t, testConfig(openaiModel("m", srv.baseURL(), nil)))
	resp := p.Call(context.Background(), Request{Model: "m", Query: " \xff \n"})
	if !resp.Failed || !errors.Is(resp.Err, ErrEmptyQuery) {
		t.Errorf("got Failed=%v err=%v, want ErrEmptyQuery", resp.Failed, resp.Err)
	}
	if n := srv.requests.Load(); n != 0 {
		t.Errorf("server saw %d requests, want none for an empty query", n)
	}
}

func TestOpenAIUsageReportedOrEstimated(t *testing.T) {
	t.Parallel()
	srv := newFakeLLM(t, func(_ int64, body chatRequestSeen, w http.ResponseWriter, _ *http.Request) {
		if body.query() == "with usage" {
			writeOK(w, "reply", 1000, 200)
			return
		}
		fmt.Fprint(w, `{"choices":[{"message":{"content":"twelve chars"}}]}`)
	})
	m := openaiModel("m", srv.baseURL(), nil)
	m.PriceIn, m.PriceOut = 0.5, 2
	p := newTestPool(t, testConfig(m))
	r := p.Call(context.Background(), Request{Model: "m", Query: "with usage"})
	if r.InputTokens != 1000 || r.OutputTokens != 200 || r.TokensEstimated || r.Cost != (1000*0.5+200*2)/1e6 {
		t.Errorf("got %+v, want the reported usage 1000/200 and cost 0.0009 USD", r)
	}
	r = p.Call(context.Background(), Request{Model: "m", Query: "no usage!"}) // 9 chars
	if !r.TokensEstimated || r.InputTokens != 3+chatOverheadTokens || r.OutputTokens != 3 {
		t.Errorf("got %+v, want estimated tokens (ceil(9/4)+%d in, ceil(12/4) out)", r, chatOverheadTokens)
	}
}

func TestOpenAIConcurrencyLimit(t *testing.T) {
	t.Parallel()
	slow := func(_ int64, body chatRequestSeen, w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(40 * time.Millisecond):
		case <-r.Context().Done():
		}
		writeOK(w, body.query(), 1, 1)
	}
	tests := []struct {
		name     string
		modelMax int
		poolMax  int
		models   int
		want     int64
	}{
		{name: "per-provider max_concurrency", modelMax: 3, poolMax: 32, models: 1, want: 3},
		{name: "pool max_concurrency across models", modelMax: 8, poolMax: 2, models: 3, want: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newFakeLLM(t, slow)
			var models []ModelConfig
			for i := range tc.models {
				models = append(models, openaiModel(fmt.Sprint("m", i), srv.baseURL(), func(o *OpenAIConfig) { o.MaxConcurrency = tc.modelMax }))
			}
			cfg := testConfig(models...)
			cfg.MaxConcurrency = tc.poolMax
			p := newTestPool(t, cfg)
			var reqs []Request
			for i := range 15 {
				reqs = append(reqs, Request{Model: fmt.Sprint("m", i%tc.models), Query: fmt.Sprint("q", i)})
			}
			resps := p.CallBatch(context.Background(), reqs)
			for i, r := range resps {
				if r.Failed || r.Text != fmt.Sprint("q", i) {
					t.Fatalf("response %d = %q (err %v), want q%d in request order", i, r.Text, r.Err, i)
				}
			}
			if got := srv.maxInflight.Load(); got > tc.want || got < 2 {
				t.Errorf("server saw at most %d requests in flight, want between 2 and %d", got, tc.want)
			}
		})
	}
}

func TestOpenAIRequestsPerMinute(t *testing.T) {
	t.Parallel()
	srv := newFakeLLM(t, echoOK)
	// 1200 per minute = one request every 50 ms, burst 1.
	p := newTestPool(t, testConfig(openaiModel("m", srv.baseURL(), func(o *OpenAIConfig) { o.RequestsPerMinute = 1200 })))
	var reqs []Request
	for i := range 6 {
		reqs = append(reqs, Request{Model: "m", Query: fmt.Sprint("q", i)})
	}
	start := time.Now()
	for _, r := range p.CallBatch(context.Background(), reqs) {
		if r.Failed {
			t.Fatal(r.Err)
		}
	}
	if el := time.Since(start); el < 230*time.Millisecond {
		t.Errorf("6 requests at 1200/min took %v, want at least ~250ms (5 intervals of 50ms)", el)
	}
	// The limiter's guarantee: the k-th request is not sent before k
	// intervals have passed. (A CPU-starved process may send late requests
	// together, so the gaps between arrivals prove nothing.)
	srv.mu.Lock()
	defer srv.mu.Unlock()
	times := slices.Clone(srv.times)
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	for k, at := range times {
		if early := time.Duration(k)*50*time.Millisecond - at.Sub(start); early > 20*time.Millisecond {
			t.Errorf("request %d arrived %v after the start, %v before its slot at %v: not paced at 1200/min", k, at.Sub(start), early, time.Duration(k)*50*time.Millisecond)
		}
	}
}

// TestOpenAIRedirectIsNotFollowed: a redirect would re-send the API key to
// wherever the server points (in clear text after https→http) and turn the
// POST into a GET, so the client follows none. The 3xx is a permanent
// failure (no retry) whose error names the status and the Location.
func TestOpenAIRedirectIsNotFollowed(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		status   int
		sameHost bool // Location is a path on the redirecting server
	}{
		{name: "307 to another host", status: http.StatusTemporaryRedirect},
		{name: "308 to another host", status: http.StatusPermanentRedirect},
		{name: "301 would become a GET", status: http.StatusMovedPermanently},
		{name: "302 would become a GET", status: http.StatusFound},
		{name: "303 would become a GET", status: http.StatusSeeOther},
		{name: "307 on the same host", status: http.StatusTemporaryRedirect, sameHost: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			target := newFakeLLM(t, echoOK)
			location := target.baseURL() + "/chat/completions"
			if tc.sameHost {
				location = "/v1/moved/chat/completions"
			}
			srv := newFakeLLM(t, func(_ int64, _ chatRequestSeen, w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Location", location)
				w.WriteHeader(tc.status)
			})
			const key = "sk-REDIRECT-9d1c"
			p := newTestPool(t, testConfig(openaiModel("m", srv.baseURL(), func(o *OpenAIConfig) { o.APIKeyEnv = "K" })), withEnv("K", key))
			r := p.Call(ctxTimeout(t, 10*time.Second), Request{Model: "m", Query: "q"})
			if n := srv.requests.Load(); n != 1 {
				t.Errorf("redirecting server saw %d requests, want 1 (a redirect is neither followed on the same host nor retried)", n)
			}
			if n := target.requests.Load(); n != 0 {
				t.Errorf("redirect target saw %d requests, want 0 (following would hand it the API key)", n)
			}
			if !r.Failed || r.Text != "[pool error: model m unavailable]" {
				t.Fatalf("Call = %+v, want a failed call with the failure text", r)
			}
			var herr *HTTPError
			if !errors.As(r.Err, &herr) || herr.StatusCode != tc.status || herr.Location != location {
				t.Fatalf("Err = %v, want an *HTTPError with status %d and Location %q", r.Err, tc.status, location)
			}
			if msg := r.Err.Error(); !strings.Contains(msg, fmt.Sprint(tc.status)) || !strings.Contains(msg, location) || strings.Contains(msg, key) {
				t.Errorf("Err = %q, want it to name the status %d and the Location %q (and never the key)", msg, tc.status, location)
			}
		})
	}
}
