package trainer_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/trainer"
)

// ppoSets are the keys of a short PPO run of the micro policy: the warm-up
// gives the KL reference (in the reward, weighed by ppo.kl_coef, another
// value than testConfig's train.kl_coef), the cost term is on.
var ppoSets = []string{"train.algorithm=ppo", "ppo.cost_coef=0.3", "ppo.value_clip=0.2", "ppo.lam=0.95", "ppo.value_lr=3e-2", "ppo.kl_coef=0.02"}

func gaeReference(t *testing.T, run string) (int, float64, string) {
	t.Helper()
	var py string
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if exec.Command(p, "-c", "import tomllib").Run() == nil {
			py = p
			break
		}
	}
	if py == "" {
		t.Skip("no python3 with tomllib (3.11+): cannot run testdata/gae_reference.py")
	}
	out, err := exec.Command(py, filepath.Join("testdata", "gae_reference.py"), "check", run).CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	d := math.NaN()
	if m := regexp.MustCompile(`max \|recomputed - logged\| = (\S+)`).FindSubmatch(out); m != nil {
		d, _ = strconv.ParseFloat(string(m[1]), 64)
	}
	return code, d, string(out)
}

// A short PPO run: every advantage and return the loss used equals the
// independent reference recomputed from the logged rewards, KL terms and
// values (trainer/testdata/gae_reference.py); metrics.jsonl carries the
// value loss and the explained variance; checkpoints hold the value head
// beside a model.safetensors without it.
func TestPPOMatchesReference(t *testing.T) {
	if err := rollout.SetThreads(2); err != nil {
		t.Fatal(err)
	}
	ck := microCheckpoint(t)
	run := filepath.Join(t.TempDir(), "run")
	cfg := testConfig(t, ck, append(ppoSets, "train.steps=3", "train.checkpoint_every=3", "train.validate_every=0")...)
	if err := trainer.Train(context.Background(), cfg.Training(), trainer.Options{RunDir: run}); err != nil {
		t.Fatal(err)
	}
	code, d, out := gaeReference(t, run)
	if code != 0 || !(d <= 1e-6) {
		t.Fatalf("gae_reference.py check: exit %d, max diff %v; want 0 and ≤ 1e-6\n%s", code, d, out)
	}
	t.Logf("gae_reference.py check on a 3-step PPO run: max |recomputed − logged| = %g", d)

	metrics := readJSONL(t, filepath.Join(run, "metrics.jsonl"))
	for _, m := range metrics {
		for _, k := range []string{"value_loss", "explained_variance", "value_clip_frac", "value_mean", "return_mean", "score"} {
			if v, ok := m[k].(float64); !ok || math.IsNaN(v) {
				t.Errorf("step %v: %s = %v, want a number", m["step"], k, m[k])
			}
		}
		t.Logf("step %v: value_loss %.4f explained_variance %.3f value_mean %.3f return_mean %.3f score %.3f",
			m["step"], m["value_loss"], m["explained_variance"], m["value_mean"], m["return_mean"], m["score"])
	}
	rolls := readJSONL(t, filepath.Join(run, "rollouts.jsonl"))
	moved := false
	for _, r := range rolls {
		p, ok := r["ppo"].(map[string]any)
		if !ok {
			t.Fatalf("rollout line without a ppo record: %v", r)
		}
		if p["kl"] == nil {
			t.Fatalf("step %v: a ppo record without KL terms: ppo.kl_coef = 0.02 must keep the reference", r["step"])
		}
		if r["step"].(float64) > 1 {
			for _, v := range p["values"].([]any) {
				moved = moved || v.(float64) != 0
			}
		}
		if len(p["values"].([]any)) != int(r["policy_tokens"].(float64)) {
			t.Errorf("step %v: %d values for %v policy tokens", r["step"], len(p["values"].([]any)), r["policy_tokens"])
		}
	}
	if !moved {
		t.Error("every value after the first update is 0: the value head did not learn")
	}
	last := filepath.Join(run, "checkpoints", "last")
	if _, err := os.Stat(filepath.Join(last, "value_head.safetensors")); err != nil {
		t.Errorf("the checkpoint lacks the value head: %v", err)
	}
	w, err := hfmodel.OpenWeights(last)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for _, n := range w.Names() {
		if strings.HasPrefix(n, "value_head.") {
			t.Errorf("model.safetensors holds %s: the Hugging Face folder would not load as Qwen2", n)
		}
	}
}

