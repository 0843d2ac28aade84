package preflight

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/llmpool"
	"github.com/recal-project/recal/router"
)

// tinyCheckpoint writes a checkpoint folder of the tiny preset (config.json
// and model.safetensors, every weight 0.5 in float32, no tokenizer) with
// the checksums recal writes, after edit has changed its config.json's
// fields.
func tinyCheckpoint(t *testing.T, edit func(map[string]any)) string {
	t.Helper()
	dir := t.TempDir()
	c, err := hfmodel.Preset("tiny", 64)
	if err != nil {
		t.Fatal(err)
	}
	var specs []hfmodel.TensorSpec
	for _, p := range c.Params() {
		specs = append(specs, hfmodel.TensorSpec{Name: p.Name, DType: "F32", Shape: p.Shape})
	}
	err = hfmodel.WriteSafetensors(filepath.Join(dir, "model.safetensors"), specs, nil, func(_ int, buf []byte) error {
		for i := 0; i < len(buf); i += 4 {
			copy(buf[i:], []byte{0, 0, 0, 0x3f})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := c.MarshalJSON()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(m)
	}
	b, _ = json.Marshal(m)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := hfmodel.WriteChecksums(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// A hostile checkpoint is refused by the dry run with a few lines naming
// what is wrong, the same checks the loader makes before allocating: a
// config.json claiming a thousand layers gives 10 lines and a count, not
// one line per missing tensor; a NaN in the weights and a byte changed
// since recal wrote the folder are named.
func TestPolicyHostile(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(map[string]any)
		harm  func(t *testing.T, dir string)
		want  []string
		lines int // the most problem lines
	}{
		{name: "a thousand layers", edit: func(m map[string]any) { m["num_hidden_layers"] = 1000 },
			want:  []string{`tensor "model.layers.2.input_layernorm.weight" is missing from the weights`, "… and 11966 more tensors"},
			lines: 11},
		{name: "hidden size 2^20", edit: func(m map[string]any) { m["hidden_size"] = 1 << 20 },
			want: []string{`field "hidden_size" = 1048576: more than 65536`}, lines: 1},
		{name: "a NaN in the weights", harm: func(t *testing.T, dir string) {
			poke(t, filepath.Join(dir, "model.safetensors"), math.Float32bits(float32(math.NaN())))
			if err := hfmodel.WriteChecksums(dir); err != nil { // a NaN recal's own checksums vouch for
				t.Fatal(err)
			}
		}, want: []string{`tensor "model.embed_tokens.weight": element 0 is NaN or infinite`}, lines: 1},
		{name: "a changed byte", harm: func(t *testing.T, dir string) {
			poke(t, filepath.Join(dir, "model.safetensors"), math.Float32bits(0.25))
		}, want: []string{"model.safetensors: SHA-256 ", "the file is corrupt"}, lines: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := tinyCheckpoint(t, tc.edit)
			if tc.harm != nil {
				tc.harm(t, dir)
			}
			c := New("serve")
			c.Policy("policy.checkpoint", dir)
			var got []string
			for _, p := range c.Problems() {
				if !strings.Contains(p, "tokenizer") { // the folder has none
					got = append(got, p)
				}
			}
			all := strings.Join(got, "\n")
			for _, w := range tc.want {
				if !strings.Contains(all, w) {
					t.Errorf("problems:\n%s\nwant one containing %q", all, w)
				}
			}
			if len(got) == 0 || len(got) > tc.lines {
				t.Errorf("%d problem lines, want 1 to %d (a hostile file must not print a line per tensor):\n%s", len(got), tc.lines, all)
			}
		})
	}
}

// poke overwrites the first float32 of the data of a safetensors file.
func poke(t *testing.T, path string, bits uint32) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := int(b[0]) | int(b[1])<<8 | int(b[2])<<16
	at := 8 + n
	b[at], b[at+1], b[at+2], b[at+3] = byte(bits), byte(bits>>8), byte(bits>>16), byte(bits>>24)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// A key variable that cannot work is a problem of the dry run saying why:
// an empty one is not "not set", and a line break in a key would make every
// call fail after a clean dry run.
func TestPoolKeyHostile(t *testing.T) {
	for _, tc := range []struct{ value, want string }{
		{"", "environment variable RECAL_TEST_KEY (api_key_env) is set but empty (the key of m)"},
		{"sk-1\r\nX: y", "environment variable RECAL_TEST_KEY (api_key_env) holds a control character"},
	} {
		t.Setenv("RECAL_TEST_KEY", tc.value)
		c := New("collect")
		pc := llmpool.Config{Models: []llmpool.ModelConfig{{Name: "m", Provider: "openai",
			OpenAI: &llmpool.OpenAIConfig{Model: "x", BaseURL: "http://127.0.0.1:1", APIKeyEnv: "RECAL_TEST_KEY"}}}, Cache: llmpool.CacheOff}
		c.Pool(pc, router.Config{PromptTemplate: "../../../../router/prompt.tmpl", MaxTurns: 4})
		if got := strings.Join(c.Problems(), "\n"); !strings.Contains(got, tc.want) {
			t.Errorf("key %q: problems %q, want one containing %q", tc.value, got, tc.want)
		}
	}
}
