// Package config is recal's one typed configuration, mirrored by recal.toml.
// Defaults live in Default; Load reads a TOML file strictly (an unknown key is
// an error naming it), applies --set overrides by dotted key, and validates.
package config

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/BurntSushi/toml"
)

// Config is the whole configuration.
type Config struct {
	Policy Policy `toml:"policy"`
}

// Policy says which checkpoint the routing policy starts from and where it runs.
type Policy struct {
	// Checkpoint is the Hugging Face folder (config.json, model.safetensors,
	// tokenizer.json) the policy is loaded from. Relative paths are resolved
	// against the config file's folder.
	Checkpoint string `toml:"checkpoint"`
	// Device is "cpu", "cuda" or "cuda:N" (cuda needs a CUDA libtorch, see LIBTORCH).
	Device string `toml:"device"`
	// DType is the parameter and compute precision: "float32" or "bfloat16".
	DType string `toml:"dtype"`
	// Threads is the number of CPU threads libtorch uses (0 = all cores).
	Threads int `toml:"threads"`
}

// Default returns the configuration every file starts from.
func Default() Config {
	return Config{
		Policy: Policy{Checkpoint: "runs/init/tiny", Device: "cpu", DType: "float32"},
	}
}

// Load reads path over the defaults, applies sets ("key.sub=value", TOML
// values; bare words are strings) and validates. Relative paths in the file
// are resolved against its folder.
func Load(path string, sets []string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	cfg, err := Parse(path, b, sets)
	if err != nil {
		return Config{}, err
	}
	cfg.resolve(filepath.Dir(path))
	return cfg, nil
}

// Parse decodes TOML text (name is used in errors) with overrides.
func Parse(name string, text []byte, sets []string) (Config, error) {
	tree := map[string]any{}
	if _, err := toml.Decode(string(text), &tree); err != nil {
		return Config{}, fmt.Errorf("config: %s: %w", name, err)
	}
	for _, s := range sets {
		if err := applySet(tree, s); err != nil {
			return Config{}, fmt.Errorf("config: --set %s: %w", s, err)
		}
	}
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(tree); err != nil {
		return Config{}, fmt.Errorf("config: %s: %w", name, err)
	}
	cfg := Default()
	md, err := toml.Decode(buf.String(), &cfg)
	if err != nil {
		return Config{}, fmt.Errorf("config: %s: %w", name, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		sort.Strings(keys)
		return Config{}, fmt.Errorf("config: %s: unknown key %q", name, keys[0])
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, fmt.Errorf("config: %s: %w", name, err)
	}
	return cfg, nil
}

// applySet sets a dotted key in the decoded tree. The value is parsed as a
// TOML value; if that fails it is taken as a string.
func applySet(tree map[string]any, set string) error {
	key, val, ok := strings.Cut(set, "=")
	key = strings.TrimSpace(key)
	if !ok || key == "" {
		return fmt.Errorf("want key=value")
	}
	var v map[string]any
	if _, err := toml.Decode("v = "+val, &v); err != nil {
		v = map[string]any{"v": val}
	}
	parts := strings.Split(key, ".")
	node := tree
	for _, p := range parts[:len(parts)-1] {
		next, ok := node[p].(map[string]any)
		if !ok {
			if _, exists := node[p]; exists {
				return fmt.Errorf("key %q is not a table", p)
			}
			next = map[string]any{}
			node[p] = next
		}
		node = next
	}
	node[parts[len(parts)-1]] = v["v"]
	return nil
}

// Validate checks every field, naming the bad key.
func (c *Config) Validate() error {
	switch c.Policy.DType {
	case "float32", "bfloat16":
	default:
		return fmt.Errorf("policy.dtype = %q: want \"float32\" or \"bfloat16\"", c.Policy.DType)
	}
	if c.Policy.Device != "cpu" && c.Policy.Device != "cuda" && !strings.HasPrefix(c.Policy.Device, "cuda:") {
		return fmt.Errorf("policy.device = %q: want \"cpu\", \"cuda\" or \"cuda:N\"", c.Policy.Device)
	}
	if c.Policy.Threads < 0 {
		return fmt.Errorf("policy.threads = %d: must be ≥ 0", c.Policy.Threads)
	}
	if c.Policy.Checkpoint == "" {
		return fmt.Errorf("policy.checkpoint is empty")
	}
	return nil
}

func (c *Config) resolve(dir string) {
	if c.Policy.Checkpoint != "" && !filepath.IsAbs(c.Policy.Checkpoint) {
		c.Policy.Checkpoint = filepath.Join(dir, c.Policy.Checkpoint)
	}
}

// Write encodes the resolved configuration (every key) as TOML.
func (c *Config) Write(path string) error {
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(c); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}
