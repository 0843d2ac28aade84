package llmpool

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeLLM is an OpenAI-compatible test server. handle decides each reply;
// n is the 1-based number of the request.
type fakeLLM struct {
	*httptest.Server
	handle func(n int64, body chatRequestSeen, w http.ResponseWriter, r *http.Request)

	requests    atomic.Int64
	inflight    atomic.Int64
	maxInflight atomic.Int64

	mu     sync.Mutex
	bodies []chatRequestSeen
	raw    []map[string]any
	auths  []string
	times  []time.Time
}

// chatRequestSeen is the request body as the server decodes it.
type chatRequestSeen struct {
	Model       string        `json:"model"`
	Messages    []chatMessage `json:"messages"`
	Temperature *float64      `json:"temperature"`
	TopP        *float64      `json:"top_p"`
	MaxTokens   int           `json:"max_tokens"`
	Seed        *int64        `json:"seed"`
}

func newFakeLLM(t *testing.T, handle func(n int64, body chatRequestSeen, w http.ResponseWriter, r *http.Request)) *fakeLLM {
	t.Helper()
	f := &fakeLLM{handle: handle}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := f.requests.Add(1)
		cur := f.inflight.Add(1)
		defer f.inflight.Add(-1)
		for {
			m := f.maxInflight.Load()
			if cur <= m || f.maxInflight.CompareAndSwap(m, cur) {
				break
			}
		}
		if r.URL.Path != "/v1/chat/completions" || r.Method != http.MethodPost {
			http.Error(w, "wrong path "+r.URL.Path, http.StatusNotFound)
			return
		}
		raw, _ := io.ReadAll(r.Body)
		var body chatRequestSeen
		_ = json.Unmarshal(raw, &body)
		var m map[string]any
		_ = json.Unmarshal(raw, &m)
		f.mu.Lock()
		f.bodies = append(f.bodies, body)
		f.raw = append(f.raw, m)
		f.auths = append(f.auths, r.Header.Get("Authorization"))
		f.times = append(f.times, time.Now())
		f.mu.Unlock()
		f.handle(n, body, w, r)
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeLLM) baseURL() string { return f.URL + "/v1" }

// query returns the user message of a request body.
func (b chatRequestSeen) query() string {
	if len(b.Messages) == 0 {
		return ""
	}
	return b.Messages[len(b.Messages)-1].Content
}

// writeOK writes a successful chat completion with usage.
func writeOK(w http.ResponseWriter, text string, in, out int) {
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`,
		text, in, out, in+out)
}

// echoOK replies "echo: QUERY" with 10 input and 5 output tokens.
func echoOK(_ int64, body chatRequestSeen, w http.ResponseWriter, _ *http.Request) {
	writeOK(w, "echo: "+body.query(), 10, 5)
}

// openaiModel is a model served by the fake server, with fast retries.
func openaiModel(name, baseURL string, mod func(*OpenAIConfig)) ModelConfig {
	o := &OpenAIConfig{
		BaseURL:   baseURL,
		Model:     "test/" + name,
		Timeout:   5 * time.Second,
		RetryBase: time.Millisecond,
		RetryMax:  20 * time.Millisecond,
	}
	if mod != nil {
		mod(o)
	}
	return ModelConfig{Name: name, Description: "test model " + name, PriceIn: 1, PriceOut: 2, Provider: "openai", OpenAI: o}
}

// simModel is a simulated model.
func simModel(name string, s SimConfig) ModelConfig {
	return ModelConfig{Name: name, Description: "simulated " + name, Provider: "sim", Sim: &s}
}

// testConfig is a pool with the cache off unless the test turns it on.
func testConfig(models ...ModelConfig) Config {
	return Config{Cache: CacheOff, Models: models}
}

// withEnv replaces the environment seen by New.
func withEnv(kv ...string) Option {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(o *options) {
		o.lookupEnv = func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
}

func newTestPool(t *testing.T, cfg Config, opts ...Option) *Pool {
	t.Helper()
	p, err := New(cfg, opts...)
	if err != nil {
		t.Fatalf("New: %v (want a valid pool)", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// logBuffer is a concurrency-safe log sink.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func debugLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
