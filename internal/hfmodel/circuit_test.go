package hfmodel

import (
	"fmt"
	"strings"
	"testing"
)

// weightsFor makes zero-filled tensors of every weight of c.
func weightsFor(c *Config) map[string][]float32 {
	H, hd := int(c.HiddenSize), int(c.HiddenSize/c.NumAttentionHeads)
	nh, nkv, I, V := int(c.NumAttentionHeads), int(c.NumKeyValueHeads), int(c.IntermediateSize), int(c.VocabSize)
	w := map[string][]float32{"model.embed_tokens.weight": make([]float32, V*H), "model.norm.weight": make([]float32, H)}
	if !c.TieWordEmbeddings {
		w["lm_head.weight"] = make([]float32, V*H)
	}
	for l := range int(c.NumHiddenLayers) {
		p := fmt.Sprintf("model.layers.%d.", l)
		for n, size := range map[string]int{"self_attn.q_proj.weight": nh * hd * H, "self_attn.q_proj.bias": nh * hd,
			"self_attn.k_proj.weight": nkv * hd * H, "self_attn.k_proj.bias": nkv * hd, "self_attn.v_proj.weight": nkv * hd * H,
			"self_attn.v_proj.bias": nkv * hd, "self_attn.o_proj.weight": H * nh * hd, "mlp.gate_proj.weight": I * H,
			"mlp.up_proj.weight": I * H, "mlp.down_proj.weight": H * I, "input_layernorm.weight": H, "post_attention_layernorm.weight": H} {
			w[p+n] = make([]float32, size)
		}
	}
	return w
}

func TestCopyCircuitErrors(t *testing.T) {
	tiny, err := Preset("tiny", 512)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		edit func(c *Config, w map[string][]float32)
		want string // "" = no error
	}{
		{"tiny", func(*Config, map[string][]float32) {}, ""},
		{"one layer", func(c *Config, _ map[string][]float32) { c.NumHiddenLayers = 1 }, "needs 2 layers"},
		{"small heads", func(c *Config, _ map[string][]float32) { c.NumAttentionHeads, c.NumKeyValueHeads = 8, 4 }, "head size of at least 32"},
		{"too many kv heads", func(c *Config, _ map[string][]float32) { c.NumKeyValueHeads = 4 }, "at most half the hidden size"},
		{"bad head counts", func(c *Config, _ map[string][]float32) { c.NumKeyValueHeads = 3 }, "bad head counts"},
		{"missing tensor", func(_ *Config, w map[string][]float32) { delete(w, "model.layers.1.self_attn.k_proj.bias") }, `no tensor "model.layers.1.self_attn.k_proj.bias"`},
		{"wrong size", func(_ *Config, w map[string][]float32) {
			w["model.embed_tokens.weight"] = w["model.embed_tokens.weight"][:10]
		}, "has 10 values"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := *tiny
			w := weightsFor(&c)
			tc.edit(&c, w)
			err := CopyCircuit(&c, w, 1)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestCopyCircuitUntied checks that an untied output head gets the new
// embedding (the circuit's output is read through it) and that the
// embedding leaves the previous-token part of the stream empty.
func TestCopyCircuitUntied(t *testing.T) {
	c, err := Preset("tiny", 256)
	if err != nil {
		t.Fatal(err)
	}
	c.TieWordEmbeddings = false
	w := weightsFor(c)
	if err := CopyCircuit(c, w, 7); err != nil {
		t.Fatal(err)
	}
	emb, head := w["model.embed_tokens.weight"], w["lm_head.weight"]
	H, A := int(c.HiddenSize), int(c.HiddenSize-c.NumKeyValueHeads*(c.HiddenSize/c.NumAttentionHeads))
	nonzero := 0
	for i := range emb {
		if emb[i] != head[i] {
			t.Fatalf("lm_head[%d] = %g, embedding %g", i, head[i], emb[i])
		}
		if i%H >= A && emb[i] != 0 {
			t.Fatalf("embedding value %d (dimension %d ≥ %d) is %g, want 0", i, i%H, A, emb[i])
		}
		if emb[i] != 0 {
			nonzero++
		}
	}
	if nonzero < len(emb)/3 {
		t.Fatalf("only %d of %d embedding values are set", nonzero, len(emb))
	}
}
