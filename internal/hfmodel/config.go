// Package hfmodel reads and writes Hugging Face checkpoint folders for the
// Qwen2 architecture: config.json, generation_config.json and safetensors
// weights (single file or sharded with model.safetensors.index.json).
// It is pure Go; the tensors themselves are handed to libtorch by torchbridge.
package hfmodel

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"

	"github.com/recal-project/recal/internal/inputfile"
)

// Config holds the Qwen2Config fields recal uses. Unknown fields of a loaded
// config.json are kept in Extra and written back by Save.
type Config struct {
	Architectures         []string `json:"architectures"`
	ModelType             string   `json:"model_type"`
	VocabSize             int64    `json:"vocab_size"`
	HiddenSize            int64    `json:"hidden_size"`
	IntermediateSize      int64    `json:"intermediate_size"`
	NumHiddenLayers       int64    `json:"num_hidden_layers"`
	NumAttentionHeads     int64    `json:"num_attention_heads"`
	NumKeyValueHeads      int64    `json:"num_key_value_heads"`
	HeadDim               int64    `json:"head_dim,omitempty"`
	MaxPositionEmbeddings int64    `json:"max_position_embeddings"`
	RopeTheta             float64  `json:"rope_theta"`
	RMSNormEps            float64  `json:"rms_norm_eps"`
	TieWordEmbeddings     bool     `json:"tie_word_embeddings"`
	TorchDType            string   `json:"torch_dtype,omitempty"`
	BOSTokenID            *int64   `json:"bos_token_id,omitempty"`
	// EOSTokenIDs is config.json's eos_token_id, which may be an int or a list.
	EOSTokenIDs []int64 `json:"-"`

	Extra map[string]json.RawMessage `json:"-"`
}

// HeadDimension is head_dim when set, else hidden_size / num_attention_heads.
func (c *Config) HeadDimension() int64 {
	if c.HeadDim > 0 {
		return c.HeadDim
	}
	if c.NumAttentionHeads == 0 {
		return 0
	}
	return c.HiddenSize / c.NumAttentionHeads
}

// known lists the config.json keys decoded into Config's typed fields.
var known = map[string]bool{
	"architectures": true, "model_type": true, "vocab_size": true, "hidden_size": true, "intermediate_size": true,
	"num_hidden_layers": true, "num_attention_heads": true, "num_key_value_heads": true, "head_dim": true,
	"max_position_embeddings": true, "rope_theta": true, "rms_norm_eps": true, "tie_word_embeddings": true,
	"torch_dtype": true, "bos_token_id": true, "eos_token_id": true,
}

// ParseConfig decodes and validates a config.json; name is used in errors.
func ParseConfig(name string, b []byte) (*Config, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("hfmodel: %s: %w", name, err)
	}
	// Hugging Face defaults for optional fields (Qwen2Config).
	c := &Config{RopeTheta: 10000, RMSNormEps: 1e-6, MaxPositionEmbeddings: 32768}
	if err := json.Unmarshal(b, c); err != nil {
		return nil, fmt.Errorf("hfmodel: %s: %w", name, err)
	}
	for _, f := range []string{"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"} {
		if _, ok := raw[f]; !ok {
			return nil, fmt.Errorf("hfmodel: %s: required field %q is missing", name, f)
		}
	}
	if _, ok := raw["num_key_value_heads"]; !ok || string(raw["num_key_value_heads"]) == "null" {
		c.NumKeyValueHeads = c.NumAttentionHeads
	}
	if eos, ok := raw["eos_token_id"]; ok && string(eos) != "null" {
		ids, err := intOrList(eos)
		if err != nil {
			return nil, fmt.Errorf("hfmodel: %s: field \"eos_token_id\": %w", name, err)
		}
		c.EOSTokenIDs = ids
	}
	qwen2 := c.ModelType == "qwen2"
	for _, a := range c.Architectures {
		qwen2 = qwen2 || a == "Qwen2ForCausalLM"
	}
	if !qwen2 {
		return nil, fmt.Errorf("hfmodel: %s: unsupported architecture (model_type %q, architectures %v); recal runs Qwen2 (Qwen2ForCausalLM)", name, c.ModelType, c.Architectures)
	}
	if rs, ok := raw["rope_scaling"]; ok && string(rs) != "null" {
		return nil, fmt.Errorf("hfmodel: %s: field \"rope_scaling\" is set (%s); only plain rotary embeddings are supported", name, rs)
	}
	if sw, ok := raw["use_sliding_window"]; ok && string(sw) == "true" {
		return nil, fmt.Errorf("hfmodel: %s: field \"use_sliding_window\" is true; sliding-window attention is not supported", name)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("hfmodel: %s: %w", name, err)
	}
	c.Extra = map[string]json.RawMessage{}
	for k, v := range raw {
		if !known[k] {
			c.Extra[k] = v
		}
	}
	return c, nil
}

