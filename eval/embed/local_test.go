package embed

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
)

func newTestLocal(t *testing.T, dim int) Embedder {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Dim = dim
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func embedOne(t *testing.T, e Embedder, texts ...string) [][]float32 {
	t.Helper()
	vs, err := e.Embed(context.Background(), texts)
	if err != nil {
		t.Fatal(err)
	}
	if len(vs) != len(texts) {
		t.Fatalf("%d vectors for %d texts", len(vs), len(texts))
	}
	return vs
}

// Two embedders built alike give bit-identical vectors, of unit length, and
// the in-memory cache returns copies.
func TestLocalDeterministic(t *testing.T) {
	a := embedOne(t, newTestLocal(t, 1024), "Who wrote the novel Moby-Dick?", "What is the capital of France?")
	e := newTestLocal(t, 1024)
	b := embedOne(t, e, "Who wrote the novel Moby-Dick?", "What is the capital of France?")
	for i := range a {
		if !slices.Equal(a[i], b[i]) {
			t.Fatalf("text %d: vectors differ between two identical embedders; routers would not repeat", i)
		}
		if n := Dot(a[i], a[i]); math.Abs(n-1) > 1e-5 {
			t.Errorf("text %d: squared norm %v, want 1 (dot products must be cosines)", i, n)
		}
	}
	b[0][0] = 42 // the caller's copy, not the cache's
	c := embedOne(t, e, "Who wrote the novel Moby-Dick?")
	if !slices.Equal(c[0], a[0]) {
		t.Error("changing a returned vector changed the cached one")
	}
}

// Paraphrases are closer than unrelated questions, fitted or not.
func TestLocalSimilarity(t *testing.T) {
	corpus := []string{
		"who wrote the novel moby dick?", "who is the author of moby dick?", "what is the capital of france?",
		"when did the first world war start?", "which river flows through cairo?", "how many legs does a spider have?",
		"who painted the mona lisa?", "what year did the berlin wall fall?",
	}
	cases := []struct{ anchor, near, far string }{
		{"Who wrote the novel Moby-Dick?", "Who is the author of Moby Dick?", "What is the capital of France?"},
		{"When did World War I begin?", "When did the First World War start?", "Which river flows through Cairo?"},
		{"How many legs does a spider have?", "How many legs has a spider got?", "Who painted the Mona Lisa?"},
	}
	unfitted := newTestLocal(t, 4096)
	fitted, err := Fit(unfitted, corpus)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []Embedder{unfitted, fitted} {
		for _, c := range cases {
			v := embedOne(t, e, c.anchor, c.near, c.far)
			near, far := Dot(v[0], v[1]), Dot(v[0], v[2])
			t.Logf("state %q: cos(near) %.3f, cos(far) %.3f", e.Info().State, near, far)
			if near <= far+0.1 {
				t.Errorf("%s (state %q): cos(%q, %q) = %.3f, not clearly above cos with %q = %.3f",
					e.Info().Provider, e.Info().State, c.anchor, c.near, near, c.far, far)
			}
		}
	}
}

// The fitted IDF survives State/WithState exactly; bad states are refused.
func TestLocalState(t *testing.T) {
	e := newTestLocal(t, 256)
	if State(e) != nil || e.Info().State != "" {
		t.Fatal("an unfitted local embedder reports a state")
	}
	f, err := Fit(e, []string{"alpha beta", "beta gamma", "gamma delta epsilon"})
	if err != nil {
		t.Fatal(err)
	}
	st := State(f)
	back, err := WithState(e, st)
	if err != nil {
		t.Fatal(err)
	}
	if back.Info() != f.Info() {
		t.Errorf("restored info %+v, want %+v", back.Info(), f.Info())
	}
	a, b := embedOne(t, f, "beta delta"), embedOne(t, back, "beta delta")
	if !slices.Equal(a[0], b[0]) {
		t.Error("a restored IDF embeds differently from the fitted one")
	}
	if u := embedOne(t, e, "beta delta"); slices.Equal(u[0], a[0]) {
		t.Error("fitting the IDF changed nothing")
	}
	for name, bad := range map[string][]byte{
		"not json":  []byte("{"),
		"other dim": State(must(Fit(newTestLocal(t, 512), []string{"x y"}))),
		"idf < 1":   []byte(`{"model":"` + localModel + `","dim":256,"docs":1,"idf":[0` + strings.Repeat(",1", 255) + `]}`),
	} {
		if _, err := WithState(e, bad); !errors.Is(err, ErrState) {
			t.Errorf("%s: error %v, want ErrState", name, err)
		}
	}
	if v := embedOne(t, e, "?!"); Dot(v[0], v[0]) != 0 {
		t.Error("a text without letters or digits should give the zero vector")
	}
}

func must(e Embedder, err error) Embedder {
	if err != nil {
		panic(err)
	}
	return e
}

func TestConfigValidate(t *testing.T) {
	ok := DefaultConfig()
	oa := DefaultConfig()
	oa.Provider = "openai"
	oa.OpenAI.BaseURL, oa.OpenAI.Model = "https://api.example.com/v1", "text-embedding-3-small"
	cases := []struct {
		name string
		edit func(*Config)
		want string // "" = valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"unknown provider", func(c *Config) { c.Provider = "bert" }, `embedding.provider = "bert": want one of local, openai`},
		{"dim not a power of two", func(c *Config) { c.Dim = 1000 }, "embedding.dim"},
		{"bad cache", func(c *Config) { c.Cache = "yes" }, "embedding.cache"},
		{"openai ok", func(c *Config) { *c = oa }, ""},
		{"openai without url", func(c *Config) { *c = oa; c.OpenAI.BaseURL = "" }, "base_url is required"},
		{"openai url with a password", func(c *Config) { *c = oa; c.OpenAI.BaseURL = "https://u:p@h/v1" }, "credentials"},
		{"openai without model", func(c *Config) { *c = oa; c.OpenAI.Model = "" }, "embedding.openai.model"},
		{"openai batch 0", func(c *Config) { *c = oa; c.OpenAI.BatchSize = 0 }, "batch_size"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := ok
			c.edit(&cfg)
			err := cfg.Validate()
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("valid config refused: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
}
