package config

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/recal-project/recal/data"
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
		{name: "agree route", text: base + "\n[[pool.models]]\nname = \"n\"\ndescription = \"d\"\nprovider = \"sim\"\n", sets: []string{"sft.route=agree", `sft.chain=["m", "n"]`},
			check: func(c Config) bool { return c.SFT.Route == "agree" && slices.Equal(c.SFT.Chain, []string{"m", "n"}) }},
		{name: "unknown route", text: base, sets: []string{"sft.route=cheapest"}, wantErr: `sft.route = "cheapest": want one of uniform, agree`},
		{name: "chain of one", text: base, sets: []string{"sft.route=agree", `sft.chain=["m"]`}, wantErr: "sft.chain"},
		{name: "chain longer than the turns", text: base, sets: []string{"sft.route=agree", `sft.chain=["m", "m", "m", "m"]`}, wantErr: "router.max_turns (3)"},
		{name: "chain model not in the pool", text: base, sets: []string{"sft.route=agree", `sft.chain=["m", "x"]`}, wantErr: `sft.chain[1] = "x": no such pool model`},
		{name: "chain asks a model twice", text: base, sets: []string{"sft.route=agree", `sft.chain=["m", "m"]`}, wantErr: `sft.chain[1] = "m": asked twice`},
		{name: "negative decision weight", text: base, sets: []string{"sft.decision_weight=-1"}, wantErr: "sft.decision_weight = -1: must be ≥ 0"},
		{name: "decision weight without the agree route", text: base, sets: []string{"sft.decision_weight=5"}, wantErr: `only the "agree" route reads it`},
		{name: "budget share above 1", text: base, sets: []string{"sft.budget_share=1.5"}, wantErr: "sft.budget_share = 1.5: must be in [0, 1]"},
		{name: "budget share NaN", text: base, sets: []string{"sft.budget_share=nan"}, wantErr: "sft.budget_share = NaN: must be a finite number"},
		{name: "budget share without the agree route", text: base, sets: []string{"sft.budget_share=0.2"}, wantErr: `sft.budget_share = 0.2: only the "agree" route reads it`},
		{name: "chain without the agree route", text: base, sets: []string{`sft.chain=["m", "m"]`}, wantErr: "only \"agree\" does"},
		{name: "agree route with model subsets", text: base + "\n[[pool.models]]\nname = \"n\"\ndescription = \"d\"\nprovider = \"sim\"\n", sets: []string{"sft.route=agree", `sft.chain=["m", "n"]`, "train.model_subsets=0.5"}, wantErr: "model_subsets"},
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
		{name: "lr schedule defaults (absent keys) keep the paper's constant lr", text: base, check: func(c Config) bool {
			return c.Train.LRSchedule == "constant" && c.Train.WarmupSteps == 0 && c.Train.MinLRRatio == 0 && c.Train.KeepBest
		}},
		{name: "cosine with warm-up", text: base, sets: []string{"train.lr_schedule=cosine", "train.warmup_steps=10", "train.min_lr_ratio=0.1", "train.keep_best=false"},
			check: func(c Config) bool {
				return c.Train.LRSchedule == "cosine" && c.Train.WarmupSteps == 10 && c.Train.MinLRRatio == 0.1 && !c.Train.KeepBest
			}},
		{name: "unknown lr schedule", text: base, sets: []string{"train.lr_schedule=exponential"}, wantErr: `train.lr_schedule = "exponential": want one of constant, cosine, linear`},
		{name: "lr schedule in another case", text: base, sets: []string{"train.lr_schedule=Cosine"}, wantErr: "train.lr_schedule"},
		{name: "negative decode threads", text: base, sets: []string{"policy.decode_threads=-1"}, wantErr: "policy.decode_threads = -1"},
		{name: "decode threads", text: base, sets: []string{"policy.decode_threads=1"}, check: func(c Config) bool { return c.Policy.DecodeThreads == 1 }},
		{name: "negative rollout workers", text: base, sets: []string{"policy.rollout_workers=-2"}, wantErr: "policy.rollout_workers = -2"},
		{name: "rollout workers", text: base, sets: []string{"policy.rollout_workers=3"}, check: func(c Config) bool { return c.Policy.RolloutWorkers == 3 }},
		{name: "rollout workers not a number", text: base, sets: []string{"policy.rollout_workers=two"}, wantErr: "policy.rollout_workers"},
		{name: "negative warm-up", text: base, sets: []string{"train.warmup_steps=-1"}, wantErr: "train.warmup_steps"},
		{name: "warm-up longer than the run ends inside the ramp", text: base, sets: []string{"train.steps=4", "train.warmup_steps=10"},
			check: func(c Config) bool { return c.Train.LRFactor(1) == 0.1 && c.Train.LRFactor(4) == 0.4 }},
		{name: "warm-up one step shorter than the run", text: base, sets: []string{"train.steps=10", "train.warmup_steps=9"},
			check: func(c Config) bool { return c.Train.WarmupSteps == 9 }},
		{name: "no steps, no warm-up", text: base, sets: []string{"train.steps=0"}, check: func(c Config) bool { return c.Train.Steps == 0 }},
		{name: "min lr ratio above 1", text: base, sets: []string{"train.min_lr_ratio=1.5"}, wantErr: "train.min_lr_ratio"},
		{name: "negative min lr ratio", text: base, sets: []string{"train.min_lr_ratio=-0.1"}, wantErr: "train.min_lr_ratio"},
		{name: "PPO's KL is Router-R1's 0.001 by default, apart from GRPO's", text: base, sets: []string{"train.algorithm=ppo", "train.kl_coef=0.1"},
			check: func(c Config) bool { return c.PPO.KLCoef == 0.001 && c.KLCoef() == 0.001 && c.Train.KLCoef == 0.1 }},
		{name: "ppo.kl_coef set", text: base, sets: []string{"ppo.kl_coef=0.05"},
			check: func(c Config) bool { return c.PPO.KLCoef == 0.05 && c.KLCoef() == c.Train.KLCoef }},
		{name: "model subsets off by default", text: base, check: func(c Config) bool { return c.Train.ModelSubsets == 0 }},
		{name: "model subsets on every question", text: base, sets: []string{"train.model_subsets=1"}, check: func(c Config) bool { return c.Train.ModelSubsets == 1 }},
		{name: "model subsets on half", text: base, sets: []string{"train.model_subsets=0.5"}, check: func(c Config) bool { return c.Train.ModelSubsets == 0.5 }},
		{name: "model subsets above 1", text: base, sets: []string{"train.model_subsets=1.5"}, wantErr: "train.model_subsets = 1.5"},
		{name: "negative model subsets", text: base, sets: []string{"train.model_subsets=-0.1"}, wantErr: "train.model_subsets = -0.1"},
		{name: "model subsets NaN", text: base, sets: []string{"train.model_subsets=nan"}, wantErr: "train.model_subsets = NaN"},
		{name: "model subsets not a number", text: base, sets: []string{"train.model_subsets=yes"}, wantErr: "train.model_subsets"},
		{name: "rollout rows in rounds", text: base, sets: []string{"train.rollout_rows=4"}, check: func(c Config) bool { return c.Train.RolloutRows == 4 }},
		{name: "negative rollout rows", text: base, sets: []string{"train.rollout_rows=-1"}, wantErr: "train.rollout_rows = -1"},
		{name: "device memory of a card", text: base, sets: []string{"policy.device_memory=80"}, check: func(c Config) bool { return c.Policy.DeviceMemory == 80 }},
		{name: "negative device memory", text: base, sets: []string{"policy.device_memory=-8"}, wantErr: "policy.device_memory = -8"},
		{name: "device memory NaN", text: base, sets: []string{"policy.device_memory=nan"}, wantErr: "policy.device_memory"},
		{name: "device memory infinite", text: base, sets: []string{"policy.device_memory=inf"}, wantErr: "policy.device_memory"},
		{name: "negative ppo.kl_coef", text: base, sets: []string{"ppo.kl_coef=-0.1"}, wantErr: "ppo.kl_coef = -0.1"},
		{name: "sharded gradients without a sharded optimizer", text: base, sets: []string{"dist.shard_gradients=true"},
			wantErr: "dist.shard_gradients = true needs dist.shard_optimizer = true"},
		{name: "ZeRO-2 on a GPU", text: base, sets: []string{"dist.shard_optimizer=true", "dist.shard_gradients=true", "policy.device=cuda"},
			wantErr: "dist.shard_gradients = true: sharded gradients give their memory back on the CPU only"},
		// Hostile values: the error names where the value came from, the
		// file's own line or the --set flag with its value.
		{name: "type error at its own line", text: base + "\n[train]\nlr = \"fast\"\n\n[eval]\nbatch = 4\n", wantErr: `test.toml: toml: line 14 (last key "train.lr")`},
		{name: "set a string where a float goes", text: base, sets: []string{"train.lr=NaN"},
			wantErr: `--set train.lr=NaN: key "train.lr": incompatible types: TOML value has type string; destination has type float (NaN is not a TOML value`},
		{name: "set a float where an integer goes", text: base, sets: []string{"train.steps=1e30"}, wantErr: `--set train.steps=1e30: key "train.steps"`},
		{name: "set an integer past int64", text: base, sets: []string{"train.steps=99999999999999999999"},
			wantErr: `--set train.steps=99999999999999999999: key "train.steps"`},
		{name: "set nan blamed on the flag", text: base, sets: []string{"train.lr=nan"}, wantErr: `config: --set train.lr=nan: train.lr = NaN: must be a finite number`},
		{name: "set a bad value blamed on the flag", text: base, sets: []string{"train.batch_size=0"}, wantErr: `config: --set train.batch_size=0: train.batch_size = 0`},
		{name: "set an unknown key blamed on the flag", text: base, sets: []string{"train.stepz=3"}, wantErr: `config: --set train.stepz=3: unknown key "train.stepz"`},
		{name: "file's bad value blamed on the file", text: base + "\n[train]\nbatch_size = 0\n", sets: []string{"train.lr=1e-5"}, wantErr: `config: test.toml: train.batch_size = 0`},
		{name: "ZeRO-2", text: base, sets: []string{"dist.shard_optimizer=true", "dist.shard_gradients=true"},
			check: func(c Config) bool { return c.Dist.ShardOptimizer && c.Dist.ShardGradients }},
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