// limits bound each size of a config.json well past the largest models
// (Qwen2.5-72B: 80 layers, hidden 8192, 152,064 ids), so that a hostile
// file is refused before anything is sized by it: 10^6 layers would make
// the list of parameter names alone take gigabytes.
var limits = map[string]int64{
	"vocab_size": 1 << 22, "hidden_size": 1 << 16, "intermediate_size": 1 << 18,
	"num_hidden_layers": 1 << 10, "num_attention_heads": 1 << 10, "num_key_value_heads": 1 << 10,
	"max_position_embeddings": 1 << 24, "head_dim": 1 << 12,
}

// Validate checks the sizes for consistency and against sane limits.
func (c *Config) Validate() error {
	pos := []struct {
		name string
		v    int64
	}{
		{"vocab_size", c.VocabSize}, {"hidden_size", c.HiddenSize}, {"intermediate_size", c.IntermediateSize},
		{"num_hidden_layers", c.NumHiddenLayers}, {"num_attention_heads", c.NumAttentionHeads},
		{"num_key_value_heads", c.NumKeyValueHeads}, {"max_position_embeddings", c.MaxPositionEmbeddings},
	}
	for _, f := range pos {
		if f.v <= 0 {
			return fmt.Errorf("field %q must be positive, got %d", f.name, f.v)
		}
		if f.v > limits[f.name] {
			return fmt.Errorf("field %q = %d: more than %d, past any Qwen2 model; the file is corrupt or hostile", f.name, f.v, limits[f.name])
		}
	}
	if c.HeadDim > limits["head_dim"] {
		return fmt.Errorf("field \"head_dim\" = %d: more than %d, past any Qwen2 model; the file is corrupt or hostile", c.HeadDim, limits["head_dim"])
	}
	if c.HeadDim < 0 {
		return fmt.Errorf("field \"head_dim\" must be positive (or absent), got %d", c.HeadDim)
	}
	// The weight matrices' byte counts (float32) must fit int64: sizes from
	// a hostile config.json must not overflow the shapes built from them.
	hd := c.HeadDimension()
	for _, m := range []struct {
		a, b   string
		va, vb int64
	}{
		{"vocab_size", "hidden_size", c.VocabSize, c.HiddenSize}, {"intermediate_size", "hidden_size", c.IntermediateSize, c.HiddenSize},
		{"num_attention_heads", "head dimension", c.NumAttentionHeads, hd}, {"num_key_value_heads", "head dimension", c.NumKeyValueHeads, hd},
		{"num_hidden_layers", "hidden_size", c.NumHiddenLayers, c.HiddenSize}, {"max_position_embeddings", "head dimension", c.MaxPositionEmbeddings, hd},
	} {
		if m.vb > 0 && m.va > math.MaxInt64/4/m.vb {
			return fmt.Errorf("fields %q (%d) × %q (%d): too large, a float32 matrix of that size has more than 2^63 bytes", m.a, m.va, m.b, m.vb)
		}
	}
	if c.NumAttentionHeads%c.NumKeyValueHeads != 0 {
		return fmt.Errorf("field \"num_attention_heads\" (%d) must be a multiple of \"num_key_value_heads\" (%d)", c.NumAttentionHeads, c.NumKeyValueHeads)
	}
	if c.HeadDim == 0 && c.HiddenSize%c.NumAttentionHeads != 0 {
		return fmt.Errorf("field \"hidden_size\" (%d) must be a multiple of \"num_attention_heads\" (%d)", c.HiddenSize, c.NumAttentionHeads)
	}
	if c.HeadDimension()%2 != 0 {
		return fmt.Errorf("head dimension %d must be even", c.HeadDimension())
	}
	if c.RopeTheta <= 0 || c.RMSNormEps <= 0 {
		return errors.New("fields \"rope_theta\" and \"rms_norm_eps\" must be positive")
	}
	return nil
}

