package llmpool

import (
	"encoding/json"
	"fmt"
	"math"
	"net/url"
	"slices"
	"strings"
	"time"
)

// CacheMode says how the response cache is used.
type CacheMode string

// Cache modes of pool.cache.
const (
	// CacheReadWrite reads cached replies and writes new ones.
	CacheReadWrite CacheMode = "read-write"
	// CacheReadOnly only reads: a miss is an error (replay of a recorded run).
	CacheReadOnly CacheMode = "read-only"
	// CacheOff neither reads nor writes.
	CacheOff CacheMode = "off"
)

// Defaults of the [pool] table and of the provider sections.
const (
	DefaultCacheDir       = "cache/pool"
	DefaultMaxConcurrency = 32
	DefaultMaxQueryChars  = 4000
	// DefaultFailureText is the observation of a failed call; {model} is
	// replaced by the (sanitised) model name.
	DefaultFailureText = "[pool error: model {model} unavailable]"

	DefaultOpenAITopP           = 1.0
	DefaultOpenAIMaxTokens      = 512
	DefaultOpenAITimeout        = 60 * time.Second
	DefaultOpenAIMaxConcurrency = 8
	DefaultOpenAIMaxRetries     = 5
	DefaultOpenAIRetryBase      = 500 * time.Millisecond
	DefaultOpenAIRetryMax       = 30 * time.Second
)

// Config is the [pool] table of recal.toml.
type Config struct {
	// Cache is the response cache mode: "read-write", "read-only" (replay:
	// a miss is a failed call; nothing on disk is written or removed) or
	// "off". Default read-write.
	Cache CacheMode `toml:"cache"`
	// CacheDir is the directory of the response cache. Default "cache/pool".
	CacheDir string `toml:"cache_dir"`
	// MaxConcurrency bounds the requests on the wire across the whole pool
	// (requests); a call holds a slot only while its request is out, not
	// while it waits for its model's slot, rate limit or retry. Cache hits
	// do not count. Default 32.
	MaxConcurrency int `toml:"max_concurrency"`
	// MaxQueryChars caps a sub-query, in Unicode code points, before it is
	// sent or hashed; longer queries are cut. Default 4000.
	MaxQueryChars int `toml:"max_query_chars"`
	// FailureText overrides the observation of a failed call; "{model}" in it
	// is replaced by the model name. Default DefaultFailureText.
	FailureText string `toml:"failure_text"`
	// Models are the models of the pool, in the order shown to the policy.
	Models []ModelConfig `toml:"models"`
}

// ModelConfig is one [[pool.models]] entry.
type ModelConfig struct {
	// Name is the name the policy writes in <search>NAME: query</search>,
	// matched without case. It must not contain ':' '<' or '>'.
	Name string `toml:"name"`
	// Description is the text shown to the policy for this model.
	Description string `toml:"description"`
	// PriceIn is the price of input (prompt) tokens, USD per million tokens.
	PriceIn float64 `toml:"price_in"`
	// PriceOut is the price of output (completion) tokens, USD per million tokens.
	PriceOut float64 `toml:"price_out"`
	// Provider is the registered provider that serves the model: "openai",
	// "replay" or "sim".
	Provider string `toml:"provider"`
	// OpenAI holds the settings of provider "openai" ([pool.models.openai]).
	OpenAI *OpenAIConfig `toml:"openai"`
	// Sim holds the settings of provider "sim" ([pool.models.sim]).
	Sim *SimConfig `toml:"sim"`
	// Replay holds the settings of provider "replay" ([pool.models.replay]).
	Replay *ReplayConfig `toml:"replay" json:",omitempty"` // omitempty: a pool without replay keeps its identity (the JSON identities hash)
}

// WithoutOperational is m less the settings that change how calls are made
// but not what they answer: an openai model's API-key variable, timeout,
// concurrency, rate limit and retries, a simulated model's latency. What is
// keyed by a pool's answers (eval's "pool" input, the outcome matrix's pool
// identity) is keyed by it. m's provider tables are copied, never changed.
func (m ModelConfig) WithoutOperational() ModelConfig {
	if m.OpenAI != nil {
		o := *m.OpenAI
		o.APIKeyEnv, o.Timeout, o.MaxConcurrency, o.RequestsPerMinute = "", 0, 0, 0
		o.MaxRetries, o.RetryBase, o.RetryMax = 0, 0, 0
		m.OpenAI = &o
	}
	if m.Sim != nil {
		s := *m.Sim
		s.Latency = 0
		m.Sim = &s
	}
	return m
}

