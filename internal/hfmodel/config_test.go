package hfmodel

import (
	"strings"
	"testing"
)

func TestParseConfigRefusesBadSizes(t *testing.T) {
	const base = `"model_type":"qwen2","intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2`
	for _, tc := range []struct {
		name, json, want string
	}{
		{"negative head_dim", `{` + base + `,"vocab_size":8,"hidden_size":8,"head_dim":-2}`, `field "head_dim" must be positive (or absent), got -2`},
		{"matrix past int64", `{` + base + `,"vocab_size":4611686018427387904,"hidden_size":8}`, `field "vocab_size" = 4611686018427387904: more than 4194304`},
		{"head past int64", `{` + base + `,"vocab_size":8,"hidden_size":8,"head_dim":4611686018427387904}`, `field "head_dim" = 4611686018427387904: more than 4096`},
		// Sizes that fit int64 but no machine: refused before the list of
		// parameters (12 names a layer) or any tensor is sized by them.
		{"a million layers", `{"model_type":"qwen2","intermediate_size":8,"num_hidden_layers":1000000,"num_attention_heads":2,"vocab_size":8,"hidden_size":8}`,
			`field "num_hidden_layers" = 1000000: more than 1024`},
		{"hidden size 2^20", `{` + base + `,"vocab_size":8,"hidden_size":1048576}`, `field "hidden_size" = 1048576: more than 65536`},
		{"context 2^40", `{` + base + `,"vocab_size":8,"hidden_size":8,"max_position_embeddings":1099511627776}`, `field "max_position_embeddings" = 1099511627776: more than`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfig("config.json", []byte(tc.json))
			if err == nil {
				t.Fatalf("ParseConfig(%s) = %+v; want an error containing %q", tc.json, c, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "hfmodel: config.json: ") {
				t.Fatalf("error %q; want it to name config.json and contain %q", err, tc.want)
			}
		})
	}
	ok := `{` + base + `,"vocab_size":151936,"hidden_size":2048,"max_position_embeddings":131072}`
	if _, err := ParseConfig("config.json", []byte(ok)); err != nil {
		t.Fatalf("ParseConfig of a real-sized config: %v; want no error", err)
	}
}