// A configuration that is not a regular file (a FIFO no one writes, an
// endless device) is refused at once, naming it: by Load, and by
// ReadRunFile, which reads a run folder's config.toml on --resume.
func TestLoadHostileFiles(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "recal.toml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	readers := []struct {
		name string
		read func(path string) error
	}{
		{"Load", func(path string) error { _, err := Load(path, nil); return err }},
		{"ReadRunFile", func(path string) error { _, err := ReadRunFile(path); return err }},
	}
	for _, r := range readers {
		for _, path := range []string{fifo, "/dev/urandom"} {
			done := make(chan error, 1)
			go func() { done <- r.read(path) }()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), "config: open "+path) || !strings.Contains(err.Error(), "not a regular file") {
					t.Errorf("%s(%s): error %v, want one naming it as not a regular file", r.name, path, err)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("%s(%s) still running after 5 s; want an error at once", r.name, path)
			}
		}
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

// shippedConfigs are recal.toml and every file under configs/.
func shippedConfigs(t *testing.T) []string {
	t.Helper()
	more, err := filepath.Glob("../configs/*.toml")
	if err != nil || len(more) == 0 {
		t.Fatalf("no configs/*.toml found (%v): the paper's config should ship", err)
	}
	return append([]string{"../recal.toml"}, more...)
}