// OpenAIConfig is the [pool.models.openai] table: an OpenAI-compatible
// chat-completions endpoint.
type OpenAIConfig struct {
	// BaseURL is the API root including the version, e.g.
	// "https://integrate.api.nvidia.com/v1"; "/chat/completions" is appended.
	// Redirects are not followed (a 3xx is a failed call naming its
	// Location). Part of the cache key. Do not put secrets in it.
	BaseURL string `toml:"base_url"`
	// Model is the provider's model id, e.g. "qwen/qwen2.5-7b-instruct".
	Model string `toml:"model"`
	// APIKeyEnv names the environment variable holding the API key, read once
	// when the pool is built. Empty means no Authorization header (local vLLM).
	APIKeyEnv string `toml:"api_key_env"`
	// PromptTemplate optionally wraps the sub-query: "{query}" in it is
	// replaced by the query. Empty sends the query itself (Router-R1 wraps it
	// in its AGENT_PROMPT). Either way it is the only user message.
	PromptTemplate string `toml:"prompt_template"`
	// Temperature is the sampling temperature. Default 0.
	Temperature float64 `toml:"temperature"`
	// TopP is the nucleus-sampling mass, in (0, 1]. Default 1.
	TopP float64 `toml:"top_p"`
	// MaxTokens caps the reply, in tokens. Default 512.
	MaxTokens int `toml:"max_tokens"`
	// Seed is sent as the request's seed when set (Router-R1 uses 42).
	Seed *int64 `toml:"seed"`
	// Timeout bounds one HTTP attempt (duration string). Default "60s".
	Timeout time.Duration `toml:"timeout"`
	// MaxConcurrency bounds this model's requests in flight. Default 8.
	MaxConcurrency int `toml:"max_concurrency"`
	// RequestsPerMinute caps this model's request rate, retries included
	// (requests per minute, paced evenly). 0 means unlimited.
	RequestsPerMinute float64 `toml:"requests_per_minute"`
	// MaxRetries is the number of retries after the first attempt on 429,
	// 5xx, timeouts, connection errors and malformed replies. 0 takes the
	// default 5; -1 disables retries.
	MaxRetries int `toml:"max_retries"`
	// RetryBase is the first backoff wait (duration); it doubles per retry,
	// with jitter. Default "500ms".
	RetryBase time.Duration `toml:"retry_base"`
	// RetryMax caps any single wait between attempts, Retry-After included
	// (duration). Default "30s".
	RetryMax time.Duration `toml:"retry_max"`
	// Extra is merged into the JSON request body for provider extras
	// (OpenRouter "provider", NIM parameters). It may not set model,
	// messages, stream or a field configured above.
	Extra Extra `toml:"extra"`
}

// Extra is a JSON-encodable table merged into a request body.
type Extra map[string]any

// UnmarshalTOML takes any TOML table, nested tables included, so that a
// strict loader (BurntSushi/toml MetaData.Undecoded) accepts provider extras
// of any shape: the decoder marks every key under an Unmarshaler as decoded.
func (e *Extra) UnmarshalTOML(v any) error {
	m, ok := v.(map[string]any)
	if !ok {
		return fmt.Errorf("llmpool: openai.extra: want a table, got %T", v)
	}
	*e = Extra(m)
	return nil
}

