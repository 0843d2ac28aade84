package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/internal/testing/testpolicy"
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
		!strings.Contains(got[1], "NVIDIA_API_KEY (api_key_env) is not set") {
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
	// The memory plan per rank, phase by phase, float32 with the KL
	// reference (kl_coef > 0), against this machine's MemTotal.
	w := fmt.Sprintf("weights %.2f + KL reference %.2f + AdamW moments %.2f", float64(params*4)/(1<<30), float64(params*4)/(1<<30), float64(params*8)/(1<<30))
	want := []string{fmt.Sprintf("%d parameters", params), "memory       per rank (1 rank(s), float32 on cpu",
		"rollout ", "update ", "step ", w, "(MemTotal): fits",
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
	want := []string{fmt.Sprintf("rollout  "), fmt.Sprintf("weights %.2f + KV cache", float64(params*4)/(1<<30)),
		fmt.Sprintf("rollout %d rows", cfg.Eval.Batch), "(MemTotal): fits", "knn skipped"}
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
	if strings.Contains(stdout, "gradient") || strings.Contains(stdout, "update ") || strings.Contains(stdout, "nq ") {
		t.Errorf("eval's summary holds training memory or in-domain test sets:\n%s", stdout)
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("the dry run created --out")
	}
}

// A plan that does not fit the device is a problem naming the peak, the
// device's memory and where that number came from; a GPU without
// policy.device_memory gets the plan without a verdict.
func TestDryRunMemoryVerdict(t *testing.T) {
	ck := testpolicy.Micro(t, "../..", 1)
	run := filepath.Join(t.TempDir(), "run")
	for _, c := range []struct {
		name string
		sets []string
		code int
		want string
	}{
		{"too small", []string{"policy.device_memory=0.01"}, 2, "memory: peak "},
		{"fits", []string{"policy.device_memory=64"}, 0, "(policy.device_memory): fits"},
		{"gpu, unknown", []string{"policy.device=cuda"}, 0, "the device's memory is unknown: set policy.device_memory"},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := []string{"train", "--config", "../../recal.toml", "--set", "policy.checkpoint=" + ck, "--dry-run", "--run-dir", run}
			for _, s := range c.sets {
				args = append(args, "--set", s)
			}
			code, stdout, stderr := runCLI(t, args...)
			if code != c.code || !strings.Contains(stdout+stderr, c.want) {
				t.Fatalf("exit status %d, want %d, and output with %q:\n%s\n%s", code, c.code, c.want, stdout, stderr)
			}
			if c.code == 2 {
				got := problemLines(t, stderr)
				if len(got) != 1 || !strings.Contains(got[0], "does NOT fit") || !strings.Contains(got[0], "of 0.01 GiB (policy.device_memory)") {
					t.Errorf("problems %q; want one saying the plan does NOT fit 0.01 GiB (policy.device_memory)", got)
				}
			}
		})
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
			for _, ts := range cfg.Params() {
				got = append(got, fmt.Sprint(ts.Name, ts.Shape))
				n += ts.Numel()
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

// A dry run ends at the first SIGINT or SIGTERM (its context), with exit
// status 130, even while a check still reads: before, "stopping cleanly"
// was printed and the dry run went on reading.
func TestDryRunUntilSignal(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	block := make(chan struct{})
	defer close(block)
	done := make(chan error, 1)
	go func() { done <- dryRunUntil(ctx, func() error { <-block; return nil }) }()
	cancel()
	select {
	case err := <-done:
		var ee exitError
		if !errors.As(err, &ee) || ee.code != 130 || !strings.Contains(err.Error(), "dry run stopped") {
			t.Fatalf("dry run at the first signal: %v; want exit status 130 saying it stopped", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the dry run went on 5 s after its context ended")
	}
	want := errors.New("a problem")
	if err := dryRunUntil(context.Background(), func() error { return want }); err != want {
		t.Fatalf("dryRunUntil = %v; want the dry run's own result", err)
	}
}
