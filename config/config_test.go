package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const base = `
[policy]
checkpoint = "ck"
device = "cpu"

[[pool.models]]
name = "m"
description = "a simulated model"
provider = "sim"
  [pool.models.sim]
  default_accuracy = 0.5
`

func TestParse(t *testing.T) {
	cases := []struct {
		name    string
		text    string
		sets    []string
		wantErr string
		check   func(Config) bool
	}{
		{name: "defaults fill the rest", text: base, check: func(c Config) bool {
			return c.Policy.DType == "float32" && c.Train.GroupSize == 4 && c.Train.BatchSize == 64 && c.Train.Steps == 150 && c.Calibration.TauMax == 1.25
		}},
		{name: "set overrides", text: base, sets: []string{"policy.dtype=bfloat16", "policy.threads=3", "train.lr=3e-5", "calibration.gating=false"},
			check: func(c Config) bool {
				return c.Policy.DType == "bfloat16" && c.Policy.Threads == 3 && c.Train.LR == 3e-5 && !c.Calibration.Gating
			}},
		{name: "set a list", text: base, sets: []string{`data.train=["nq"]`}, check: func(c Config) bool { return len(c.Data.Train) == 1 }},
		{name: "set adds an absent known key", text: base, sets: []string{"policy.checkpoint=elsewhere"},
			check: func(c Config) bool { return c.Policy.Checkpoint == "elsewhere" }},
		{name: "unknown key in file", text: base + "\n[train]\nstepz = 3\n", wantErr: `unknown key "train.stepz"`},
		{name: "unknown section", text: base + "\n[polcy]\ndevice = \"cpu\"\n", wantErr: `unknown key "polcy`},
		{name: "unknown key by set", text: base, sets: []string{"policy.nope=1"}, wantErr: `unknown key "policy.nope"`},
		{name: "wrong type", text: base + "\n[train]\nsteps = \"many\"\n", wantErr: "steps"},
		{name: "bad value", text: base, sets: []string{"policy.dtype=float16"}, wantErr: "policy.dtype"},
		{name: "malformed set", text: base, sets: []string{"policy.dtype"}, wantErr: "key=value"},
		{name: "tau_min > tau_max", text: base, sets: []string{"calibration.tau_min=1.5"}, wantErr: "calibration.tau_min"},
		{name: "group size 1", text: base, sets: []string{"train.group_size=1"}, wantErr: "train.group_size"},
		{name: "optimizer reset and skip limit default on", text: base, check: func(c Config) bool {
			return c.Train.ResetOptimizerAfterSFT && c.Train.MaxSkippedUpdates == 3
		}},
		{name: "skip limit 0 never stops", text: base, sets: []string{"train.max_skipped_updates=0", "train.reset_optimizer_after_sft=false"},
			check: func(c Config) bool { return c.Train.MaxSkippedUpdates == 0 && !c.Train.ResetOptimizerAfterSFT }},
		{name: "negative skip limit", text: base, sets: []string{"train.max_skipped_updates=-1"}, wantErr: "train.max_skipped_updates"},
		{name: "answer weight 0", text: base, sets: []string{"sft.steps=5", "sft.answer_weight=0"}, wantErr: "sft.answer_weight"},
		{name: "weights all zero", text: base, sets: []string{"calibration.weights.ans=0", "calibration.weights.info=0",
			"calibration.weights.format=0", "calibration.weights.route=0", "calibration.weights.balance=0"}, wantErr: "weights"},
		{name: "pool entry without base_url", text: base + `
[[pool.models]]
name = "x"
description = "d"
provider = "openai"
  [pool.models.openai]
  model = "m"
  api_key_env = "K"
`, wantErr: `pool.models[1] ("x"): openai.base_url`},
		{name: "unknown dataset", text: base, sets: []string{`data.train=["squad"]`}, wantErr: `"data.train"`},
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

// The configurations shipped in the repository load, and Write/Load round-trips.
func TestShippedConfigs(t *testing.T) {
	for _, path := range []string{"../recal.toml", "../configs/qwen2.5-3b-nim.toml"} {
		cfg, err := Load(path, nil)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out := filepath.Join(t.TempDir(), "config.toml")
		if err := cfg.Write(out); err != nil {
			t.Fatal(err)
		}
		again, err := Load(out, nil)
		if err != nil {
			t.Fatalf("%s written back does not load: %v", path, err)
		}
		if again.Train != cfg.Train || again.Calibration.Weights != cfg.Calibration.Weights || len(again.Pool.Models) != len(cfg.Pool.Models) {
			t.Errorf("%s: the written config differs after loading it again", path)
		}
		b, _ := os.ReadFile(out)
		for _, k := range []string{"[calibration]", "component_advantages", "dataset_normalization", "[train]", "kl_coef"} {
			if !strings.Contains(string(b), k) {
				t.Errorf("the resolved config lacks %q", k)
			}
		}
	}
}