// SimConfig is the [pool.models.sim] table of a simulated model. The rule it
// answers by is in the package doc ("Simulated models").
type SimConfig struct {
	// Accuracy is the probability, per dataset name (matched without case),
	// of answering a fully relevant sub-query correctly, in [0, 1].
	Accuracy map[string]float64 `toml:"accuracy"`
	// DefaultAccuracy is the probability for datasets not in Accuracy, in
	// [0, 1]. Default 0: unlisted datasets are always answered wrongly.
	DefaultAccuracy float64 `toml:"default_accuracy"`
	// Latency is the simulated time of one call (duration); it honours
	// context cancellation. Default 0.
	Latency time.Duration `toml:"latency"`
	// TokensIn is the input tokens reported per call; 0 estimates them from
	// the query (4 characters per token).
	TokensIn int `toml:"tokens_in"`
	// TokensOut is the output tokens reported per call; 0 estimates them from
	// the reply (4 characters per token).
	TokensOut int `toml:"tokens_out"`
	// FailureRate is the probability that a call fails as if the provider
	// were down (to exercise failure observations), in [0, 1]. Default 0.
	FailureRate float64 `toml:"failure_rate"`
	// Seed makes the simulator's draws differ between runs. Default 0.
	Seed int64 `toml:"seed"`
	// IgnoreQuery skips the relevance rule: the chance of a correct reply is
	// accuracy[dataset] whatever the sub-query says (the draw still depends
	// on it). For policies too small to write a sub-query, such as the
	// offline default's tiny one trained from scratch in minutes: routing,
	// not query writing, is then what they learn. Default false.
	IgnoreQuery bool `toml:"ignore_query"`
}

// Defaults returns a Config with the pool-level defaults and no models.
func Defaults() Config {
	c := Config{}
	c.SetDefaults()
	return c
}

// SetDefaults fills every zero field of c and of its models' provider
// sections with its default. A model whose provider section is missing gets
// one, so that defaults apply to it.
func (c *Config) SetDefaults() {
	if c.Cache == "" {
		c.Cache = CacheReadWrite
	}
	if c.CacheDir == "" {
		c.CacheDir = DefaultCacheDir
	}
	if c.MaxConcurrency == 0 {
		c.MaxConcurrency = DefaultMaxConcurrency
	}
	if c.MaxQueryChars == 0 {
		c.MaxQueryChars = DefaultMaxQueryChars
	}
	if c.FailureText == "" {
		c.FailureText = DefaultFailureText
	}
	for i := range c.Models {
		m := &c.Models[i]
		switch m.Provider {
		case "openai":
			if m.OpenAI == nil {
				m.OpenAI = &OpenAIConfig{}
			}
		case "sim":
			if m.Sim == nil {
				m.Sim = &SimConfig{}
			}
		case "replay":
			if m.Replay == nil {
				m.Replay = &ReplayConfig{}
			}
		}
		if m.OpenAI != nil {
			m.OpenAI.SetDefaults()
		}
		if m.Replay != nil {
			m.Replay.SetDefaults(m.Name)
		}
	}
}

// SetDefaults fills the zero fields of o with their defaults.
func (o *OpenAIConfig) SetDefaults() {
	if o.TopP == 0 {
		o.TopP = DefaultOpenAITopP
	}
	if o.MaxTokens == 0 {
		o.MaxTokens = DefaultOpenAIMaxTokens
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultOpenAITimeout
	}
	if o.MaxConcurrency == 0 {
		o.MaxConcurrency = DefaultOpenAIMaxConcurrency
	}
	if o.MaxRetries == 0 {
		o.MaxRetries = DefaultOpenAIMaxRetries
	}
	if o.RetryBase == 0 {
		o.RetryBase = DefaultOpenAIRetryBase
	}
	if o.RetryMax == 0 {
		o.RetryMax = DefaultOpenAIRetryMax
	}
}

// retries is the number of retries after the first attempt.
func (o *OpenAIConfig) retries() int {
	if o.MaxRetries < 0 {
		return 0
	}
	return o.MaxRetries
}

// reservedExtra are request-body keys that openai.extra may not set, with the
// config key to use instead ("" when none may be used).
var reservedExtra = map[string]string{
	"model":       "openai.model",
	"messages":    "",
	"stream":      "",
	"temperature": "openai.temperature",
	"top_p":       "openai.top_p",
	"max_tokens":  "openai.max_tokens",
	"seed":        "openai.seed",
}

