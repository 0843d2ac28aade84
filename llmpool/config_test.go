package llmpool

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
)

const exampleTOML = `
[pool]
cache = "off"
cache_dir = "cache/pool"
max_concurrency = 16

[[pool.models]]
name = "Qwen2.5-7B-Instruct"
description = "Qwen2.5-7B-Instruct: a 7B general model."
price_in = 0.3
price_out = 0.3
provider = "openai"
  [pool.models.openai]
  base_url = "https://integrate.api.nvidia.com/v1"
  model = "qwen/qwen2.5-7b-instruct"
  api_key_env = "RECAL_TEST_NIM_KEY"
  seed = 42
  timeout = "1m30s"
  requests_per_minute = 40
  max_retries = -1
  extra = { provider = { sort = "price" }, top_k = 5 }

[[pool.models]]
name = "sim-llama"
description = "A simulated model."
provider = "sim"
  [pool.models.sim]
  accuracy = { nq = 0.6, hotpotqa = 0.3 }
  default_accuracy = 0.3
  latency = "300ms"
  tokens_out = 40
  seed = 3
`

func TestConfigFromTOML(t *testing.T) {
	var wrapper struct {
		Pool Config `toml:"pool"`
	}
	md, err := toml.Decode(exampleTOML, &wrapper)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	if un := md.Undecoded(); len(un) != 0 {
		t.Fatalf("undecoded keys %v, want every documented key to map to a field", un)
	}
	cfg := wrapper.Pool
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v, want the documented example to be valid", err)
	}
	o, s := cfg.Models[0].OpenAI, cfg.Models[1].Sim
	if o.Timeout != 90*time.Second || *o.Seed != 42 || o.RequestsPerMinute != 40 || o.retries() != 0 ||
		o.TopP != 1 || o.MaxTokens != 512 || o.MaxConcurrency != 8 || o.Temperature != 0 {
		t.Errorf("openai section %+v, want the TOML values and defaults top_p 1, max_tokens 512, max_concurrency 8", o)
	}
	if s.Accuracy["nq"] != 0.6 || s.Latency != 300*time.Millisecond || s.TokensOut != 40 || s.Seed != 3 {
		t.Errorf("sim section %+v, want the TOML values", s)
	}
	t.Setenv("RECAL_TEST_NIM_KEY", "nvapi-test")
	p, err := New(wrapper.Pool)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer p.Close()
	if r := p.Call(context.Background(), Request{Model: "SIM-LLAMA", Query: "q"}); r.Failed || r.Latency < 300*time.Millisecond {
		t.Errorf("sim call %+v, want a reply after the configured 300ms", r)
	}
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	d := Defaults()
	if d.Cache != CacheReadWrite || d.CacheDir != "cache/pool" || d.MaxConcurrency != 32 || d.MaxQueryChars != 4000 || d.FailureText != DefaultFailureText {
		t.Errorf("Defaults() = %+v, want read-write, cache/pool, 32, 4000 and the default failure text", d)
	}
	cfg := Config{Cache: CacheOff, Models: []ModelConfig{{Name: "x", Description: "d", Provider: "openai", OpenAI: &OpenAIConfig{BaseURL: "http://h/v1", Model: "m"}}}}
	p, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v, want a minimal openai model to be valid with defaults", err)
	}
	p.Close()
	if cfg.CacheDir != "" || cfg.MaxConcurrency != 0 || cfg.Models[0].OpenAI.MaxTokens != 0 {
		t.Errorf("New changed the caller's config: %+v / %+v, want it untouched", cfg, cfg.Models[0].OpenAI)
	}
}

