package llmpool

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestUnknownModelIsAFailureObservationWithoutHTTP(t *testing.T) {
	t.Parallel()
	srv := newFakeLLM(t, echoOK)
	p := newTestPool(t, testConfig(openaiModel("llama-70b", srv.baseURL(), nil)))
	tests := []struct {
		name     string
		model    string
		wantText string
	}{
		{name: "plain", model: "gpt-9", wantText: "[pool error: model gpt-9 unavailable]"},
		{name: "empty", model: "", wantText: "[pool error: model  unavailable]"},
		{name: "tags stripped", model: "x</information><answer>y", wantText: "[pool error: model x/informationanswery unavailable]"},
		{name: "long name cut", model: strings.Repeat("n", 500), wantText: "[pool error: model " + strings.Repeat("n", 64) + " unavailable]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := p.Call(context.Background(), Request{Model: tc.model, Query: "q"})
			if !r.Failed || !errors.Is(r.Err, ErrUnknownModel) || r.Text != tc.wantText {
				t.Errorf("Call(%q) = %+v, want Failed with ErrUnknownModel and text %q", tc.model, r, tc.wantText)
			}
		})
	}
	if n := srv.requests.Load(); n != 0 {
		t.Errorf("server saw %d requests, want none for unknown models", n)
	}
	u := p.Usage()
	if u[UnknownModel].Calls != 4 || u[UnknownModel].Failures != 4 || u["llama-70b"].Calls != 0 {
		t.Errorf("usage %+v, want 4 failed calls under %q and none for llama-70b", u, UnknownModel)
	}
	if !strings.Contains(fmt.Sprint(p.Call(context.Background(), Request{Model: "x"}).Err), `known: llama-70b`) {
		t.Error("unknown-model error should list the known models")
	}
}

func TestFailureTextOverride(t *testing.T) {
	t.Parallel()
	cfg := testConfig(simModel("s", SimConfig{}))
	cfg.FailureText = "None ({model})"
	p := newTestPool(t, cfg)
	if r := p.Call(context.Background(), Request{Model: "nope", Query: "q"}); r.Text != "None (nope)" {
		t.Errorf("Text = %q, want the configured failure text with the model name", r.Text)
	}
}

func TestLookupAndModels(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, testConfig(
		simModel("Qwen2.5-7B-Instruct", SimConfig{}),
		ModelConfig{Name: "LLaMA-3.1-70B-Instruct", Description: "big", PriceIn: 0.88, PriceOut: 0.88, Provider: "sim"},
	))
	for _, name := range []string{"qwen2.5-7b-instruct", "QWEN2.5-7B-INSTRUCT", "  Qwen2.5-7B-Instruct "} {
		if info, ok := p.Lookup(name); !ok || info.Name != "Qwen2.5-7B-Instruct" || !info.Simulated {
			t.Errorf("Lookup(%q) = %+v, %v; want the simulated Qwen model (names match without case)", name, info, ok)
		}
	}
	if _, ok := p.Lookup("qwen"); ok {
		t.Error(`Lookup("qwen") found a model, want exact names only (no substring matching)`)
	}
	ms := p.Models()
	if len(ms) != 2 || ms[0].Name != "Qwen2.5-7B-Instruct" || ms[1].Name != "LLaMA-3.1-70B-Instruct" ||
		ms[1].Description != "big" || ms[1].PriceIn != 0.88 || ms[1].Provider != "sim" {
		t.Errorf("Models() = %+v, want both models in config order with their descriptions and prices", ms)
	}
}

func TestCallBatchPreservesOrder(t *testing.T) {
	t.Parallel()
	cfg := testConfig(
		simModel("a", SimConfig{DefaultAccuracy: 1, Latency: 5 * time.Millisecond}),
		simModel("b", SimConfig{DefaultAccuracy: 0.5}),
	)
	cfg.MaxConcurrency = 4
	p := newTestPool(t, cfg)
	var reqs []Request
	for i := range 40 {
		q := &Question{ID: fmt.Sprint(i), Dataset: "nq", Text: fmt.Sprintf("who founded company%d", i), Golden: []string{fmt.Sprint("Founder", i)}}
		model := []string{"a", "b", "missing"}[i%3]
		reqs = append(reqs, Request{Model: model, Query: fmt.Sprintf("founded company%d", i), Question: q})
	}
	got := p.CallBatch(context.Background(), reqs)
	for i, r := range got {
		want := p.Call(context.Background(), reqs[i])
		if r.Text != want.Text || r.Failed != want.Failed {
			t.Errorf("batch[%d] = %q, want %q (the response of request %d)", i, r.Text, want.Text, i)
		}
	}
}

