package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/internal/testpolicy"
	"github.com/recal-project/recal/torchbridge"
)

// problemLines returns the problems a failed dry run listed on stderr.
func problemLines(t *testing.T, stderr string) []string {
	t.Helper()
	_, list, ok := strings.Cut(stderr, "--dry-run: ")
	if !ok {
		t.Fatalf("stderr %q has no dry-run problem list", stderr)
	}
	lines := strings.Split(strings.TrimSpace(list), "\n")[1:] // after "N problems:"
	for i := range lines {
		lines[i] = strings.TrimSpace(lines[i])
	}
	return lines
}

// unsetEnv unsets an environment variable for the test.
func unsetEnv(t *testing.T, key string) {
	t.Setenv(key, "") // restores the old value at the end of the test
	os.Unsetenv(key)
}

// The paper's config on a machine without the 3B download and without the
// NIM key: exactly those two problems, exit status 2, nothing written.
func TestDryRunPaperConfig(t *testing.T) {
	unsetEnv(t, "NVIDIA_API_KEY")
	run := filepath.Join(t.TempDir(), "run")
	cache := filepath.Join("..", "..", "cache", "pool")
	_, cacheErr := os.Stat(cache)
	code, stdout, stderr := runCLI(t, "train", "--config", "../../configs/qwen2.5-3b-nim.toml", "--dry-run", "--run-dir", run)
	if code != 2 {
		t.Fatalf("exit status %d, want 2 for a dry run with problems; stderr: %s", code, stderr)
	}
	got := problemLines(t, stderr)
	if len(got) != 2 || !strings.HasPrefix(got[0], "policy.checkpoint: ") || !strings.Contains(got[0], "Qwen2.5-3B-Instruct does not exist") ||
		!strings.Contains(got[1], "NVIDIA_API_KEY is not set") {
		t.Errorf("problems:\n%s\nwant exactly the missing checkpoint folder and the missing NVIDIA_API_KEY", strings.Join(got, "\n"))
	}
	if stdout != "" {
		t.Errorf("stdout %q, want nothing when the dry run fails", stdout)
	}
	if _, err := os.Stat(run); err == nil {
		t.Error("the dry run created the run folder")
	}
	if _, err := os.Stat(cache); cacheErr != nil && err == nil {
		t.Error("the dry run created the pool's cache folder")
	}
}

// recal.toml's offline default with a real checkpoint: exit 0 and a summary
// with the parameters (as the weights hold them), the questions per dataset
// and split, the pool and the training memory; nothing is created.
func TestDryRunOfflineDefault(t *testing.T) {
	ck := testpolicy.Micro(t, "../..", 1)
	run := filepath.Join(t.TempDir(), "nested", "run")
	code, stdout, stderr := runCLI(t, "train", "--config", "../../recal.toml", "--set", "policy.checkpoint="+ck, "--dry-run", "--run-dir", run)
	if code != 0 {
		t.Fatalf("exit status %d, want 0; stderr: %s", code, stderr)
	}
	params := weightCount(t, ck)
	cfg, err := config.Load("../../recal.toml", nil)
	if err != nil {
		t.Fatal(err)
	}
	// float32: weights, gradient sums, two AdamW moments and the KL reference (kl_coef > 0) at 4 bytes each.
	want := []string{fmt.Sprintf("%d parameters", params), fmt.Sprintf("memory       %.3f GiB", float64(params*4*5)/(1<<30)),
		"sim-factoid", "sim-multihop", "sim-small", "no problem found", "lr schedule  " + cfg.Train.DescribeLR()}
	for _, ds := range []string{"nq", "hotpotqa"} {
		one := cfg.Data
		one.Train = []string{ds}
		train, val, err := one.LoadTrain()
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, fmt.Sprintf("%-10s train %6d  val %5d", ds, len(train), len(val)))
	}
	for _, w := range want {
		if !strings.Contains(stdout, w) {
			t.Errorf("summary lacks %q:\n%s", w, stdout)
		}
	}
	if _, err := os.Stat(filepath.Dir(run)); err == nil {
		t.Error("the dry run created the run folder")
	}
}