// An interrupted PPO run resumed from its checkpoint continues exactly as
// the uninterrupted one: the value head, its optimizer state and the cost
// window come back with the checkpoint.
func TestPPOResumeMatchesUninterrupted(t *testing.T) {
	if err := rollout.SetThreads(2); err != nil {
		t.Fatal(err)
	}
	ck := microCheckpoint(t)
	cfg := testConfig(t, ck, append(ppoSets, "sft.steps=0", "ppo.kl_coef=0", "train.checkpoint_every=1", "train.validate_every=0")...)
	full := filepath.Join(t.TempDir(), "full")
	if err := trainer.Train(context.Background(), cfg.Training(), trainer.Options{RunDir: full}); err != nil {
		t.Fatal(err)
	}
	part := filepath.Join(t.TempDir(), "part")
	if err := trainer.Train(context.Background(), cfg.Training(), trainer.Options{RunDir: part, StopAfter: 2}); !errors.Is(err, trainer.ErrInterrupted) {
		t.Fatalf("stopping after 2 steps: %v, want ErrInterrupted", err)
	}
	if err := trainer.Train(context.Background(), cfg.Training(), trainer.Options{RunDir: part, Resume: true}); err != nil {
		t.Fatalf("resume: %v", err)
	}
	a, b := readJSONL(t, filepath.Join(full, "metrics.jsonl")), readJSONL(t, filepath.Join(part, "metrics.jsonl"))
	if len(a) != len(b) || len(a) != 4 {
		t.Fatalf("uninterrupted run logged %d steps, resumed run %d; want 4", len(a), len(b))
	}
	timing := map[string]bool{"step_time_s": true, "rollout_time_s": true, "score_time_s": true, "update_time_s": true, "tokens_per_s": true}
	for i := range a {
		for k, v := range a[i] {
			if !timing[k] && fmt.Sprint(v) != fmt.Sprint(b[i][k]) {
				t.Errorf("step %v: %s = %v uninterrupted, %v resumed", a[i]["step"], k, v, b[i][k])
			}
		}
	}
	ra, rb := readJSONL(t, filepath.Join(full, "rollouts.jsonl")), readJSONL(t, filepath.Join(part, "rollouts.jsonl"))
	for i := range ra {
		if p, _ := ra[i]["ppo"].(map[string]any); p == nil || p["kl"] != nil {
			t.Fatalf("rollout line %d: ppo record %v; want one without KL terms: ppo.kl_coef = 0 keeps no reference, whatever train.kl_coef", i+1, ra[i]["ppo"])
		}
		if fmt.Sprint(ra[i]["ppo"]) != fmt.Sprint(rb[i]["ppo"]) {
			t.Errorf("rollout line %d: the ppo records differ between the runs", i+1)
		}
	}
	for _, f := range []string{"value_head.safetensors", "model.safetensors", "optimizer.safetensors"} {
		x, err := os.ReadFile(filepath.Join(full, "checkpoints", "last", f))
		if err != nil {
			t.Fatal(err)
		}
		y, err := os.ReadFile(filepath.Join(part, "checkpoints", "last", f))
		if err != nil {
			t.Fatal(err)
		}
		if string(x) != string(y) {
			t.Errorf("%s differs between the uninterrupted and the resumed run", f)
		}
	}
	if code, d, out := gaeReference(t, part); code != 0 {
		t.Errorf("gae_reference.py check on the resumed run: exit %d (max diff %v)\n%s", code, d, out)
	}
	// A resume from a checkpoint without the value head is refused.
	if err := os.Remove(filepath.Join(part, "checkpoints", "last", "value_head.safetensors")); err != nil {
		t.Fatal(err)
	}
	longer := testConfig(t, ck, append(ppoSets, "sft.steps=0", "ppo.kl_coef=0", "train.checkpoint_every=1", "train.validate_every=0", "train.steps=5")...)
	err := trainer.Train(context.Background(), longer.Training(), trainer.Options{RunDir: part, Resume: true})
	if err == nil || !strings.Contains(err.Error(), "value_head.safetensors") {
		t.Errorf("resuming from a checkpoint without its value head: %v, want an error naming value_head.safetensors", err)
	}
}

// An unknown train.algorithm stops the job before anything is written, with
// an error that lists the known algorithms.
func TestUnknownAlgorithm(t *testing.T) {
	ck := microCheckpoint(t)
	run := filepath.Join(t.TempDir(), "run")
	err := trainer.Train(context.Background(), testConfig(t, ck, "train.algorithm=dpo").Training(), trainer.Options{RunDir: run})
	if err == nil || !strings.Contains(err.Error(), `"dpo"`) || !strings.Contains(err.Error(), "grpo, ppo") {
		t.Fatalf("train.algorithm = dpo: %v, want an error naming it and listing grpo, ppo", err)
	}
	if _, err := os.Stat(run); !os.IsNotExist(err) {
		t.Error("the run folder was created for an unknown algorithm")
	}
	if got := strings.Join(trainer.Algorithms(), ","); got != "grpo,ppo" {
		t.Errorf("Algorithms() = %s, want grpo,ppo", got)
	}
}
