package embed

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

const testKey = "sk-test-SECRET-0123456789"

// fakeServer is an OpenAI-compatible /v1/embeddings endpoint. Each text
// gets a deterministic 8-dimensional vector; fail decides, per request
// number (1-based), a status to answer instead (0 = answer).
type fakeServer struct {
	t        *testing.T
	fail     func(n int) (status int, header map[string]string)
	mu       sync.Mutex
	requests int
	batches  [][]string
	srv      *httptest.Server
}

func newFakeServer(t *testing.T, fail func(n int) (int, map[string]string)) *fakeServer {
	f := &fakeServer{t: t, fail: fail}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func fakeVector(text string) []float32 {
	v := make([]float32, 8)
	for i, r := range text {
		v[(i+int(r))%8] += float32(r%7) + 1
	}
	return v
}

func (f *fakeServer) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.requests++
	n := f.requests
	f.mu.Unlock()
	if r.URL.Path != "/v1/embeddings" || r.Method != http.MethodPost {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	if got := r.Header.Get("Authorization"); got != "Bearer "+testKey {
		http.Error(w, `{"error":{"message":"bad key"}}`, http.StatusUnauthorized)
		return
	}
	var req struct {
		Model string   `json:"model"`
		Input []string `json:"input"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Model != "emb-1" {
		http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusBadRequest)
		return
	}
	if f.fail != nil {
		if status, hdr := f.fail(n); status != 0 {
			for k, v := range hdr {
				w.Header().Set(k, v)
			}
			w.WriteHeader(status)
			fmt.Fprintf(w, `{"error":{"message":"overloaded; your key %s is fine"}}`, testKey)
			return
		}
	}
	f.mu.Lock()
	f.batches = append(f.batches, req.Input)
	f.mu.Unlock()
	type item struct {
		Index     int       `json:"index"`
		Embedding []float32 `json:"embedding"`
	}
	var data []item
	for i := len(req.Input) - 1; i >= 0; i-- { // out of order: the index decides
		data = append(data, item{i, fakeVector(req.Input[i])})
	}
	json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data})
}

func openAIConfig(url string) Config {
	cfg := DefaultConfig()
	cfg.Provider = "openai"
	cfg.OpenAI.BaseURL = url + "/v1"
	cfg.OpenAI.Model = "emb-1"
	cfg.OpenAI.APIKeyEnv = "TEST_EMBED_KEY"
	cfg.OpenAI.BatchSize = 3
	cfg.OpenAI.MaxConcurrency = 2
	cfg.OpenAI.RetryBase = time.Millisecond
	cfg.OpenAI.RetryMax = 20 * time.Millisecond
	cfg.OpenAI.MaxRetries = 2
	cfg.OpenAI.Timeout = 5 * time.Second
	return cfg
}

func keyEnv(name string) (string, bool) {
	if name == "TEST_EMBED_KEY" {
		return testKey, true
	}
	return "", false
}

func newOpenAITest(t *testing.T, cfg Config, cacheDir string, logs *bytes.Buffer) Embedder {
	t.Helper()
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e, err := New(cfg, WithLookupEnv(keyEnv), WithCacheDir(cacheDir), WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func unit(v []float32) []float32 {
	v = append([]float32(nil), v...)
	normalize(v)
	return v
}

// Texts go in batches of batch_size, each distinct text once; vectors come
// back in the texts' order (the reply's indices decide), of unit length; a
// second embedder on the same cache folder sends nothing.
func TestOpenAIBatchingAndCache(t *testing.T) {
	f := newFakeServer(t, nil)
	cache := t.TempDir()
	var logs bytes.Buffer
	e := newOpenAITest(t, openAIConfig(f.srv.URL), cache, &logs)
	texts := []string{"a", "bb", "ccc", "a", "dddd", "eeeee", "ffffff", "ggggggg"}
	vs, err := e.Embed(context.Background(), texts)
	if err != nil {
		t.Fatal(err)
	}
	for i, text := range texts {
		want := unit(fakeVector(text))
		for j := range want {
			if math.Abs(float64(vs[i][j]-want[j])) > 1e-6 {
				t.Fatalf("text %d (%q): vector %v, want %v: replies must be matched by index", i, text, vs[i], want)
			}
		}
	}
	if f.requests != 3 {
		t.Errorf("%d requests for 7 distinct texts in batches of 3, want 3", f.requests)
	}
	for _, b := range f.batches {
		if len(b) > 3 {
			t.Errorf("a request carried %d texts, over batch_size 3", len(b))
		}
	}
	again := newOpenAITest(t, openAIConfig(f.srv.URL), cache, &logs)
	if _, err := again.Embed(context.Background(), texts); err != nil {
		t.Fatal(err)
	}
	if f.requests != 3 {
		t.Errorf("a fresh embedder on the same cache sent %d more requests, want 0 (disk cache)", f.requests-3)
	}
	ro := openAIConfig(f.srv.URL)
	ro.Cache = CacheReadOnly
	if _, err := newOpenAITest(t, ro, cache, &logs).Embed(context.Background(), []string{"never seen"}); !errors.Is(err, ErrCacheMiss) {
		t.Errorf("read-only cache miss: error %v, want ErrCacheMiss", err)
	}
	if _, err := e.Embed(context.Background(), []string{"ok", " "}); !errors.Is(err, ErrEmptyText) {
		t.Errorf("empty text: error %v, want ErrEmptyText", err)
	}
	if strings.Contains(logs.String(), testKey) {
		t.Error("the API key appears in the logs")
	}
}

// 429 with Retry-After and 5xx are retried, then the call succeeds; an
// endpoint that keeps failing is retried max_retries times and then gives a
// named error (an *HTTPError with the status) without the key.
func TestOpenAIRetries(t *testing.T) {
	cases := []struct {
		name     string
		fail     func(n int) (int, map[string]string)
		requests int
		status   int // 0: success
		minWait  time.Duration
	}{
		{"429 then success", func(n int) (int, map[string]string) {
			if n == 1 {
				return 429, map[string]string{"Retry-After": "0.15"}
			}
			return 0, nil
		}, 2, 0, 150 * time.Millisecond},
		{"503 twice then success", func(n int) (int, map[string]string) {
			if n <= 2 {
				return 503, nil
			}
			return 0, nil
		}, 3, 0, 0},
		{"always 500", func(int) (int, map[string]string) { return 500, nil }, 3, 500, 0},
		{"401 is not retried", func(int) (int, map[string]string) { return 401, nil }, 1, 401, 0},
		{"redirect is not followed", func(int) (int, map[string]string) {
			return 307, map[string]string{"Location": "http://elsewhere.example/v1/embeddings"}
		}, 1, 307, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFakeServer(t, c.fail)
			cfg := openAIConfig(f.srv.URL)
			cfg.OpenAI.RetryMax = time.Second
			var logs bytes.Buffer
			e := newOpenAITest(t, cfg, "", &logs)
			start := time.Now()
			vs, err := e.Embed(context.Background(), []string{"x", "y"})
			took := time.Since(start)
			if f.requests != c.requests {
				t.Errorf("%d requests, want %d", f.requests, c.requests)
			}
			if c.status == 0 {
				if err != nil || len(vs) != 2 {
					t.Fatalf("error %v, want success after retries", err)
				}
				if took < c.minWait {
					t.Errorf("took %v, want at least the %v Retry-After asked for", took, c.minWait)
				}
				return
			}
			var herr *HTTPError
			if !errors.As(err, &herr) || herr.StatusCode != c.status {
				t.Fatalf("error %v, want an *HTTPError with status %d", err, c.status)
			}
			if !strings.HasPrefix(err.Error(), "embed: openai \"emb-1\": ") {
				t.Errorf("error %q does not name the package and model", err)
			}
			if c.requests > 1 && !strings.Contains(err.Error(), fmt.Sprintf("gave up after %d attempts", c.requests)) {
				t.Errorf("error %q does not say it gave up after %d attempts", err, c.requests)
			}
			if strings.Contains(err.Error(), testKey) || strings.Contains(logs.String(), testKey) {
				t.Errorf("the API key leaked: error %q, logs %q", err, logs.String())
			}
		})
	}
}

// A missing key variable fails at construction, naming the variable.
func TestOpenAIMissingKey(t *testing.T) {
	cfg := openAIConfig("http://127.0.0.1:1")
	_, err := New(cfg, WithLookupEnv(func(string) (string, bool) { return "", false }))
	if err == nil || !strings.Contains(err.Error(), "TEST_EMBED_KEY") {
		t.Fatalf("error %v, want one naming TEST_EMBED_KEY", err)
	}
}

// A corrupt cache file is a miss, removed, and the vector is fetched again.
func TestOpenAICorruptCacheEntry(t *testing.T) {
	f := newFakeServer(t, nil)
	cache := t.TempDir()
	var logs bytes.Buffer
	if _, err := newOpenAITest(t, openAIConfig(f.srv.URL), cache, &logs).Embed(context.Background(), []string{"zz"}); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(cache, "*", "*.json"))
	if len(files) != 1 {
		t.Fatalf("%d cache files, want 1", len(files))
	}
	os.WriteFile(files[0], []byte(`{"version":1,"key":"x"`), 0o644)
	vs, err := newOpenAITest(t, openAIConfig(f.srv.URL), cache, &logs).Embed(context.Background(), []string{"zz"})
	if err != nil || len(vs[0]) != 8 {
		t.Fatalf("error %v after a corrupt cache entry, want a fresh vector", err)
	}
	if f.requests != 2 {
		t.Errorf("%d requests, want 2 (the corrupt entry is a miss)", f.requests)
	}
}