// markedKeys reads a comment line "# <marker>: key, key" of a config file.
func markedKeys(t *testing.T, text, marker string) map[string]bool {
	t.Helper()
	keys := map[string]bool{}
	for _, line := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "# "+marker+":")
		if !ok {
			continue
		}
		for _, k := range strings.Split(rest, ",") {
			k = strings.TrimSpace(k)
			if !slices.Contains(PathKeys(), k) {
				t.Fatalf("comment %q names %q, which is not a path key (%v)", marker, k, PathKeys())
			}
			keys[k] = true
		}
	}
	return keys
}

// ignoredDirs are the repository's top-level folders that .gitignore
// anchors ("/runs/"): where runs may create files.
func ignoredDirs(t *testing.T, root string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, ".gitignore"))
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "/") && strings.HasSuffix(line, "/") && strings.Count(line, "/") == 2 {
			dirs = append(dirs, filepath.Join(root, strings.Trim(line, "/")))
		}
	}
	return dirs
}

// Every path a shipped config names resolves, against the file's folder, to
// something in the repository, except the paths its comments say the user
// supplies ("# Paths you supply: ...") and those a run or make creates
// ("# Paths created by a run or by make: ..."), which must be creatable in a
// git-ignored folder so that no run writes into tracked files.
// configs/qwen2.5-3b-nim.toml once named "data/qa", which resolved to
// configs/data/qa.
func TestShippedConfigPathsExist(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	ignored := ignoredDirs(t, root)
	for _, path := range shippedConfigs(t) {
		t.Run(filepath.Base(path), func(t *testing.T) {
			text, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			supplied := markedKeys(t, string(text), "Paths you supply")
			created := markedKeys(t, string(text), "Paths created by a run or by make")
			abs, _ := filepath.Abs(path)
			cfg, err := Load(abs, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, key := range PathKeys() {
				p, _ := cfg.Path(key)
				switch {
				case key == "pool.cache_dir" && cfg.Pool.Cache == "off":
					if created[key] || supplied[key] {
						t.Errorf("%s: comments name %s, but pool.cache is off and nothing uses it", path, key)
					}
				case supplied[key]:
					if p == "" {
						t.Errorf("%s: %s is empty; a path the user supplies still needs a default naming where", path, key)
					}
				case created[key]:
					if !slices.ContainsFunc(ignored, func(d string) bool { return strings.HasPrefix(p, d+string(filepath.Separator)) }) {
						t.Errorf("%s: %s = %s is created by a run, so it must lie in a git-ignored folder (%v)", path, key, p, ignored)
					}
					if _, err := os.Stat(p); err != nil && !creatable(p) {
						t.Errorf("%s: %s = %s neither exists nor can be created", path, key, p)
					}
				default:
					if _, err := os.Stat(p); err != nil {
						t.Errorf("%s: %s = %s: %v; relative paths resolve against the config's folder, and the comments do not say the user supplies it", path, key, p, err)
					}
				}
			}
			datasets, _ := data.Expand(cfg.Data.Train)
			for _, ds := range datasets {
				if _, err := cfg.Data.Path(ds, data.FileTrain); err != nil {
					t.Errorf("%s: training file of %s: %v", path, ds, err)
				}
			}
			datasets, _ = data.Expand(cfg.Data.Test)
			for _, ds := range datasets {
				if _, err := cfg.Data.Path(ds, data.FileTest); err != nil {
					t.Errorf("%s: test file of %s: %v", path, ds, err)
				}
			}
		})
	}
}

// creatable reports whether MkdirAll(p) could work: the nearest existing
// ancestor is a folder.
func creatable(p string) bool {
	for d := filepath.Dir(p); ; d = filepath.Dir(d) {
		if st, err := os.Stat(d); err == nil {
			return st.IsDir()
		}
		if d == filepath.Dir(d) {
			return false
		}
	}
}

// Relative paths in a file are resolved against its folder; the same path
// given with --set is relative to the working directory, like any other
// command-line path (--config configs/x.toml --set policy.checkpoint=models/m
// means ./models/m, not configs/models/m).
func TestLoadResolvesPaths(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "configs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "c.toml")
	if err := os.WriteFile(file, []byte(base+"\n[data]\ndir = \"../qa\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		sets []string
		key  string
		want string
	}{
		{"file path against the file's folder", nil, "policy.checkpoint", filepath.Join(dir, "ck")},
		{"parent of the file's folder", nil, "data.dir", filepath.Join(dir, "..", "qa")},
		{"default against the file's folder", nil, "router.prompt_template", filepath.Join(dir, "router", "prompt.tmpl")},
		{"set path against the working directory", []string{"policy.checkpoint=models/m"}, "policy.checkpoint", filepath.Join("models", "m")},
		{"set other key leaves paths alone", []string{"train.steps=3"}, "policy.checkpoint", filepath.Join(dir, "ck")},
		{"absolute set path", []string{"pool.cache_dir=/tmp/c"}, "pool.cache_dir", "/tmp/c"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := Load(file, c.sets)
			if err != nil {
				t.Fatal(err)
			}
			if got, _ := cfg.Path(c.key); got != c.want {
				t.Errorf("%s = %q, want %q", c.key, got, c.want)
			}
		})
	}
}

// Diff names exactly the keys that differ, nested tables by dotted key.
func TestDiff(t *testing.T) {
	a, err := Parse("a.toml", []byte(base), nil)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		text string
		sets []string
		want []string
	}{
		{"same", base, nil, nil},
		{"one key", base, []string{"train.lr=3e-4"}, []string{"train.lr"}},
		{"nested table", base, []string{"calibration.weights.ans=0.5"}, []string{"calibration.weights.ans"}},
		{"a list counts as one value", strings.Replace(base, `name = "m"`, `name = "n"`, 1), nil, []string{"pool.models"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, err := Parse("b.toml", []byte(c.text), c.sets)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Diff(a, b)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("Diff = %v, want %v", got, c.want)
			}
		})
	}
}