// Validate checks a Config whose defaults are set (SetDefaults). The error
// names the entry and key, e.g.
// `llmpool: pool.models[2] ("llama-70b"): openai.base_url is required`.
func (c *Config) Validate() error {
	switch c.Cache {
	case CacheReadWrite, CacheReadOnly, CacheOff:
	default:
		return fmt.Errorf("llmpool: pool.cache: %q is not one of read-write, read-only, off", c.Cache)
	}
	if c.Cache != CacheOff && c.CacheDir == "" {
		return fmt.Errorf("llmpool: pool.cache_dir is required when pool.cache is %q", c.Cache)
	}
	if c.MaxConcurrency < 1 {
		return fmt.Errorf("llmpool: pool.max_concurrency: %d, want >= 1", c.MaxConcurrency)
	}
	if c.MaxQueryChars < 1 {
		return fmt.Errorf("llmpool: pool.max_query_chars: %d, want >= 1", c.MaxQueryChars)
	}
	if len(c.Models) == 0 {
		return fmt.Errorf("llmpool: pool.models: at least one model is required")
	}
	seen := map[string]int{}
	for i := range c.Models {
		m := &c.Models[i]
		if err := m.validate(); err != nil {
			return fmt.Errorf("llmpool: pool.models[%d] (%q): %w", i, m.Name, err)
		}
		key := strings.ToLower(m.Name)
		if j, ok := seen[key]; ok {
			return fmt.Errorf("llmpool: pool.models[%d] (%q): name duplicates pool.models[%d] (names match without case)", i, m.Name, j)
		}
		seen[key] = i
	}
	return nil
}

func (m *ModelConfig) validate() error {
	switch {
	case m.Name == "":
		return fmt.Errorf("name is required")
	case strings.TrimSpace(m.Name) != m.Name:
		return fmt.Errorf("name has leading or trailing spaces")
	case strings.ContainsAny(m.Name, ":<>"):
		return fmt.Errorf("name may not contain ':', '<' or '>' (the policy writes <search>NAME: query</search>)")
	case strings.TrimSpace(m.Description) == "":
		return fmt.Errorf("description is required (it is shown to the policy)")
	}
	if err := checkPrice("price_in", m.PriceIn); err != nil {
		return err
	}
	if err := checkPrice("price_out", m.PriceOut); err != nil {
		return err
	}
	if _, ok := providers[m.Provider]; !ok {
		return fmt.Errorf("provider %q is unknown (known: %s)", m.Provider, strings.Join(providerNames(), ", "))
	}
	if m.OpenAI != nil && m.Provider != "openai" {
		return fmt.Errorf("an openai section is given but provider is %q", m.Provider)
	}
	if m.Sim != nil && m.Provider != "sim" {
		return fmt.Errorf("a sim section is given but provider is %q", m.Provider)
	}
	if m.Replay != nil && m.Provider != "replay" {
		return fmt.Errorf("a replay section is given but provider is %q", m.Provider)
	}
	switch m.Provider {
	case "openai":
		if m.OpenAI == nil {
			return fmt.Errorf("openai.base_url is required")
		}
		return m.OpenAI.validate()
	case "sim":
		if m.Sim == nil {
			return nil
		}
		return m.Sim.validate()
	case "replay":
		if m.Replay == nil {
			return fmt.Errorf("replay.log is required (an outcome log, docs/outcomes.md)")
		}
		return m.Replay.validate()
	}
	return nil
}

func checkPrice(key string, v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return fmt.Errorf("%s: %v, want a finite price >= 0 (USD per million tokens)", key, v)
	}
	return nil
}