// weightCount is the number of elements in a checkpoint's safetensors.
func weightCount(t *testing.T, dir string) int64 {
	t.Helper()
	w, err := hfmodel.OpenWeights(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var n int64
	for _, name := range w.Names() {
		tt, _ := w.Lookup(name)
		n += tt.Numel()
	}
	return n
}

// recal eval --dry-run counts the test questions of the split and holds
// only the policy in its memory estimate.
func TestDryRunEval(t *testing.T) {
	ck := testpolicy.Micro(t, "../..", 1)
	out := filepath.Join(t.TempDir(), "out")
	code, stdout, stderr := runCLI(t, "eval", "--config", "../../recal.toml", "--checkpoint", ck, "--split", "ood", "--out", out, "--dry-run")
	if code != 0 {
		t.Fatalf("exit status %d, want 0; stderr: %s", code, stderr)
	}
	cfg, err := config.Load("../../recal.toml", nil)
	if err != nil {
		t.Fatal(err)
	}
	params := weightCount(t, ck)
	want := []string{fmt.Sprintf("memory       %.3f GiB = weights", float64(params*4)/(1<<30)), "knn skipped"}
	ood, err := data.Split("ood")
	if err != nil {
		t.Fatal(err)
	}
	for _, ds := range ood {
		one := cfg.Data
		one.Test = []string{ds}
		qs, err := one.LoadTest()
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, fmt.Sprintf("%-10s test  %6d", ds, len(qs)))
	}
	for _, w := range want {
		if !strings.Contains(stdout, w) {
			t.Errorf("summary lacks %q:\n%s", w, stdout)
		}
	}
	if strings.Contains(stdout, "gradient") || strings.Contains(stdout, "nq ") {
		t.Errorf("eval's summary holds training memory or in-domain test sets:\n%s", stdout)
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("the dry run created --out")
	}
}

// A dry run lists every problem, not only the first.
func TestDryRunListsEveryProblem(t *testing.T) {
	ck := testpolicy.Micro(t, "../..", 1)
	if err := os.Remove(filepath.Join(ck, "tokenizer.json")); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runCLI(t, "train", "--config", "../../recal.toml", "--dry-run", "--run-dir", filepath.Join(t.TempDir(), "run"),
		"--set", "policy.checkpoint="+ck, "--set", "data.dir="+t.TempDir(), "--set", "router.prompt_template="+filepath.Join(t.TempDir(), "none.tmpl"))
	if code != 2 {
		t.Fatalf("exit status %d, want 2; stderr: %s", code, stderr)
	}
	got := problemLines(t, stderr)
	want := []string{"policy.checkpoint: tokenizer", "data: nq: ", "data: hotpotqa: ", "router.prompt_template: "}
	if len(got) != len(want) {
		t.Fatalf("%d problems:\n%s\nwant %d: %v", len(got), strings.Join(got, "\n"), len(want), want)
	}
	for i, w := range want {
		if !strings.HasPrefix(got[i], w) {
			t.Errorf("problem %d is %q, want one starting %q", i, got[i], w)
		}
	}
}

// The tensors the dry run checks and counts are the policy's parameters as
// libtorch creates them, tied and untied.
func TestQwen2TensorsMatchPolicy(t *testing.T) {
	tied, err := hfmodel.Preset("tiny", 576)
	if err != nil {
		t.Fatal(err)
	}
	untied := *tied
	untied.TieWordEmbeddings = false
	for _, cfg := range []*hfmodel.Config{tied, &untied} {
		t.Run(fmt.Sprintf("tied=%v", cfg.TieWordEmbeddings), func(t *testing.T) {
			p, err := torchbridge.NewPolicy(cfg, torchbridge.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			var want, got []string
			for _, pr := range p.Params() {
				want = append(want, fmt.Sprint(pr.Name, pr.Shape))
			}
			var n int64
			for _, ts := range qwen2Tensors(cfg) {
				got = append(got, fmt.Sprint(ts.name, ts.shape))
				n += ts.numel()
			}
			slices.Sort(want)
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("dry-run tensors\n%v\nlibtorch parameters\n%v", got, want)
			}
			if n != p.NumParams() {
				t.Errorf("dry run counts %d parameters, libtorch %d", n, p.NumParams())
			}
		})
	}
}