func TestUsageSnapshotDiff(t *testing.T) {
	t.Parallel()
	m := simModel("s", SimConfig{TokensIn: 100, TokensOut: 20, DefaultAccuracy: 1})
	m.PriceIn, m.PriceOut = 0.3, 1.2
	p := newTestPool(t, testConfig(m))
	q := &Question{ID: "1", Dataset: "nq", Text: "capital of France", Golden: []string{"Paris"}}
	p.Call(context.Background(), Request{Model: "s", Query: "capital France", Question: q})
	before := p.Usage()
	p.Call(context.Background(), Request{Model: "s", Query: "France capital city", Question: q})
	p.Call(context.Background(), Request{Model: "s", Query: "capital", Question: q})
	p.Call(context.Background(), Request{Model: "bad", Query: "x"})
	step := p.Usage().Sub(before)
	wantCost := 2 * (100*0.3 + 20*1.2) / 1e6
	if s := step["s"]; s.Calls != 2 || s.InputTokens != 200 || s.OutputTokens != 40 || !approx(s.Cost, wantCost) || s.Failures != 0 {
		t.Errorf("step usage of s = %+v, want 2 calls, 200/40 tokens, cost %g", s, wantCost)
	}
	if tot := step.Total(); tot.Calls != 3 || tot.Failures != 1 {
		t.Errorf("step total = %+v, want 3 calls with 1 failure (the unknown model)", tot)
	}
	if before["s"].Calls != 1 {
		t.Errorf("snapshot changed after later calls: %+v, want it frozen at 1 call", before["s"])
	}
}

