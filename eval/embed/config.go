package embed

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Cache modes of embedding.cache (the openai provider's disk cache).
const (
	CacheReadWrite = "read-write" // read cached vectors and write new ones
	CacheReadOnly  = "read-only"  // only read: a miss is an error (replay)
	CacheOff       = "off"        // neither read nor write
)

// Defaults of the [embedding] table.
const (
	DefaultProvider       = "local"
	DefaultDim            = 1 << 12
	DefaultBatchSize      = 64
	DefaultMaxConcurrency = 4
	DefaultMaxRetries     = 5
	DefaultRetryBase      = 500 * time.Millisecond
	DefaultRetryMax       = 30 * time.Second
	DefaultTimeout        = 60 * time.Second
)

// Config is the [embedding] table of recal.toml: how question texts become
// vectors for the discriminative baseline routers (package baselines).
type Config struct {
	// Provider is the registered provider: "local" (hashed word and
	// character n-grams, offline, the default) or "openai" (an
	// OpenAI-compatible /embeddings endpoint, [embedding.openai]).
	Provider string `toml:"provider"`
	// Dim is the local provider's feature dimension, a power of two in
	// [16, 2^20]. Default 4096. The openai provider ignores it.
	Dim int `toml:"dim"`
	// Cache is the openai provider's disk cache: "read-write" (default),
	// "read-only" (a miss is an error) or "off". Vectors are stored under
	// the folder the caller gives (recal uses <pool.cache_dir>/embeddings).
	// Every provider also keeps the vectors of a run in memory.
	Cache string `toml:"cache"`
	// OpenAI holds the settings of provider "openai" ([embedding.openai]).
	OpenAI OpenAIConfig `toml:"openai"`
}

// OpenAIConfig is the [embedding.openai] table: an OpenAI-compatible
// embeddings endpoint (POST base_url + "/embeddings").
type OpenAIConfig struct {
	// BaseURL is the API root with its version, e.g.
	// "https://api.openai.com/v1". Redirects are not followed. Part of the
	// cache key and of the embeddings' identity; no secrets in it.
	BaseURL string `toml:"base_url"`
	// Model is the provider's model id, e.g. "text-embedding-3-small".
	Model string `toml:"model"`
	// APIKeyEnv names the environment variable holding the API key, read
	// once when the embedder is built; "" sends no Authorization header.
	APIKeyEnv string `toml:"api_key_env"`
	// Dimensions, when > 0, is sent as "dimensions" (models that can
	// shorten their vectors); 0 takes the model's own size.
	Dimensions int `toml:"dimensions"`
	// BatchSize is the texts per request. Default 64.
	BatchSize int `toml:"batch_size"`
	// MaxConcurrency bounds the requests in flight. Default 4.
	MaxConcurrency int `toml:"max_concurrency"`
	// MaxRetries is the retries after the first attempt on 408, 429, 5xx,
	// timeouts, connection errors and malformed replies. 0 takes the
	// default 5; -1 disables retries.
	MaxRetries int `toml:"max_retries"`
	// RetryBase is the first wait of the exponential backoff between
	// attempts (duration string). Default 500ms.
	RetryBase time.Duration `toml:"retry_base"`
	// RetryMax caps any wait between attempts (duration string); a
	// Retry-After header, when sent, is waited instead, capped at RetryMax.
	// Default 30s.
	RetryMax time.Duration `toml:"retry_max"`
	// Timeout bounds one HTTP attempt (duration string). Default 60s.
	Timeout time.Duration `toml:"timeout"`
}

// DefaultConfig returns the defaults: the local provider, 4096 features.
func DefaultConfig() Config {
	return Config{Provider: DefaultProvider, Dim: DefaultDim, Cache: CacheReadWrite,
		OpenAI: OpenAIConfig{BatchSize: DefaultBatchSize, MaxConcurrency: DefaultMaxConcurrency,
			RetryBase: DefaultRetryBase, RetryMax: DefaultRetryMax, Timeout: DefaultTimeout}}
}

// retries is the number of retries MaxRetries asks for.
func (c OpenAIConfig) retries() int {
	switch {
	case c.MaxRetries < 0:
		return 0
	case c.MaxRetries == 0:
		return DefaultMaxRetries
	}
	return c.MaxRetries
}

// Validate checks the table, naming the bad key.
func (c Config) Validate() error {
	if _, ok := providers[c.Provider]; !ok {
		return fmt.Errorf("embed: embedding.provider = %q: want one of %s", c.Provider, strings.Join(Providers(), ", "))
	}
	if !slices.Contains([]string{CacheReadWrite, CacheReadOnly, CacheOff}, c.Cache) {
		return fmt.Errorf("embed: embedding.cache = %q: want read-write, read-only or off", c.Cache)
	}
	if c.Provider == "local" && (c.Dim < 16 || c.Dim > 1<<20 || c.Dim&(c.Dim-1) != 0) {
		return fmt.Errorf("embed: embedding.dim = %d: want a power of two in [16, 1048576]", c.Dim)
	}
	if c.Provider != "openai" {
		return nil
	}
	o := c.OpenAI
	u, err := url.Parse(o.BaseURL)
	switch {
	case o.BaseURL == "":
		return fmt.Errorf("embed: embedding.openai.base_url is required with provider \"openai\"")
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return fmt.Errorf("embed: embedding.openai.base_url = %q: want an http(s) URL such as https://api.openai.com/v1", o.BaseURL)
	case u.User != nil:
		return fmt.Errorf("embed: embedding.openai.base_url: credentials in the URL; use api_key_env")
	case strings.TrimSpace(o.Model) == "":
		return fmt.Errorf("embed: embedding.openai.model is required with provider \"openai\"")
	case o.Dimensions < 0:
		return fmt.Errorf("embed: embedding.openai.dimensions = %d: want ≥ 0", o.Dimensions)
	case o.BatchSize < 1 || o.BatchSize > 2048:
		return fmt.Errorf("embed: embedding.openai.batch_size = %d: want 1 to 2048", o.BatchSize)
	case o.MaxConcurrency < 1:
		return fmt.Errorf("embed: embedding.openai.max_concurrency = %d: want ≥ 1", o.MaxConcurrency)
	case o.MaxRetries < -1:
		return fmt.Errorf("embed: embedding.openai.max_retries = %d: want ≥ -1", o.MaxRetries)
	case o.RetryBase <= 0 || o.RetryMax < o.RetryBase:
		return fmt.Errorf("embed: embedding.openai.retry_base = %v, retry_max = %v: want 0 < retry_base ≤ retry_max", o.RetryBase, o.RetryMax)
	case o.Timeout <= 0:
		return fmt.Errorf("embed: embedding.openai.timeout = %v: want > 0", o.Timeout)
	}
	return nil
}
