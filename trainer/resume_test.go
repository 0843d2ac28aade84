package trainer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/recal-project/recal/calibration"
	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/internal/runlock"
	"github.com/recal-project/recal/llmpool"
	"github.com/recal-project/recal/trainer"
)

// A job failing at start (bad data folder, missing API key, unloadable
// policy checkpoint) leaves no run folder behind, so that the second attempt
// with the problem fixed runs without --resume and without deleting anything.
func TestFailedStartLeavesNoRunFolder(t *testing.T) {
	if err := rollout.SetThreads(2); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"choices":[{"message":{"role":"assistant","content":"The answer is Paris."}}],"usage":{"prompt_tokens":9,"completion_tokens":5}}`)
	}))
	defer srv.Close()
	ck := microCheckpoint(t)
	small := []string{"sft.steps=0", "train.steps=1", "train.validate_every=0", "data.val_per_dataset=1"}
	withRemote := func(cfg config.Config) config.Config {
		cfg.Pool.Models = append(cfg.Pool.Models, llmpool.ModelConfig{Name: "remote", Description: "an OpenAI-compatible endpoint",
			Provider: "openai", OpenAI: &llmpool.OpenAIConfig{BaseURL: srv.URL + "/v1", Model: "m", APIKeyEnv: "RECAL_TEST_START_KEY"}})
		cfg.Pool.SetDefaults()
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	cases := []struct {
		name string
		bad  config.Config
		good config.Config
		fix  func(t *testing.T) // makes the environment right for good
		want string             // in the error of bad
	}{
		{"data folder missing", testConfig(t, ck, append(small, "data.dir="+filepath.Join(t.TempDir(), "nope"))...),
			testConfig(t, ck, small...), func(*testing.T) {}, "nope"},
		{"policy checkpoint unloadable", testConfig(t, t.TempDir(), small...),
			testConfig(t, ck, small...), func(*testing.T) {}, "tokenizer"},
		{"API key missing", withRemote(testConfig(t, ck, small...)), withRemote(testConfig(t, ck, small...)),
			func(t *testing.T) { t.Setenv("RECAL_TEST_START_KEY", "sk-test") }, "RECAL_TEST_START_KEY"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			os.Unsetenv("RECAL_TEST_START_KEY")
			run := filepath.Join(t.TempDir(), "runs", "x")
			err := trainer.Train(context.Background(), c.bad.Training(), trainer.Options{RunDir: run})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("first attempt: error %v, want one mentioning %q", err, c.want)
			}
			if _, err := os.Stat(run); !os.IsNotExist(err) {
				t.Fatalf("the failed start left the run folder %s (%v): the next attempt would need --resume or a cleanup", run, err)
			}
			c.fix(t)
			if err := trainer.Train(context.Background(), c.good.Training(), trainer.Options{RunDir: run}); err != nil {
				t.Fatalf("second attempt, problem fixed, no --resume: %v", err)
			}
		})
	}
}

// A run folder another process works in is refused at once, naming that
// process, before anything is loaded or written: two runs on one folder
// would interleave their logs and checkpoints.
func TestTrainRefusesARunFolderInUse(t *testing.T) {
	ck := microCheckpoint(t)
	run := filepath.Join(t.TempDir(), "run")
	held, err := runlock.Acquire(run, "recal ablate")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	for _, resume := range []bool{false, true} {
		err := trainer.Train(context.Background(), testConfig(t, ck, "sft.steps=0", "train.steps=1").Training(), trainer.Options{RunDir: run, Resume: resume})
		want := fmt.Sprintf("in use by pid %d", os.Getpid())
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("train (resume %v) on a folder in use: %v; want an error saying %q", resume, err, want)
		}
		entries, _ := os.ReadDir(run)
		if len(entries) != 1 || entries[0].Name() != runlock.File {
			t.Fatalf("the refused run wrote into the folder in use: it holds %v, want the holder's %s alone", entries, runlock.File)
		}
	}
}

// A resume whose training keys differ from the run's is refused, naming each
// key with both values, and changes nothing; operational keys may change;
// --allow-config-change continues, keeps config.toml and records the change
// with the step it took effect at, so that the advantage reference check
// still reproduces every step.
func TestResumeConfigChange(t *testing.T) {
	if err := rollout.SetThreads(2); err != nil {
		t.Fatal(err)
	}
	ck := microCheckpoint(t)
	base := []string{"sft.steps=0", "train.steps=4", "train.checkpoint_every=1", "train.validate_every=0"}
	cfg := testConfig(t, ck, base...)
	run := filepath.Join(t.TempDir(), "run")
	ctx := context.Background()
	if err := trainer.Train(ctx, cfg.Training(), trainer.Options{RunDir: run, StopAfter: 1}); !errors.Is(err, trainer.ErrInterrupted) {
		t.Fatalf("stopping after a step: %v, want ErrInterrupted", err)
	}
	// Operational keys only: no flag needed, nothing recorded.
	ops := testConfig(t, ck, append(base, "train.log_every=3", "policy.threads=1", "train.validate_every=5", "eval.batch=2")...)
	if err := trainer.Train(ctx, ops.Training(), trainer.Options{RunDir: run, Resume: true, StopAfter: 1}); !errors.Is(err, trainer.ErrInterrupted) {
		t.Fatalf("resume with operational changes only: %v, want it to run (and stop after a step)", err)
	}
	if _, err := os.Stat(filepath.Join(run, "config-changes.jsonl")); !os.IsNotExist(err) {
		t.Errorf("a resume changing only operational keys recorded a configuration change")
	}
	before := snapshotFiles(t, run, "config.toml", "metrics.jsonl", "rollouts.jsonl")

	changed := testConfig(t, ck, append(base, "calibration.dataset_normalization=false", "train.lr=0.02", "train.log_every=7")...)
	err := trainer.Train(ctx, changed.Training(), trainer.Options{RunDir: run, Resume: true})
	var mismatch *trainer.ConfigMismatchError
	if !errors.As(err, &mismatch) {
		t.Fatalf("resume with changed training keys: %v, want a ConfigMismatchError", err)
	}
	var keys []string
	for _, c := range mismatch.Changes {
		keys = append(keys, c.Key)
	}
	if fmt.Sprint(keys) != "[calibration.dataset_normalization train.lr]" {
		t.Errorf("refusal names the keys %v, want exactly the two training keys changed (train.log_every is operational)", keys)
	}
	for _, want := range []string{"calibration.dataset_normalization: true in the run, false now", "train.lr: 0.01 in the run, 0.02 now", "step 3"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	for name, b := range before {
		if now, _ := os.ReadFile(filepath.Join(run, name)); string(now) != string(b) {
			t.Errorf("the refused resume changed %s", name)
		}
	}
	for _, name := range []string{"config-changes.jsonl", "config-3.toml"} {
		if _, err := os.Stat(filepath.Join(run, name)); !os.IsNotExist(err) {
			t.Errorf("the refused resume wrote %s", name)
		}
	}

	if err := trainer.Train(ctx, changed.Training(), trainer.Options{RunDir: run, Resume: true, AllowConfigChange: true}); err != nil {
		t.Fatalf("resume allowing the change: %v", err)
	}
	if now, _ := os.ReadFile(filepath.Join(run, "config.toml")); string(now) != string(before["config.toml"]) {
		t.Errorf("the resume replaced config.toml, the configuration steps 1-2 ran with")
	}
	events := readJSONL(t, filepath.Join(run, "config-changes.jsonl"))
	if len(events) != 1 {
		t.Fatalf("config-changes.jsonl has %d lines, want 1", len(events))
	}
	ev, _ := json.Marshal(events[0])
	for _, want := range []string{`"step":3`, `"resumed_from":"step-2"`, `{"key":"calibration.dataset_normalization","new":false,"old":true}`, `{"key":"train.lr","new":0.02,"old":0.01}`} {
		if !strings.Contains(string(ev), want) {
			t.Errorf("config-changes.jsonl line %s lacks %s", ev, want)
		}
	}
	third, err := config.Load(filepath.Join(run, "config-3.toml"), nil)
	if err != nil {
		t.Fatalf("config-3.toml: %v", err)
	}
	if third.Calibration.DatasetNormalization || third.Train.LR != 0.02 {
		t.Errorf("config-3.toml does not hold the new values: dataset_normalization %v, lr %v", third.Calibration.DatasetNormalization, third.Train.LR)
	}
	if n := len(readJSONL(t, filepath.Join(run, "metrics.jsonl"))); n != 4 {
		t.Errorf("%d metrics lines, want 4", n)
	}

	// The reference recomputes every step of the run (with config-3.toml
	// from step 3 on; see TestReferenceCheckPerStepConfig).
	if py := python3(t); py != "" {
		script := filepath.Join("..", "calibration", "testdata", "reference.py")
		if out, err := exec.Command(py, script, "check", run).CombinedOutput(); err != nil {
			t.Errorf("reference.py check on the changed run: %v\n%s", err, out)
		}
	}
}

// reference.py check takes each step's [calibration] from the configuration
// the step ran with: config.toml, then config-K.toml from step K on.
func TestReferenceCheckPerStepConfig(t *testing.T) {
	py := python3(t)
	if py == "" {
		t.Skip("no python3 with tomllib (3.11+)")
	}
	run := t.TempDir()
	first := testConfig(t, microCheckpoint(t))
	second := first
	second.Calibration.DatasetNormalization = false
	second.Calibration.Weights.Info = 2
	var lines []string
	for step := 1; step <= 4; step++ {
		cal := first.Calibration
		if step >= 3 {
			cal = second.Calibration
		}
		var batch []calibration.Response
		for i := range 8 {
			x := float64((i*7+step*3)%5) / 4
			batch = append(batch, calibration.Response{Group: i / 2, Dataset: []string{"nq", "hotpotqa"}[i/4], Raw: [calibration.NumComponents]float64{x, 1 - x, float64(i % 2), x / 2, 0.5}})
		}
		res, err := calibration.Calibrate(cal, batch)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range batch {
			b, _ := json.Marshal(map[string]any{"step": step, "group": r.Group, "dataset": r.Dataset, "advantage": res.Advantages[i],
				"rewards_raw": map[string]float64{"ans": r.Raw[0], "info": r.Raw[1], "format": r.Raw[2], "route": r.Raw[3], "balance": r.Raw[4]}})
			lines = append(lines, string(b))
		}
	}
	os.WriteFile(filepath.Join(run, "rollouts.jsonl"), []byte(strings.Join(lines, "\n")+"\n"), 0o644)
	if err := first.Write(filepath.Join(run, "config.toml")); err != nil {
		t.Fatal(err)
	}
	if err := second.Write(filepath.Join(run, "config-3.toml")); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join("..", "calibration", "testdata", "reference.py")
	if out, err := exec.Command(py, script, "check", run).CombinedOutput(); err != nil {
		t.Errorf("check with config-3.toml: %v, want a pass\n%s", err, out)
	}
	os.Remove(filepath.Join(run, "config-3.toml"))
	if out, err := exec.Command(py, script, "check", run).CombinedOutput(); err == nil {
		t.Errorf("check with config.toml for every step passed, want a failure at steps 3-4 (else this test proves nothing)\n%s", out)
	}
}

func snapshotFiles(t *testing.T, dir string, names ...string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		out[n] = b
	}
	return out
}

// python3 finds a Python 3.11+ (tomllib) for the reference script, or "".
func python3(t *testing.T) string {
	t.Helper()
	if path, err := exec.LookPath("python3"); err == nil && exec.Command(path, "-c", "import tomllib").Run() == nil {
		return path
	}
	t.Log("no python3 with tomllib (3.11+): reference.py check not run")
	return ""
}