func TestCallWithDoneContextOrClosedPool(t *testing.T) {
	t.Parallel()
	arrived := make(chan struct{}, 1)
	srv := newFakeLLM(t, func(_ int64, body chatRequestSeen, w http.ResponseWriter, _ *http.Request) {
		if body.query() == "slow" {
			arrived <- struct{}{}
			time.Sleep(200 * time.Millisecond)
		}
		writeOK(w, "done", 1, 1)
	})
	p, err := New(testConfig(openaiModel("m", srv.baseURL(), nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if r := p.Call(ctx, Request{Model: "m", Query: "q"}); !r.Failed || !errors.Is(r.Err, context.Canceled) {
		t.Errorf("Call with a cancelled ctx = %+v, want Failed with context.Canceled", r)
	}
	if n := srv.requests.Load(); n != 0 {
		t.Errorf("server saw %d requests, want none after cancel", n)
	}
	done := make(chan Response)
	go func() { done <- p.Call(context.Background(), Request{Model: "m", Query: "slow"}) }()
	<-arrived
	start := time.Now()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < 100*time.Millisecond {
		t.Errorf("Close returned after %v, want it to wait for the call in flight (~200ms left)", el)
	}
	if r := <-done; r.Failed {
		t.Errorf("call in flight during Close = %+v, want it to finish", r)
	}
	if r := p.Call(context.Background(), Request{Model: "m", Query: "q"}); !r.Failed || !errors.Is(r.Err, ErrClosed) {
		t.Errorf("Call after Close = %+v, want ErrClosed", r)
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
}

// TestAPIKeyNeverLeaks sets a distinctive key, provokes successes and every
// kind of failure (including a server that echoes the Authorization header)
// and checks that the key appears in no log line, no response and no file
// under the cache dir.
func TestAPIKeyNeverLeaks(t *testing.T) {
	const key = "sk-LEAKCHECK-7f3a9c1e5b2d"
	t.Setenv("RECAL_TEST_LEAK_KEY", key)
	srv := newFakeLLM(t, func(n int64, body chatRequestSeen, w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		switch body.query() {
		case "ok":
			writeOK(w, "fine", 1, 1)
		case "echo401":
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprintf(w, `{"error":{"message":"invalid key %s","code":"%s"}}`, auth, key)
		case "echo500":
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprintf(w, "upstream rejected header %s", auth)
		case "echo200":
			fmt.Fprintf(w, `{"error":"bad credentials %s"}`, auth)
		case "malformed":
			fmt.Fprintf(w, `{"choices":[{"message":{"content":"%s`, auth)
		case "echoreply": // a successful reply that quotes the request's header
			writeOK(w, "you sent "+auth+" and "+strings.TrimPrefix(auth, "Bearer "), 1, 1)
		}
	})
	dir := t.TempDir()
	for _, handler := range []string{"text", "json"} {
		t.Run(handler, func(t *testing.T) {
			var logs logBuffer
			opts := &slog.HandlerOptions{Level: slog.LevelDebug}
			logger := slog.New(slog.NewTextHandler(&logs, opts))
			if handler == "json" {
				logger = slog.New(slog.NewJSONHandler(&logs, opts))
			}
			cfg := cachedConfig(dir, CacheReadWrite, openaiModel("m", srv.baseURL(), func(o *OpenAIConfig) {
				o.APIKeyEnv = "RECAL_TEST_LEAK_KEY"
				o.MaxRetries = 1
			}))
			p := newTestPool(t, cfg, WithLogger(logger))
			var texts []string
			for _, q := range []string{"ok", "ok", "echo401", "echo500", "echo200", "malformed", "", "echoreply", "echoreply"} {
				r := p.Call(context.Background(), Request{Model: "m", Query: q})
				texts = append(texts, r.Text, fmt.Sprint(r.Err), fmt.Sprintf("%+v", r))
			}
			p.Close()

			srv.mu.Lock()
			sent := srv.auths[0]
			srv.mu.Unlock()
			if sent != "Bearer "+key {
				t.Fatalf("server got Authorization %q, want the key (else this test checks nothing)", sent)
			}
			if strings.Contains(logs.String(), key) {
				t.Errorf("the API key appears in the logs:\n%s", logs.String())
			}
			if !strings.Contains(logs.String(), "retrying") {
				t.Errorf("logs %q, want retry lines (so that failures were logged)", logs.String())
			}
			for _, s := range texts {
				if strings.Contains(s, key) {
					t.Errorf("the API key appears in a response: %q", s)
				}
			}
			err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
				if err != nil || d.IsDir() {
					return err
				}
				b, err := os.ReadFile(path)
				if err != nil {
					return err
				}
				if strings.Contains(string(b), key) {
					t.Errorf("the API key appears in cache file %s", path)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(cacheFiles(t, dir)) == 0 {
				t.Error("no cache file written, want at least the successful reply cached")
			}
			if !slices.ContainsFunc(texts, func(s string) bool { return strings.Contains(s, "you sent Bearer [redacted] and [redacted]") }) {
				t.Errorf("responses %q: want the echoing reply with the key scrubbed", texts)
			}
		})
	}
}

// A key that cannot work is refused when the pool is built, naming the
// variable and never its value: a line break pasted with the key passed
// every check before, and then every call failed.
func TestAPIKeyHostileValues(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		set         bool
		want        string
	}{
		{"unset", "", false, "environment variable K (api_key_env) is not set"},
		{"empty", "", true, "environment variable K (api_key_env) is set but empty"},
		{"blank", " \t", true, "is set but empty"},
		{"CR LF inside", "sk-abc\r\nX-Evil: 1", true, "holds a control character"},
		{"NUL inside", "sk-abc\x00def", true, "holds a control character"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := withEnv()
			if tc.set {
				env = withEnv("K", tc.value)
			}
			_, err := New(testConfig(openaiModel("m", "http://127.0.0.1:1", func(o *OpenAIConfig) { o.APIKeyEnv = "K" })), env)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New with K=%q: %v; want an error containing %q", tc.value, err, tc.want)
			}
			if tc.value != "" && strings.TrimSpace(tc.value) != "" && strings.Contains(err.Error(), strings.TrimSpace(tc.value)) {
				t.Errorf("error %q holds the key's value", err)
			}
		})
	}
}

// TestSlowModelDoesNotStallOthers: calls queued on one model (slow replies,
// a rate limit, a retry backoff) wait for that model's slot, token or
// backoff without holding a pool-wide slot, so calls to another model still
// go out at once. Before, a queued call held a pool.max_concurrency slot
// for its whole wait and the fast model's calls waited seconds.
func TestSlowModelDoesNotStallOthers(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		poolMax int
		handle  func(int64, chatRequestSeen, http.ResponseWriter, *http.Request)
		mod     func(*OpenAIConfig)
	}{
		{
			// One slow request on the wire holds one of the two pool slots;
			// the calls queued behind it on the model's single slot hold none.
			name: "2s replies, model max_concurrency 1", poolMax: 2,
			handle: func(_ int64, body chatRequestSeen, w http.ResponseWriter, r *http.Request) {
				select {
				case <-time.After(2 * time.Second):
				case <-r.Context().Done():
					return
				}
				writeOK(w, body.query(), 1, 1)
			},
			mod: func(o *OpenAIConfig) { o.MaxConcurrency = 1 },
		},
		{
			// 6 per minute: after the first request the next token is 10 s away.
			name: "rate limited", poolMax: 1, handle: echoOK,
			mod: func(o *OpenAIConfig) { o.RequestsPerMinute = 6 },
		},
		{
			name: "retry backoff", poolMax: 1,
			handle: func(_ int64, _ chatRequestSeen, w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Retry-After", "10")
				w.WriteHeader(http.StatusTooManyRequests)
			},
			mod: func(o *OpenAIConfig) { o.RetryMax = 10 * time.Second },
		},
	}
	for _, tc := range tests {
		for _, batch := range []bool{false, true} {
			name := tc.name + "/Call"
			if batch {
				name = tc.name + "/CallBatch"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				slowSrv := newFakeLLM(t, tc.handle)
				fastSrv := newFakeLLM(t, echoOK)
				cfg := testConfig(openaiModel("slow", slowSrv.baseURL(), tc.mod), openaiModel("fast", fastSrv.baseURL(), nil))
				cfg.MaxConcurrency = tc.poolMax
				p := newTestPool(t, cfg)
				// The slow model's calls are cancelled when the test ends.
				slowCtx, cancel := context.WithCancel(context.Background())
				t.Cleanup(cancel)

				var slow, fast []Request
				for i := range 4 {
					slow = append(slow, Request{Model: "slow", Query: fmt.Sprint("s", i)})
					fast = append(fast, Request{Model: "fast", Query: fmt.Sprint("f", i)})
				}
				var elapsed time.Duration
				var resps []Response
				if !batch {
					for _, r := range slow {
						go p.Call(slowCtx, r)
					}
					waitFor(t, func() bool { return slowSrv.requests.Load() >= 1 }, "the slow model's first request")
					time.Sleep(100 * time.Millisecond) // the other slow calls queue up
					start := time.Now()
					for _, r := range fast {
						resps = append(resps, p.Call(ctxTimeout(t, 2*time.Second), r))
					}
					elapsed = time.Since(start)
				} else {
					// Slow requests first: a fan-out bounded by
					// pool.max_concurrency would start only those.
					done := make(chan []Response, 1)
					start := time.Now()
					go func() { done <- p.CallBatch(slowCtx, append(slices.Clone(slow), fast...)) }()
					waitFor(t, func() bool { return p.Usage()["fast"].Calls == int64(len(fast)) }, "the fast model's replies")
					elapsed = time.Since(start)
					cancel()
					resps = (<-done)[len(slow):]
				}
				for i, r := range resps {
					if r.Failed || r.Text != "echo: "+fast[i].Query {
						t.Errorf("fast call %d = %+v, want its echo", i, r)
					}
				}
				if elapsed > time.Second {
					t.Errorf("4 calls to the fast model took %v while the slow model was busy, want well under 1s (a model's queue must not hold pool-wide slots)", elapsed)
				}
			})
		}
	}
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// TestSimLatencyHoldsAPoolSlot: pool.max_concurrency still bounds what is
// on the wire: simulated requests take one slot each for their latency.
func TestSimLatencyHoldsAPoolSlot(t *testing.T) {
	t.Parallel()
	cfg := testConfig(simModel("s", SimConfig{Latency: 50 * time.Millisecond}))
	cfg.MaxConcurrency = 2
	p := newTestPool(t, cfg)
	var reqs []Request
	for i := range 6 {
		reqs = append(reqs, Request{Model: "s", Query: fmt.Sprint("q", i)})
	}
	start := time.Now()
	p.CallBatch(context.Background(), reqs)
	if el := time.Since(start); el < 140*time.Millisecond {
		t.Errorf("6 sim calls of 50ms with max_concurrency 2 took %v, want >= ~150ms (3 rounds)", el)
	}
}

// TestUsageTotalOrder: Total adds the models in the order of their names, so
// the same usage always gives the same float sum. These costs sum to 0 in
// name order (1e16 + 1 rounds to 1e16) and to 1 when -1e16 comes second,
// which the random order of a map's range would give in some of the tries.
func TestUsageTotalOrder(t *testing.T) {
	m := UsageMap{"a": {Cost: 1e16}, "b": {Cost: 1}, "c": {Cost: -1e16}}
	for i := range 200 {
		if got := m.Total().Cost; got != 0 {
			t.Fatalf("try %d: Total().Cost = %g, want 0 (a + b + c, in name order)", i, got)
		}
	}
}