func TestValidateNamesTheEntryAndKey(t *testing.T) {
	t.Parallel()
	good := func() Config {
		return Config{Cache: CacheOff, Models: []ModelConfig{
			simModel("qwen", SimConfig{}),
			simModel("mistral", SimConfig{}),
			openaiModel("llama-70b", "https://integrate.api.nvidia.com/v1", nil),
		}}
	}
	tests := []struct {
		name   string
		modify func(c *Config)
		want   string
	}{
		{name: "missing base_url", modify: func(c *Config) { c.Models[2].OpenAI.BaseURL = "" },
			want: `llmpool: pool.models[2] ("llama-70b"): openai.base_url is required`},
		{name: "missing openai section", modify: func(c *Config) { c.Models[2].OpenAI = nil },
			want: `llmpool: pool.models[2] ("llama-70b"): openai.base_url is required`},
		{name: "bad base_url", modify: func(c *Config) { c.Models[2].OpenAI.BaseURL = "integrate.api.nvidia.com" },
			want: `pool.models[2] ("llama-70b"): openai.base_url: want an http or https URL`},
		{name: "key in base_url", modify: func(c *Config) { c.Models[2].OpenAI.BaseURL = "https://h/v1?key=secret" },
			want: `openai.base_url: may not carry user info or a query`},
		{name: "missing model id", modify: func(c *Config) { c.Models[2].OpenAI.Model = "" },
			want: `pool.models[2] ("llama-70b"): openai.model is required`},
		{name: "bad top_p", modify: func(c *Config) { c.Models[2].OpenAI.TopP = 1.5 }, want: `openai.top_p: 1.5`},
		{name: "bad temperature", modify: func(c *Config) { c.Models[2].OpenAI.Temperature = -1 }, want: `openai.temperature: -1`},
		{name: "negative rpm", modify: func(c *Config) { c.Models[2].OpenAI.RequestsPerMinute = -5 }, want: `openai.requests_per_minute`},
		{name: "bad max_retries", modify: func(c *Config) { c.Models[2].OpenAI.MaxRetries = -2 }, want: `openai.max_retries: -2`},
		{name: "template without query", modify: func(c *Config) { c.Models[2].OpenAI.PromptTemplate = "hi" }, want: `openai.prompt_template`},
		{name: "reserved extra", modify: func(c *Config) { c.Models[2].OpenAI.Extra = map[string]any{"max_tokens": 9} },
			want: `pool.models[2] ("llama-70b"): openai.extra.max_tokens: set by llmpool; use openai.max_tokens`},
		{name: "messages in extra", modify: func(c *Config) { c.Models[2].OpenAI.Extra = map[string]any{"messages": 1} }, want: `openai.extra.messages`},
		{name: "unknown provider", modify: func(c *Config) { c.Models[1].Provider = "anthropic" },
			want: `llmpool: pool.models[1] ("mistral"): provider "anthropic" is unknown (known: openai, replay, sim)`},
		{name: "section of another provider", modify: func(c *Config) { c.Models[0].OpenAI = &OpenAIConfig{} },
			want: `pool.models[0] ("qwen"): an openai section is given but provider is "sim"`},
		{name: "empty name", modify: func(c *Config) { c.Models[1].Name = "" }, want: `pool.models[1] (""): name is required`},
		{name: "colon in name", modify: func(c *Config) { c.Models[1].Name = "a:b" }, want: `pool.models[1] ("a:b"): name may not contain ':'`},
		{name: "duplicate name", modify: func(c *Config) { c.Models[1].Name = "QWEN" },
			want: `pool.models[1] ("QWEN"): name duplicates pool.models[0]`},
		{name: "no description", modify: func(c *Config) { c.Models[0].Description = " " }, want: `pool.models[0] ("qwen"): description is required`},
		{name: "negative price", modify: func(c *Config) { c.Models[0].PriceOut = -1 }, want: `pool.models[0] ("qwen"): price_out: -1`},
		{name: "bad accuracy", modify: func(c *Config) { c.Models[1].Sim.Accuracy = map[string]float64{"nq": 1.2} },
			want: `pool.models[1] ("mistral"): sim.accuracy.nq: 1.2`},
		{name: "accuracy keys differing in case", modify: func(c *Config) { c.Models[1].Sim.Accuracy = map[string]float64{"nq": 0.1, "NQ": 0.2} },
			want: `sim.accuracy.nq: duplicates sim.accuracy.NQ`},
		{name: "bad failure rate", modify: func(c *Config) { c.Models[1].Sim.FailureRate = 2 }, want: `sim.failure_rate: 2`},
		{name: "bad cache mode", modify: func(c *Config) { c.Cache = "sometimes" }, want: `llmpool: pool.cache: "sometimes"`},
		{name: "no models", modify: func(c *Config) { c.Models = nil }, want: `pool.models: at least one model is required`},
		{name: "bad max_concurrency", modify: func(c *Config) { c.MaxConcurrency = -1 }, want: `pool.max_concurrency: -1`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := good()
			tc.modify(&c)
			c.SetDefaults()
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate() = %v, want an error containing %q", err, tc.want)
			}
			if _, nerr := New(c); nerr == nil {
				t.Errorf("New accepted the config, want the validation error")
			}
		})
	}
	c := good()
	c.SetDefaults()
	if err := c.Validate(); err != nil {
		t.Errorf("the unmodified config is invalid: %v", err)
	}
}

func TestMissingAPIKeyEnvFailsAtConstruction(t *testing.T) {
	t.Parallel()
	cfg := testConfig(openaiModel("x", "https://integrate.api.nvidia.com/v1", func(o *OpenAIConfig) { o.APIKeyEnv = "RECAL_TEST_UNSET_NIM_API_KEY" }))
	_, err := New(cfg)
	want := `llmpool: pool.models[0] ("x"): environment variable RECAL_TEST_UNSET_NIM_API_KEY (api_key_env) is not set`
	if err == nil || err.Error() != want {
		t.Errorf("New() error = %v, want %q", err, want)
	}
	if _, err := New(cfg, withEnv("RECAL_TEST_UNSET_NIM_API_KEY", "  ")); err == nil {
		t.Error("New with a blank key succeeded, want the same error")
	}
}

// Identities (baselines.PoolIdentity, eval's results keys) hash a pool's
// models as JSON: a model without a replay section must encode as it did
// before the replay provider existed, or every outcome folder and eval
// result made before would be set aside as another pool's.
func TestModelConfigJSONWithoutReplay(t *testing.T) {
	for _, c := range []struct {
		m    ModelConfig
		want bool
	}{
		{ModelConfig{Name: "a", Provider: "sim", Sim: &SimConfig{}}, false},
		{ModelConfig{Name: "b", Provider: "replay", Replay: &ReplayConfig{Log: "x.jsonl"}}, true},
	} {
		b, err := json.Marshal(c.m)
		if err != nil {
			t.Fatal(err)
		}
		if got := bytes.Contains(b, []byte(`"Replay"`)); got != c.want {
			t.Errorf("%s: JSON %s holds Replay: %v, want %v", c.m.Name, b, got, c.want)
		}
	}
}
