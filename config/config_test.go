package config

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	base := "[policy]\ncheckpoint = \"ck\"\ndevice = \"cpu\"\n"
	cases := []struct {
		name    string
		text    string
		sets    []string
		wantErr string
		check   func(Config) bool
	}{
		{name: "defaults fill the rest", text: base, check: func(c Config) bool { return c.Policy.DType == "float32" }},
		{name: "set overrides", text: base, sets: []string{"policy.dtype=bfloat16", "policy.threads=3"},
			check: func(c Config) bool { return c.Policy.DType == "bfloat16" && c.Policy.Threads == 3 }},
		{name: "set adds an absent known key", text: "", sets: []string{"policy.checkpoint=elsewhere"},
			check: func(c Config) bool { return c.Policy.Checkpoint == "elsewhere" }},
		{name: "unknown key in file", text: base + "dtyp = \"x\"\n", wantErr: `unknown key "policy.dtyp"`},
		{name: "unknown section", text: "[polcy]\ndevice = \"cpu\"\n", wantErr: `unknown key "polcy`},
		{name: "unknown key by set", text: base, sets: []string{"policy.nope=1"}, wantErr: `unknown key "policy.nope"`},
		{name: "wrong type", text: "[policy]\nthreads = \"many\"\n", wantErr: "threads"},
		{name: "bad value", text: base, sets: []string{"policy.dtype=float16"}, wantErr: "policy.dtype"},
		{name: "malformed set", text: base, sets: []string{"policy.dtype"}, wantErr: "key=value"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := Parse("test.toml", []byte(c.text), c.sets)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !c.check(cfg) {
				t.Errorf("config %+v does not hold the expected values", cfg)
			}
		})
	}
}
