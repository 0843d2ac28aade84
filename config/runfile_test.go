package config

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// loadConstant loads recal.toml with sets, from the paper's constant
// learning-rate schedule (the offline default decays).
func loadConstant(t *testing.T, sets ...string) Config {
	t.Helper()
	base := []string{"train.lr_schedule=constant", "train.warmup_steps=0", "train.min_lr_ratio=0"}
	cfg, err := Load("../recal.toml", append(base, sets...))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// writeRunFile writes cfg as a run folder's config.toml in a new folder
// and returns its path. The dotted keys of drop ("train.keep_best") are
// left out, as in a run folder written before those keys existed.
func writeRunFile(t *testing.T, cfg Config, drop ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := cfg.Write(path); err != nil {
		t.Fatal(err)
	}
	if len(drop) == 0 {
		return path
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	var kept []string
	table := ""
	for _, line := range lines {
		l := strings.TrimSpace(line)
		if strings.HasPrefix(l, "[") {
			table = strings.Trim(l, "[]")
		}
		if key, _, _ := strings.Cut(l, " ="); slices.Contains(drop, table+"."+key) {
			continue
		}
		kept = append(kept, line)
	}
	if len(kept) != len(lines)-len(drop) {
		t.Fatalf("dropped %d lines, want one for each of %v", len(lines)-len(kept), drop)
	}
	if err := os.WriteFile(path, []byte(strings.Join(kept, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// ChangesFrom names each training key that differs, pool models by name,
// with both values, and lets the operational keys through.
func TestConfigChanges(t *testing.T) {
	path := writeRunFile(t, loadConstant(t))
	cases := []struct {
		name string
		sets []string
		edit func(c *Config)
		want string   // the changes as key=old>new, sorted by key
		has  []string // instead of want: changes that must be among them
	}{
		{"same configuration", nil, nil, "", nil},
		{"operational keys only", []string{"policy.threads=3", "train.steps=999", "train.log_every=1", "train.micro_batch=2",
			"eval.batch=3", "data.test_per_dataset=7", "pool.cache=read-write", "pool.max_concurrency=5"}, nil, "", nil},
		{"a simulated model's latency", nil, func(c *Config) { c.Pool.Models[1].Sim.Latency *= 9 }, "", nil},
		{"training keys", []string{"calibration.tau_min=0.7", "train.lr=1e-3", "sft.steps=5", "policy.dtype=bfloat16"}, nil,
			`calibration.tau_min=0.8>0.7 policy.dtype="float32">"bfloat16" sft.steps=600>5 train.lr=0.0003>0.001`, nil},
		{"a simulated model's accuracy", nil, func(c *Config) { c.Pool.Models[2].Sim.DefaultAccuracy = 0.5 },
			"pool.models[sim-small].sim.default_accuracy=0.05>0.5", nil},
		{"the order of the models (the policy sees them in it)", nil, func(c *Config) {
			c.Pool.Models[0], c.Pool.Models[1] = c.Pool.Models[1], c.Pool.Models[0]
		}, `pool.models=["sim-factoid","sim-multihop","sim-small"]>["sim-multihop","sim-factoid","sim-small"]`, nil},
		{"the learning-rate schedule and keep_best are training keys", []string{"train.lr_schedule=cosine", "train.warmup_steps=5",
			"train.min_lr_ratio=0.1", "train.keep_best=false"}, nil,
			`train.keep_best=true>false train.lr_schedule="constant">"cosine" train.min_lr_ratio=0>0.1 train.warmup_steps=0>5`, nil},
		{"train.model_subsets is a training key (the prompts change)", []string{"train.model_subsets=0.5"}, nil, "train.model_subsets=1>0.5", nil},
		{"train.steps with a decaying schedule (it spans the steps)", []string{"train.lr_schedule=linear", "train.steps=400"}, nil, "",
			[]string{`train.lr_schedule="constant">"linear"`, "train.steps=300>400"}},
		{"a model removed", nil, func(c *Config) { c.Pool.Models = c.Pool.Models[:2] }, "",
			[]string{`pool.models[sim-small].name="sim-small">null`, `pool.models[sim-small].sim.default_accuracy=0.05>null`, `pool.models=["sim-factoid","sim-multihop","sim-small"]>["sim-factoid","sim-multihop"]`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := loadConstant(t, c.sets...)
			if c.edit != nil {
				c.edit(&cfg)
			}
			changes, err := cfg.ChangesFrom(path)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, ch := range changes {
				got = append(got, fmt.Sprintf("%s=%s>%s", ch.Key, ch.Old, ch.New))
			}
			text := strings.Join(got, " ")
			if c.has != nil {
				for _, h := range c.has {
					if !slices.Contains(got, h) {
						t.Errorf("changes %q lack %q", got, h)
					}
				}
				return
			}
			if text != c.want {
				t.Errorf("changes %q, want %q", text, c.want)
			}
		})
	}
}

// With a decaying learning-rate schedule, train.steps decides the learning
// rate of every step, so a resume may not change it; with "constant" it
// may. A run folder written before the schedule keys existed resumes under
// their defaults, which are its behaviour.
func TestConfigChangesSchedule(t *testing.T) {
	cases := []struct {
		name      string
		run, now  []string
		dropKeys  bool // the run's config.toml lacks the keys added with the schedule
		wantSteps bool // train.steps is among the changes
		wantAny   bool
	}{
		{"constant: a longer run continues a shorter one", nil, []string{"train.steps=400"}, false, false, false},
		{"cosine: the same steps", []string{"train.lr_schedule=cosine"}, []string{"train.lr_schedule=cosine"}, false, false, false},
		{"cosine: more steps", []string{"train.lr_schedule=cosine"}, []string{"train.lr_schedule=cosine", "train.steps=400"}, false, true, true},
		{"linear: fewer steps", []string{"train.lr_schedule=linear"}, []string{"train.lr_schedule=linear", "train.steps=200"}, false, true, true},
		{"a run folder from before the keys, defaults now", nil, nil, true, false, false},
		{"a run folder from before the keys, a schedule now", nil, []string{"train.lr_schedule=cosine"}, true, false, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var drop []string
			if c.dropKeys {
				drop = []string{"train.lr_schedule", "train.warmup_steps", "train.min_lr_ratio", "train.keep_best"}
			}
			path := writeRunFile(t, loadConstant(t, c.run...), drop...)
			changes, err := loadConstant(t, c.now...).ChangesFrom(path)
			if err != nil {
				t.Fatal(err)
			}
			var keys []string
			for _, ch := range changes {
				keys = append(keys, ch.Key)
			}
			if slices.Contains(keys, "train.steps") != c.wantSteps || (len(keys) > 0) != c.wantAny {
				t.Errorf("changes %v: want train.steps among them %v, any change %v", keys, c.wantSteps, c.wantAny)
			}
		})
	}
}

// A PPO run folder written before ppo.kl_coef existed weighed its in-reward
// KL by train.kl_coef: resumed or reused, it is compared with that value, not
// with the new key's default, so that a run trained with β = 0.1 is not
// taken for one trained with Router-R1's 0.001.
func TestConfigChangesPPOKLBeforeItsKey(t *testing.T) {
	load := func(t *testing.T, sets ...string) Config {
		t.Helper()
		cfg, err := Load("../recal.toml", append([]string{"train.kl_coef=0.1"}, sets...))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	cases := []struct {
		name    string
		run     []string
		dropKey bool // the run's [ppo] lacks kl_coef
		now     []string
		want    string // the changes as key=old>new
	}{
		{"PPO before the key, Router-R1's default now", []string{"train.algorithm=ppo"}, true, []string{"train.algorithm=ppo"}, "ppo.kl_coef=0.1>0.001"},
		{"PPO before the key, its β now", []string{"train.algorithm=ppo"}, true, []string{"train.algorithm=ppo", "ppo.kl_coef=0.1"}, ""},
		{"GRPO before the key (PPO's β unused)", nil, true, nil, ""},
		{"PPO with the key", []string{"train.algorithm=ppo", "ppo.kl_coef=0.001"}, false, []string{"train.algorithm=ppo"}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var drop []string
			if c.dropKey {
				drop = []string{"ppo.kl_coef"}
			}
			path := writeRunFile(t, load(t, c.run...), drop...)
			changes, err := load(t, c.now...).ChangesFrom(path)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, ch := range changes {
				got = append(got, fmt.Sprintf("%s=%s>%s", ch.Key, ch.Old, ch.New))
			}
			if text := strings.Join(got, " "); text != c.want {
				t.Errorf("changes %q, want %q", text, c.want)
			}
		})
	}
}