func intOrList(b json.RawMessage) ([]int64, error) {
	var one int64
	if err := json.Unmarshal(b, &one); err == nil {
		return []int64{one}, nil
	}
	var many []int64
	if err := json.Unmarshal(b, &many); err != nil {
		return nil, fmt.Errorf("want an integer or a list of integers, got %s", b)
	}
	return many, nil
}

// MarshalJSON writes the typed fields plus Extra, keys sorted.
func (c *Config) MarshalJSON() ([]byte, error) {
	type plain Config
	b, err := json.Marshal((*plain)(c))
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	for k, v := range c.Extra {
		if !known[k] {
			m[k] = v
		}
	}
	switch len(c.EOSTokenIDs) {
	case 0:
	case 1:
		m["eos_token_id"], _ = json.Marshal(c.EOSTokenIDs[0])
	default:
		m["eos_token_id"], _ = json.Marshal(c.EOSTokenIDs)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := []byte("{\n")
	for i, k := range keys {
		kb, _ := json.Marshal(k)
		out = append(out, "  "...)
		out = append(out, kb...)
		out = append(out, ": "...)
		out = append(out, m[k]...)
		if i < len(keys)-1 {
			out = append(out, ',')
		}
		out = append(out, '\n')
	}
	return append(out, "}\n"...), nil
}

// LoadConfig reads dir/config.json.
func LoadConfig(dir string) (*Config, error) {
	path := filepath.Join(dir, "config.json")
	b, err := inputfile.ReadFile(path, inputfile.ConfigLimit)
	if err != nil {
		return nil, fmt.Errorf("hfmodel: %w", err)
	}
	return ParseConfig(path, b)
}

// EOS returns the end-of-sequence ids of a checkpoint: generation_config.json's
// eos_token_id when present, else config.json's.
func EOS(dir string, c *Config) ([]int64, error) {
	path := filepath.Join(dir, "generation_config.json")
	b, err := inputfile.ReadFile(path, inputfile.ConfigLimit)
	if errors.Is(err, os.ErrNotExist) {
		return c.EOSTokenIDs, nil
	}
	if err != nil {
		return nil, fmt.Errorf("hfmodel: %w", err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("hfmodel: %s: %w", path, err)
	}
	eos, ok := raw["eos_token_id"]
	if !ok || string(eos) == "null" {
		return c.EOSTokenIDs, nil
	}
	ids, err := intOrList(eos)
	if err != nil {
		return nil, fmt.Errorf("hfmodel: %s: field \"eos_token_id\": %w", path, err)
	}
	return ids, nil
}

// Presets are the Qwen2-architecture shapes `recal policy init` can create.
// All use the vocabulary size they are given (Qwen2.5's by default) and tie
// the output head to the embedding, as Qwen2.5-0.5B and -3B do. tiny and
// small are the offline default's sizes; qwen2.5-0.5b and qwen2.5-3b are
// those models' shapes (random weights), for measuring memory and speed at
// the paper's scale.
var Presets = map[string]Config{
	"tiny":         {HiddenSize: 128, IntermediateSize: 384, NumHiddenLayers: 2, NumAttentionHeads: 4, NumKeyValueHeads: 2},
	"small":        {HiddenSize: 256, IntermediateSize: 768, NumHiddenLayers: 4, NumAttentionHeads: 8, NumKeyValueHeads: 2},
	"qwen2.5-0.5b": {HiddenSize: 896, IntermediateSize: 4864, NumHiddenLayers: 24, NumAttentionHeads: 14, NumKeyValueHeads: 2},
	"qwen2.5-3b":   {HiddenSize: 2048, IntermediateSize: 11008, NumHiddenLayers: 36, NumAttentionHeads: 16, NumKeyValueHeads: 2},
}

// Preset returns the full config of a preset for a vocabulary of vocab ids.
func Preset(name string, vocab int64) (*Config, error) {
	p, ok := Presets[name]
	if !ok {
		names := make([]string, 0, len(Presets))
		for k := range Presets {
			names = append(names, k)
		}
		sort.Strings(names)
		return nil, fmt.Errorf("hfmodel: unknown preset %q (known: %v)", name, names)
	}
	c := p
	c.Architectures = []string{"Qwen2ForCausalLM"}
	c.ModelType = "qwen2"
	c.VocabSize = vocab
	c.MaxPositionEmbeddings = 4096
	c.RopeTheta = 1e6
	c.RMSNormEps = 1e-6
	c.TieWordEmbeddings = true
	return &c, c.Validate()
}