// The paper's policy, Qwen2.5-3B-Instruct: 3.09 B parameters (2.77 B
// without the embedding, as its model card says); bf16 training holds the
// weights, one backward's gradients and the KL reference at 2 bytes a
// parameter, the float32 gradient sums and master copy at 4 and AdamW's
// moments at 8.
func TestPlanMemoryQwen3B(t *testing.T) {
	cfg := &hfmodel.Config{VocabSize: 151936, HiddenSize: 2048, IntermediateSize: 11008, NumHiddenLayers: 36,
		NumAttentionHeads: 16, NumKeyValueHeads: 2, TieWordEmbeddings: true}
	var n int64
	for _, ts := range qwen2Tensors(cfg) {
		n += ts.numel()
	}
	if n != 3085938688 || n-151936*2048 != 2774773760 {
		t.Fatalf("%d parameters (%d without the embedding), want 3085938688 (2774773760)", n, n-151936*2048)
	}
	// PPO's reference follows ppo.kl_coef (its KL is in the reward), not
	// train.kl_coef (GRPO's, in the loss).
	cases := []struct {
		name  string
		train *config.Config
		want  int64
	}{
		{"train, kl", &config.Config{Train: config.Train{KLCoef: 0.001}}, n * (2 + 4 + 2 + 4 + 8 + 2)},
		{"train, no kl", &config.Config{}, n * (2 + 4 + 2 + 4 + 8)},
		{"ppo, ppo.kl_coef only", &config.Config{Train: config.Train{Algorithm: "ppo"}, PPO: config.PPO{KLCoef: 0.001}}, n * (2 + 4 + 2 + 4 + 8 + 2)},
		{"ppo, train.kl_coef only", &config.Config{Train: config.Train{Algorithm: "ppo", KLCoef: 0.1}}, n * (2 + 4 + 2 + 4 + 8)},
		{"eval", nil, n * 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := planMemory(n, config.Policy{DType: "bfloat16"}, c.train).total(); got != c.want {
				t.Errorf("%d bytes, want %d: the KL reference counts when the algorithm's own coefficient is > 0", got, c.want)
			}
		})
	}
}

// recal eval --checkpoint RUN_DIR evaluates the run's checkpoints/best,
// else its checkpoints/last, and says which; a run folder without a
// checkpoint is a usage error.
func TestEvalCheckpointRunFolder(t *testing.T) {
	ck := testpolicy.Micro(t, "../..", 1)
	ckpt := func(t *testing.T, dir string) {
		t.Helper()
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		entries, _ := os.ReadDir(ck)
		for _, e := range entries {
			b, _ := os.ReadFile(filepath.Join(ck, e.Name()))
			os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644)
		}
		os.WriteFile(filepath.Join(dir, "optimizer.safetensors"), []byte("{}"), 0o644)
		os.WriteFile(filepath.Join(dir, "trainer_state.json"), []byte("{}"), 0o644)
	}
	cases := []struct {
		name  string
		links map[string]string // checkpoints/<name> → step-N
		code  int
		want  string // in the output
		not   string // not in it
	}{
		{"best and last", map[string]string{"best": "step-2", "last": "step-4"}, 0, "step-2", "step-4"},
		{"last only", map[string]string{"last": "step-4"}, 0, "step-4", "step-2"},
		{"no checkpoint yet", nil, 2, "no checkpoint yet", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			run := t.TempDir()
			os.MkdirAll(filepath.Join(run, "checkpoints"), 0o755)
			for name, target := range c.links {
				ckpt(t, filepath.Join(run, "checkpoints", target))
				if err := os.Symlink(target, filepath.Join(run, "checkpoints", name)); err != nil {
					t.Fatal(err)
				}
			}
			code, stdout, stderr := runCLI(t, "eval", "--config", "../../recal.toml", "--checkpoint", run, "--split", "ood",
				"--out", filepath.Join(t.TempDir(), "out"), "--dry-run")
			if code != c.code || !strings.Contains(stdout+stderr, c.want) || c.not != "" && strings.Contains(stdout+stderr, c.not) {
				t.Fatalf("exit status %d, want %d, and output mentioning %q, not %q:\n%s\n%s", code, c.code, c.want, c.not, stdout, stderr)
			}
		})
	}
}
