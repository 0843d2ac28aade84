package llmpool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"
)

// cacheFiles returns the entry files under dir.
func cacheFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".json") && !strings.HasPrefix(d.Name(), ".tmp-") {
			out = append(out, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func cachedConfig(dir string, mode CacheMode, models ...ModelConfig) Config {
	c := testConfig(models...)
	c.Cache, c.CacheDir = mode, dir
	return c
}

func TestCacheHitMissAndAccounting(t *testing.T) {
	t.Parallel()
	srv := newFakeLLM(t, echoOK)
	dir := t.TempDir()
	p := newTestPool(t, cachedConfig(dir, CacheReadWrite, openaiModel("m", srv.baseURL(), nil)))
	ctx := context.Background()

	first := p.Call(ctx, Request{Model: "m", Query: "q1"})
	second := p.Call(ctx, Request{Model: "M", Query: " q1 "}) // same request after lookup and trimming
	third := p.Call(ctx, Request{Model: "m", Query: "q2"})
	if first.Failed || second.Failed || third.Failed {
		t.Fatalf("calls failed: %v %v %v", first.Err, second.Err, third.Err)
	}
	if first.Cached || !second.Cached || third.Cached {
		t.Errorf("Cached = %v %v %v, want false true false (hit only for the repeated query)", first.Cached, second.Cached, third.Cached)
	}
	if second.Text != first.Text || second.InputTokens != 10 || second.OutputTokens != 5 || second.Cost != first.Cost {
		t.Errorf("cached response %+v, want the stored text, tokens and the same list cost as %+v", second, first)
	}
	if n := srv.requests.Load(); n != 2 {
		t.Errorf("server saw %d requests, want 2 (one per distinct query)", n)
	}
	u := p.Usage()["m"]
	wantCost := 2 * (10*1 + 5*2) / 1e6
	if u.Calls != 3 || u.CacheHits != 1 || u.InputTokens != 20 || u.OutputTokens != 10 ||
		!approx(u.Cost, wantCost) || !approx(u.ListCost, 1.5*wantCost) {
		t.Errorf("usage %+v, want 3 calls, 1 hit, 20/10 billed tokens, cost %g (hits free), list cost %g", u, wantCost, 1.5*wantCost)
	}
	if files := cacheFiles(t, dir); len(files) != 2 {
		t.Errorf("cache holds %d entries, want 2", len(files))
	}
}

func approx(a, b float64) bool { d := a - b; return d < 1e-12 && d > -1e-12 }

func TestCacheReadOnlyReplay(t *testing.T) {
	t.Parallel()
	srv := newFakeLLM(t, echoOK)
	dir := t.TempDir()
	rw := newTestPool(t, cachedConfig(dir, CacheReadWrite, openaiModel("m", srv.baseURL(), nil)))
	if r := rw.Call(context.Background(), Request{Model: "m", Query: "recorded"}); r.Failed {
		t.Fatal(r.Err)
	}
	ro := newTestPool(t, cachedConfig(dir, CacheReadOnly, openaiModel("m", srv.baseURL(), nil)))
	hit := ro.Call(context.Background(), Request{Model: "m", Query: "recorded"})
	if hit.Failed || !hit.Cached || hit.Text != "echo: recorded" {
		t.Errorf("replay of a recorded call = %+v, want a cache hit", hit)
	}
	miss := ro.Call(context.Background(), Request{Model: "m", Query: "never seen"})
	if !miss.Failed || !errors.Is(miss.Err, ErrCacheMiss) || miss.Text != "[pool error: model m unavailable]" {
		t.Errorf("replay miss = %+v, want a failure with ErrCacheMiss and the failure text", miss)
	}
	if n := srv.requests.Load(); n != 1 {
		t.Errorf("server saw %d requests, want 1 (read-only mode never calls the provider)", n)
	}
	if u := ro.Usage()["m"]; u.Calls != 2 || u.CacheHits != 1 || u.Failures != 1 {
		t.Errorf("read-only usage %+v, want 2 calls, 1 hit, 1 failure", u)
	}
	if _, err := New(cachedConfig(filepath.Join(dir, "missing"), CacheReadOnly, simModel("s", SimConfig{}))); err == nil {
		t.Error("New with read-only cache in a missing directory succeeded, want an error before any call")
	}
}

func TestCacheCorruptEntryIsMissAndReplaced(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		corrupt func(b []byte) []byte
	}{
		{name: "half written", corrupt: func(b []byte) []byte { return b[:len(b)/2] }},
		{name: "empty file", corrupt: func([]byte) []byte { return nil }},
		{name: "garbage", corrupt: func([]byte) []byte { return []byte("\x00\x01garbage") }},
		{name: "edited text fails checksum", corrupt: func(b []byte) []byte {
			return []byte(strings.Replace(string(b), "echo: q", "echo: Q", 1))
		}},
		{name: "wrong key", corrupt: func(b []byte) []byte {
			return []byte(strings.Replace(string(b), `"key":"`, `"key":"00`, 1))
		}},
		{name: "old version", corrupt: func(b []byte) []byte {
			return []byte(strings.Replace(string(b), `"version":1`, `"version":0`, 1))
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newFakeLLM(t, echoOK)
			dir := t.TempDir()
			var logs logBuffer
			p := newTestPool(t, cachedConfig(dir, CacheReadWrite, openaiModel("m", srv.baseURL(), nil)), WithLogger(debugLogger(&logs)))
			req := Request{Model: "m", Query: "q"}
			p.Call(context.Background(), req)
			files := cacheFiles(t, dir)
			if len(files) != 1 {
				t.Fatalf("cache holds %d entries, want 1", len(files))
			}
			b, _ := os.ReadFile(files[0])
			if err := os.WriteFile(files[0], tc.corrupt(b), 0o644); err != nil {
				t.Fatal(err)
			}
			r := p.Call(context.Background(), req)
			if r.Failed || r.Cached || r.Text != "echo: q" {
				t.Errorf("call over a corrupt entry = %+v, want a fresh provider reply", r)
			}
			if n := srv.requests.Load(); n != 2 {
				t.Errorf("server saw %d requests, want 2 (the corrupt entry is a miss)", n)
			}
			if !strings.Contains(logs.String(), "invalid cache entry removed") {
				t.Errorf("logs %q, want a warning about the invalid entry", logs.String())
			}
			r = p.Call(context.Background(), req)
			if !r.Cached || r.Text != "echo: q" {
				t.Errorf("third call = %+v, want a hit on the rewritten entry", r)
			}
		})
	}
}

func TestCacheIgnoresLeftoverTempFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := newTestPool(t, cachedConfig(dir, CacheReadWrite, simModel("s", SimConfig{})))
	q := &Question{ID: "1", Dataset: "nq", Text: "capital of france", Golden: []string{"Paris"}}
	p.Call(context.Background(), Request{Model: "s", Query: "x", Question: q})
	files := cacheFiles(t, dir)
	if len(files) != 1 {
		t.Fatalf("cache holds %d entries, want 1", len(files))
	}
	// A crash between create and rename leaves a temp file with partial data.
	if err := os.WriteFile(filepath.Join(filepath.Dir(files[0]), ".tmp-12345"), []byte(`{"vers`), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := p.Call(context.Background(), Request{Model: "s", Query: "x", Question: q}); !r.Cached {
		t.Errorf("call = %+v, want a hit unaffected by the temp file", r)
	}
}

func TestCacheConcurrentWritersOfOneKey(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c, err := openCache(dir, CacheReadWrite, discardLogger())
	if err != nil {
		t.Fatal(err)
	}
	key, _ := cacheKeyOf("sim", "same request")
	want := cacheEntry{Text: strings.Repeat("long reply ", 2000), InputTokens: 7, OutputTokens: 9}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 32 {
		wg.Go(func() {
			if err := c.put(key, "s", "sim", want); err != nil {
				errs <- fmt.Errorf("writer %d: %w", i, err)
			}
		})
		wg.Go(func() {
			// A reader racing the writers sees a whole entry or none.
			if got, ok := c.get(key); ok && got != want {
				errs <- fmt.Errorf("reader %d saw a partial entry (%d chars)", i, len(got.Text))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got, ok := c.get(key); !ok || got != want {
		t.Errorf("after concurrent writes get = %v (ok %v), want the entry", len(got.Text), ok)
	}
	if files := cacheFiles(t, dir); len(files) != 1 {
		t.Errorf("cache holds %d entry files, want 1", len(files))
	}
	leftovers, _ := filepath.Glob(filepath.Join(dir, key[:2], ".tmp-*"))
	if len(leftovers) != 0 {
		t.Errorf("temp files left behind: %v", leftovers)
	}
}

func TestCacheConcurrentPoolsShareDir(t *testing.T) {
	t.Parallel()
	srv := newFakeLLM(t, echoOK)
	dir := t.TempDir()
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 8 {
		// Separate pools stand in for separate processes sharing cache_dir.
		p := newTestPool(t, cachedConfig(dir, CacheReadWrite, openaiModel("m", srv.baseURL(), nil)))
		wg.Go(func() {
			<-start
			if r := p.Call(context.Background(), Request{Model: "m", Query: "shared"}); r.Failed || r.Text != "echo: shared" {
				t.Errorf("pool %d got %+v, want the reply", i, r)
			}
		})
	}
	close(start)
	wg.Wait()
	ro := newTestPool(t, cachedConfig(dir, CacheReadOnly, openaiModel("m", srv.baseURL(), nil)))
	if r := ro.Call(context.Background(), Request{Model: "m", Query: "shared"}); !r.Cached {
		t.Errorf("read-only replay = %+v, want a hit on the entry the writers raced on", r)
	}
}

// TestCacheKeyHasEndpointNotAPIKey: the API key is no part of the key (a
// new key replays the same cache), but the endpoint is: two endpoints
// serving the same model id may answer differently and must not share
// entries.
func TestCacheKeyHasEndpointNotAPIKey(t *testing.T) {
	t.Parallel()
	srv := newFakeLLM(t, echoOK)
	other := newFakeLLM(t, func(_ int64, body chatRequestSeen, w http.ResponseWriter, _ *http.Request) {
		writeOK(w, "other endpoint: "+body.query(), 10, 5)
	})
	dir := t.TempDir()
	withKey := func(o *OpenAIConfig) { o.APIKeyEnv = "K" }
	a := newTestPool(t, cachedConfig(dir, CacheReadWrite, openaiModel("m", srv.baseURL(), withKey)), withEnv("K", "first-key"))
	if r := a.Call(context.Background(), Request{Model: "m", Query: "q"}); r.Failed || r.Cached {
		t.Fatalf("first call = %+v, want a fresh reply", r)
	}
	tests := []struct {
		name       string
		baseURL    string
		mod        func(*OpenAIConfig)
		env        string
		wantCached bool
		wantText   string
		why        string
	}{
		{name: "another API key", baseURL: srv.baseURL(), mod: withKey, env: "second-key", wantCached: true, wantText: "echo: q",
			why: "the API key is not part of the cache key"},
		{name: "trailing slash on base_url", baseURL: srv.baseURL() + "/", wantCached: true, wantText: "echo: q",
			why: "the same endpoint spelt with a trailing slash is the same endpoint"},
		{name: "another endpoint, same model id", baseURL: other.baseURL(), wantText: "other endpoint: q",
			why: "the endpoint is part of the cache key"},
		{name: "another temperature", baseURL: srv.baseURL(), mod: func(o *OpenAIConfig) { o.Temperature = 0.7 }, wantText: "echo: q",
			why: "request parameters are part of the cache key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Not parallel: the rows share dir and the first entry must stay alone in it.
			b := newTestPool(t, cachedConfig(dir, CacheReadOnly, openaiModel("m", tc.baseURL, tc.mod)), withEnv("K", tc.env))
			if tc.wantCached {
				if r := b.Call(context.Background(), Request{Model: "m", Query: "q"}); !r.Cached || r.Text != tc.wantText {
					t.Errorf("call = %+v, want a hit with %q (%s)", r, tc.wantText, tc.why)
				}
				return
			}
			if r := b.Call(context.Background(), Request{Model: "m", Query: "q"}); !r.Failed || !errors.Is(r.Err, ErrCacheMiss) {
				t.Errorf("read-only call = %+v, want a cache miss (%s)", r, tc.why)
			}
			rw := newTestPool(t, cachedConfig(t.TempDir(), CacheReadWrite, openaiModel("m", tc.baseURL, tc.mod)), withEnv("K", tc.env))
			if r := rw.Call(context.Background(), Request{Model: "m", Query: "q"}); r.Cached || r.Text != tc.wantText {
				t.Errorf("call = %+v, want the fresh reply %q", r, tc.wantText)
			}
		})
	}
}

// snapshotDir records every file and directory under dir with its
// contents, mode and modification time.
func snapshotDir(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		v := fmt.Sprintf("%v %v", fi.Mode(), fi.ModTime().UnixNano())
		if !d.IsDir() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			v += " " + string(b)
		}
		out[p] = v
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestCacheReadOnlyNeverModifiesDisk: a replay must leave the recorded
// cache as it found it, even where an entry is invalid (read-write mode
// removes those; read-only only ignores them).
func TestCacheReadOnlyNeverModifiesDisk(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		corrupt func(b []byte) []byte
	}{
		{name: "edited text fails checksum", corrupt: func(b []byte) []byte {
			return []byte(strings.Replace(string(b), "echo: q", "echo: Q", 1))
		}},
		{name: "old version", corrupt: func(b []byte) []byte {
			return []byte(strings.Replace(string(b), `"version":1`, `"version":0`, 1))
		}},
		{name: "wrong key", corrupt: func(b []byte) []byte {
			return []byte(strings.Replace(string(b), `"key":"`, `"key":"00`, 1))
		}},
		{name: "half written", corrupt: func(b []byte) []byte { return b[:len(b)/2] }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newFakeLLM(t, echoOK)
			dir := t.TempDir()
			rw := newTestPool(t, cachedConfig(dir, CacheReadWrite, openaiModel("m", srv.baseURL(), nil)))
			for _, q := range []string{"q", "kept"} {
				if r := rw.Call(context.Background(), Request{Model: "m", Query: q}); r.Failed {
					t.Fatal(r.Err)
				}
			}
			var bad string
			for _, f := range cacheFiles(t, dir) {
				if b, _ := os.ReadFile(f); strings.Contains(string(b), "echo: q") {
					bad = f
					if err := os.WriteFile(f, tc.corrupt(b), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			if bad == "" {
				t.Fatal("found no entry of query q to corrupt")
			}
			before := snapshotDir(t, dir)

			var logs logBuffer
			ro := newTestPool(t, cachedConfig(dir, CacheReadOnly, openaiModel("m", srv.baseURL(), nil)), WithLogger(debugLogger(&logs)))
			if r := ro.Call(context.Background(), Request{Model: "m", Query: "q"}); !r.Failed || !errors.Is(r.Err, ErrCacheMiss) {
				t.Errorf("read-only call over the invalid entry = %+v, want a cache miss", r)
			}
			if r := ro.Call(context.Background(), Request{Model: "m", Query: "never recorded"}); !r.Failed || !errors.Is(r.Err, ErrCacheMiss) {
				t.Errorf("read-only call of a new query = %+v, want a cache miss", r)
			}
			if r := ro.Call(context.Background(), Request{Model: "m", Query: "kept"}); !r.Cached {
				t.Errorf("read-only call of a valid entry = %+v, want a hit", r)
			}
			ro.Close()
			if !strings.Contains(logs.String(), "invalid cache entry ignored") {
				t.Errorf("logs %q, want a warning that the invalid entry was ignored", logs.String())
			}
			after := snapshotDir(t, dir)
			if _, ok := after[bad]; !ok {
				t.Errorf("read-only replay deleted %s, want it left in place (read-only never modifies the cache)", bad)
			}
			for p, v := range before {
				if after[p] != v {
					t.Errorf("read-only replay changed %s, want the cache directory untouched", p)
				}
			}
			for p := range after {
				if _, ok := before[p]; !ok {
					t.Errorf("read-only replay created %s, want the cache directory untouched", p)
				}
			}
		})
	}
	t.Run("put refuses", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		c, err := openCache(dir, CacheReadOnly, discardLogger())
		if err != nil {
			t.Fatal(err)
		}
		key, _ := cacheKeyOf("sim", "request")
		if err := c.put(key, "s", "sim", cacheEntry{Text: "x"}); !errors.Is(err, errCacheReadOnly) {
			t.Errorf("put on a read-only cache = %v, want errCacheReadOnly", err)
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Errorf("read-only put created %v, want nothing", entries)
		}
	})
}

// TestCachedReplyBytesEqualFresh: a reply with invalid UTF-8 (here from a
// dataset's answers, through the simulator, or a provider's body) comes
// back byte-identical fresh, from the cache and from a read-only replay,
// so a run's rollouts do not depend on the cache's state. Before, the fresh
// reply kept the raw bytes while the cached one had U+FFFD in their place.
func TestCachedReplyBytesEqualFresh(t *testing.T) {
	t.Parallel()
	const golden = "Par\xffis \xed\xa0\x80 \xe2\x82" // a lone byte, an encoded surrogate, a cut sequence
	tests := []struct {
		name  string
		model func(t *testing.T) ModelConfig
		opts  []Option
	}{
		{name: "sim golden answer", model: func(*testing.T) ModelConfig {
			return simModel("m", SimConfig{DefaultAccuracy: 1, IgnoreQuery: true})
		}},
		{name: "sim answer bank", model: func(*testing.T) ModelConfig {
			return simModel("m", SimConfig{DefaultAccuracy: 0})
		}, opts: []Option{WithAnswerBank(map[string][]string{"nq": {"Lon\xfe\xffdon"}})}},
		{name: "openai raw bytes in the body", model: func(t *testing.T) ModelConfig {
			srv := newFakeLLM(t, func(_ int64, _ chatRequestSeen, w http.ResponseWriter, _ *http.Request) {
				fmt.Fprint(w, `{"choices":[{"message":{"content":"`+golden+`"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
			})
			return openaiModel("m", srv.baseURL(), nil)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			m := tc.model(t)
			q := &Question{ID: "1", Dataset: "nq", Text: "capital of France", Golden: []string{golden}}
			req := Request{Model: "m", Query: "capital of France", Question: q}
			rw := newTestPool(t, cachedConfig(dir, CacheReadWrite, m), tc.opts...)
			fresh := rw.Call(context.Background(), req)
			cached := rw.Call(context.Background(), req)
			ro := newTestPool(t, cachedConfig(dir, CacheReadOnly, m), tc.opts...)
			replay := ro.Call(context.Background(), req)
			if fresh.Failed || fresh.Cached || !cached.Cached || !replay.Cached {
				t.Fatalf("calls = %+v / %+v / %+v, want fresh, then two hits", fresh, cached, replay)
			}
			if !utf8.ValidString(fresh.Text) || !strings.Contains(fresh.Text, "\uFFFD") {
				t.Errorf("fresh Text = %q, want valid UTF-8 with U+FFFD for the bad bytes", fresh.Text)
			}
			if cached.Text != fresh.Text || replay.Text != fresh.Text {
				t.Errorf("Text fresh %q, cached %q, replayed %q: want the same bytes (rollouts must not depend on the cache)",
					fresh.Text, cached.Text, replay.Text)
			}
		})
	}
}

// TestValidTextMatchesJSON: validText replaces bad bytes exactly as
// encoding/json does when the cache stores a reply, so entries written
// before replies were normalised also equal a fresh reply.
func TestValidTextMatchesJSON(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"plain", "", "é ✓ 🙂", "a\xffb", "\xff\xfe", "\xed\xa0\x80", "\xe2\x82", "x\xf0\x9f\x99", "\xc0\xaf", "<&>\u2028"} {
		b, _ := json.Marshal(in)
		var viaJSON string
		if err := json.Unmarshal(b, &viaJSON); err != nil {
			t.Fatal(err)
		}
		if got := validText(in); got != viaJSON || !utf8.ValidString(got) {
			t.Errorf("validText(%q) = %q, want %q (what a JSON round trip through the cache gives)", in, got, viaJSON)
		}
	}
}
