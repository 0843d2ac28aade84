// Package embed turns question texts into vectors for the discriminative
// baseline routers (package baselines). Providers register in one place
// (providers) with one signature:
//
//   - "local" (the default) works offline: deterministic hashed word
//     unigram and bigram and character 3–5-gram features with sublinear tf,
//     weighted by an IDF fitted on the training questions (see Local);
//   - "openai" calls an OpenAI-compatible /embeddings endpoint in batches,
//     with retries that honour Retry-After, a per-attempt timeout, no
//     redirects and a disk cache (see openAI).
//
// Every vector returned has unit length (or is all zeros for a text with no
// feature), so a dot product is a cosine. Vectors are comparable only under
// the same Info; routers record it and refuse another.
package embed

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
)

var (
	// ErrEmptyText: the openai provider was asked to embed an empty text
	// (the API refuses it); no request is sent.
	ErrEmptyText = errors.New("embed: empty text")
	// ErrCacheMiss: embedding.cache is read-only and a vector is not cached.
	ErrCacheMiss = errors.New("embed: cache miss in read-only mode")
	// ErrState: saved provider statistics (the local IDF) do not fit the
	// embedder they are given to.
	ErrState = errors.New("embed: bad fitted state")
)

// Info identifies a space of vectors: two embedders with the same Info give
// the same vector for the same text.
type Info struct {
	// Provider is the registered provider name.
	Provider string `json:"provider"`
	// Model names the features: the local feature set and its version, or
	// the openai model id.
	Model string `json:"model"`
	// Endpoint is the openai base URL ("" for local).
	Endpoint string `json:"endpoint,omitempty"`
	// Dim is the vector length (0 for an openai model whose size is known
	// only after the first reply and embedding.openai.dimensions is 0).
	Dim int `json:"dim"`
	// State digests fitted statistics (the local IDF): "" when none.
	State string `json:"state,omitempty"`
}

// Embedder embeds texts. Implementations are safe for concurrent use.
type Embedder interface {
	// Info identifies the vectors.
	Info() Info
	// Embed returns one vector per text, in order; each has unit length or
	// is all zeros. ctx bounds any network call.
	Embed(ctx context.Context, texts []string) ([][]float32, error)
}

// Fitter is an Embedder whose vectors depend on statistics of a corpus (the
// local provider's IDF). Fit, State and WithState return or read a copy; the
// receiver is never changed.
type Fitter interface {
	Embedder
	// Fit returns a copy with statistics fitted on texts.
	Fit(texts []string) (Embedder, error)
	// State returns the fitted statistics in a stable encoding (the same
	// statistics always give the same bytes), or nil when unfitted.
	State() []byte
	// WithState returns a copy with statistics read from State's bytes; bad
	// bytes give an error wrapping ErrState.
	WithState(b []byte) (Embedder, error)
}

// Fit returns e fitted on texts when e is a Fitter, else e itself.
func Fit(e Embedder, texts []string) (Embedder, error) {
	if f, ok := e.(Fitter); ok {
		return f.Fit(texts)
	}
	return e, nil
}

// State returns e's fitted statistics (nil when there are none).
func State(e Embedder) []byte {
	if f, ok := e.(Fitter); ok {
		return f.State()
	}
	return nil
}

// WithState gives saved statistics to e. A nil state leaves e unchanged; a
// state for an embedder that keeps none is an error.
func WithState(e Embedder, b []byte) (Embedder, error) {
	if b == nil {
		return e, nil
	}
	f, ok := e.(Fitter)
	if !ok {
		return nil, fmt.Errorf("%w: provider %q keeps no fitted statistics", ErrState, e.Info().Provider)
	}
	return f.WithState(b)
}

// Env is what a provider is built with besides its table.
type Env struct {
	// Log receives retries and cache problems; never an API key.
	Log *slog.Logger
	// LookupEnv reads environment variables (API keys).
	LookupEnv func(string) (string, bool)
	// CacheDir is the folder of the disk cache ("" = no disk cache).
	CacheDir string
}

// Provider builds an embedder from the [embedding] table.
type Provider func(cfg Config, env Env) (Embedder, error)

// providers is the registry of embedding providers; its doc is the
// package's. Unknown names are an error listing these.
var providers = map[string]Provider{
	"local":  newLocal,
	"openai": newOpenAI,
}

// Providers lists the registered provider names, sorted.
func Providers() []string {
	out := make([]string, 0, len(providers))
	for k := range providers {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Option configures New.
type Option func(*Env)

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option {
	return func(e *Env) {
		if l != nil {
			e.Log = l
		}
	}
}

// WithCacheDir sets the folder of the disk cache (the openai provider's);
// without it vectors are cached in memory only.
func WithCacheDir(dir string) Option { return func(e *Env) { e.CacheDir = dir } }

// CacheDir is where recal keeps the embeddings' disk cache: beside the
// pool's (pool.cache_dir).
func CacheDir(poolCacheDir string) string { return filepath.Join(poolCacheDir, "embeddings") }

// WithLookupEnv replaces os.LookupEnv for reading API keys (tests).
func WithLookupEnv(f func(string) (string, bool)) Option {
	return func(e *Env) { e.LookupEnv = f }
}

// New validates cfg and builds its provider. Any problem (a missing API-key
// variable, an unusable cache folder) is an error here, before any call.
func New(cfg Config, opts ...Option) (Embedder, error) {
	env := Env{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), LookupEnv: os.LookupEnv}
	for _, o := range opts {
		o(&env)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return providers[cfg.Provider](cfg, env)
}

// Dot is the dot product of two vectors of the same length (their cosine
// when both have unit length).
func Dot(a, b []float32) float64 {
	var s float64
	for i := range a {
		s += float64(a[i]) * float64(b[i])
	}
	return s
}

// normalize scales v to unit length in place (a zero vector stays zero) and
// reports whether every element is finite.
func normalize(v []float32) bool {
	var s float64
	for _, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return false
		}
		s += float64(x) * float64(x)
	}
	if s == 0 {
		return true
	}
	n := 1 / math.Sqrt(s)
	for i := range v {
		v[i] = float32(float64(v[i]) * n)
	}
	return true
}

// memoLimit bounds the vectors an embedder keeps in memory; beyond it new
// vectors are not kept (the disk cache, when on, still has them).
const memoLimit = 1 << 18

// memo is the in-memory cache of an embedder, keyed by (Info, text).
type memo struct {
	mu sync.Mutex
	m  map[[32]byte][]float32
}

// memoKey hashes the embedder's identity and the text.
func memoKey(info Info, text string) [32]byte {
	b, _ := json.Marshal(info) // strings and an int always encode
	h := sha256.New()
	h.Write(b)
	h.Write([]byte{0})
	h.Write([]byte(text))
	var k [32]byte
	h.Sum(k[:0])
	return k
}

func (c *memo) get(k [32]byte) ([]float32, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.m[k]
	return v, ok
}

func (c *memo) put(k [32]byte, v []float32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[[32]byte][]float32{}
	}
	if len(c.m) < memoLimit {
		c.m[k] = v
	}
}

// clone copies a cached vector so that callers may change what they get.
func clone(v []float32) []float32 { return append([]float32(nil), v...) }

// describe names a text in errors without quoting all of it.
func describe(text string) string {
	r := []rune(strings.TrimSpace(text))
	if len(r) > 40 {
		return fmt.Sprintf("%q…", string(r[:40]))
	}
	return fmt.Sprintf("%q", string(r))
}