func (o *OpenAIConfig) validate() error {
	if o.BaseURL == "" {
		return fmt.Errorf("openai.base_url is required")
	}
	u, err := url.Parse(o.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("openai.base_url: want an http or https URL such as https://integrate.api.nvidia.com/v1")
	}
	if u.User != nil || u.RawQuery != "" {
		return fmt.Errorf("openai.base_url: may not carry user info or a query (put the key in the variable named by openai.api_key_env)")
	}
	switch {
	case o.Model == "":
		return fmt.Errorf("openai.model is required")
	case o.Temperature < 0 || o.Temperature > 2 || math.IsNaN(o.Temperature):
		return fmt.Errorf("openai.temperature: %v, want 0..2", o.Temperature)
	case !(o.TopP > 0 && o.TopP <= 1):
		return fmt.Errorf("openai.top_p: %v, want (0, 1]", o.TopP)
	case o.MaxTokens < 1:
		return fmt.Errorf("openai.max_tokens: %d, want >= 1", o.MaxTokens)
	case o.Timeout <= 0:
		return fmt.Errorf("openai.timeout: %v, want > 0", o.Timeout)
	case o.MaxConcurrency < 1:
		return fmt.Errorf("openai.max_concurrency: %d, want >= 1", o.MaxConcurrency)
	case o.RequestsPerMinute < 0 || math.IsNaN(o.RequestsPerMinute) || math.IsInf(o.RequestsPerMinute, 0):
		return fmt.Errorf("openai.requests_per_minute: %v, want >= 0 (0 = unlimited)", o.RequestsPerMinute)
	case o.MaxRetries < -1:
		return fmt.Errorf("openai.max_retries: %d, want >= -1 (-1 = no retries)", o.MaxRetries)
	case o.RetryBase < 0:
		return fmt.Errorf("openai.retry_base: %v, want >= 0", o.RetryBase)
	case o.RetryMax < o.RetryBase:
		return fmt.Errorf("openai.retry_max: %v, want >= openai.retry_base (%v)", o.RetryMax, o.RetryBase)
	case o.PromptTemplate != "" && !strings.Contains(o.PromptTemplate, "{query}"):
		return fmt.Errorf("openai.prompt_template: must contain {query}")
	}
	if strings.ContainsAny(o.APIKeyEnv, "= \t\n") {
		return fmt.Errorf("openai.api_key_env: %q is not an environment variable name", o.APIKeyEnv)
	}
	keys := make([]string, 0, len(o.Extra))
	for k := range o.Extra {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if use, ok := reservedExtra[k]; ok {
			if use != "" {
				return fmt.Errorf("openai.extra.%s: set by llmpool; use %s", k, use)
			}
			return fmt.Errorf("openai.extra.%s: set by llmpool and may not be overridden", k)
		}
	}
	if _, err := json.Marshal(o.Extra); err != nil {
		return fmt.Errorf("openai.extra: not JSON-encodable: %v", err)
	}
	return nil
}

func (s *SimConfig) validate() error {
	keys := make([]string, 0, len(s.Accuracy))
	for k := range s.Accuracy {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	seen := map[string]string{}
	for _, k := range keys {
		if v := s.Accuracy[k]; !(v >= 0 && v <= 1) {
			return fmt.Errorf("sim.accuracy.%s: %v, want a probability in [0, 1]", k, v)
		}
		if prev, ok := seen[strings.ToLower(k)]; ok {
			return fmt.Errorf("sim.accuracy.%s: duplicates sim.accuracy.%s (datasets match without case)", k, prev)
		}
		seen[strings.ToLower(k)] = k
	}
	switch {
	case !(s.DefaultAccuracy >= 0 && s.DefaultAccuracy <= 1):
		return fmt.Errorf("sim.default_accuracy: %v, want a probability in [0, 1]", s.DefaultAccuracy)
	case s.Latency < 0:
		return fmt.Errorf("sim.latency: %v, want >= 0", s.Latency)
	case s.TokensIn < 0:
		return fmt.Errorf("sim.tokens_in: %d, want >= 0 (0 = estimate)", s.TokensIn)
	case s.TokensOut < 0:
		return fmt.Errorf("sim.tokens_out: %d, want >= 0 (0 = estimate)", s.TokensOut)
	case !(s.FailureRate >= 0 && s.FailureRate <= 1):
		return fmt.Errorf("sim.failure_rate: %v, want a probability in [0, 1]", s.FailureRate)
	}
	return nil
}

// clone returns a deep copy of c, so that New's defaults never touch the
// caller's config.
func (c Config) clone() Config {
	c.Models = slices.Clone(c.Models)
	for i := range c.Models {
		m := &c.Models[i]
		if m.OpenAI != nil {
			o := *m.OpenAI
			if o.Seed != nil {
				s := *o.Seed
				o.Seed = &s
			}
			o.Extra = cloneJSONMap(o.Extra)
			m.OpenAI = &o
		}
		if m.Sim != nil {
			s := *m.Sim
			if s.Accuracy != nil {
				acc := make(map[string]float64, len(s.Accuracy))
				for k, v := range s.Accuracy {
					acc[k] = v
				}
				s.Accuracy = acc
			}
			m.Sim = &s
		}
		if m.Replay != nil {
			r := *m.Replay
			m.Replay = &r
		}
	}
	return c
}

// cloneJSONMap deep-copies a map through JSON; values that do not encode are
// kept as they are (Validate rejects them).
func cloneJSONMap(m Extra) Extra {
	if m == nil {
		return nil
	}
	b, err := json.Marshal(m)
	if err != nil {
		return m
	}
	var out Extra
	if err := json.Unmarshal(b, &out); err != nil {
		return m
	}
	return out
}
