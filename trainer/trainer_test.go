package trainer_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/internal/testing/testenv"
	"github.com/recal-project/recal/internal/testing/testpolicy"
	"github.com/recal-project/recal/router"
	"github.com/recal-project/recal/torchbridge"
	"github.com/recal-project/recal/trainer"
)

func microCheckpoint(t *testing.T) string { return testpolicy.Micro(t, "..", 1) }

func params(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	w, err := hfmodel.OpenWeights(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	out := map[string][]byte{}
	for _, n := range w.Names() {
		tn, _ := w.Lookup(n)
		b, err := w.Read(tn)
		if err != nil {
			t.Fatal(err)
		}
		out[n] = b
	}
	return out
}

// A few GRPO steps keep the loss finite and change every parameter; the run
// folder holds what the trainer promises.
func TestTrainLearns(t *testing.T) {
	if err := rollout.SetThreads(2); err != nil {
		t.Fatal(err)
	}
	ck := microCheckpoint(t)
	run := filepath.Join(t.TempDir(), "run")
	if err := trainer.Train(context.Background(), testConfig(t, ck).Training(), trainer.Options{RunDir: run}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"config.toml", "metrics.jsonl", "rollouts.jsonl", "validation.jsonl", "sft.jsonl",
		"checkpoints/step-2/model.safetensors", "checkpoints/step-4/optimizer.safetensors", "checkpoints/last/trainer_state.json", "checkpoints/sft/config.json"} {
		if _, err := os.Stat(filepath.Join(run, f)); err != nil {
			t.Errorf("run folder lacks %s", f)
		}
	}
	metrics := readJSONL(t, filepath.Join(run, "metrics.jsonl"))
	if len(metrics) != 4 {
		t.Fatalf("%d metrics lines, want 4", len(metrics))
	}
	for _, m := range metrics {
		for _, k := range []string{"loss", "grad_norm", "entropy", "kl"} {
			v, ok := m[k].(float64)
			if !ok || math.IsNaN(v) || math.IsInf(v, 0) {
				t.Errorf("step %v: %s = %v, want a finite number", m["step"], k, m[k])
			}
		}
		if m["grad_norm"].(float64) <= 0 {
			t.Errorf("step %v: zero gradient", m["step"])
		}
	}
	before, after := params(t, filepath.Join(run, "checkpoints", "sft")), params(t, filepath.Join(run, "checkpoints", "step-4"))
	for name, b := range before {
		if string(b) == string(after[name]) {
			t.Errorf("parameter %s did not change over 4 GRPO steps", name)
		}
	}
	rolls := readJSONL(t, filepath.Join(run, "rollouts.jsonl"))
	if len(rolls) != 4*2*2 {
		t.Fatalf("%d rollout lines, want 16", len(rolls))
	}
	for _, r := range rolls {
		raw, ok := r["rewards_raw"].(map[string]any)
		if !ok || len(raw) != len(router.Components) {
			t.Fatalf("rollout line without the %d raw rewards: %v", len(router.Components), r)
		}
		if _, ok := r["advantage"].(float64); !ok {
			t.Fatalf("rollout line without an advantage: %v", r)
		}
	}
	cfgText, _ := os.ReadFile(filepath.Join(run, "config.toml"))
	if !strings.Contains(string(cfgText), "tau_min") || !strings.Contains(string(cfgText), "batch_size = 2") {
		t.Errorf("config.toml is not the resolved config:\n%s", cfgText)
	}
}

// An interrupted run resumed from its checkpoint continues exactly as the
// uninterrupted run does: the same metrics (the learning rate of each step
// included, which follows train.lr_schedule from the checkpoint's step), the
// same weights and the same checkpoints/best.
func TestResumeMatchesUninterrupted(t *testing.T) {
	if err := rollout.SetThreads(2); err != nil {
		t.Fatal(err)
	}
	ck := microCheckpoint(t)
	cases := []struct {
		name string
		sets []string
	}{
		{"constant lr", []string{"train.checkpoint_every=1"}},
		// Validation every step and checkpoints every third: each new best
		// is a checkpoint of its own; the interruption after step 2 falls
		// inside the cosine decay; half the prompts list a random subset
		// of the pool (train.model_subsets).
		{"cosine after a warm-up, best between checkpoints, model subsets", []string{"train.lr_schedule=cosine", "train.warmup_steps=1",
			"train.min_lr_ratio=0.1", "train.checkpoint_every=3", "train.validate_every=1", "train.model_subsets=0.5"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig(t, ck, append([]string{"sft.steps=0"}, c.sets...)...)
			full := filepath.Join(t.TempDir(), "full")
			if err := trainer.Train(context.Background(), cfg.Training(), trainer.Options{RunDir: full}); err != nil {
				t.Fatal(err)
			}
			part := filepath.Join(t.TempDir(), "part")
			err := trainer.Train(context.Background(), cfg.Training(), trainer.Options{RunDir: part, StopAfter: 2})
			if !errors.Is(err, trainer.ErrInterrupted) {
				t.Fatalf("stopping after 2 steps: %v, want ErrInterrupted", err)
			}
			// Simulate a kill during step 3's logging: a torn line at the end.
			f, _ := os.OpenFile(filepath.Join(part, "metrics.jsonl"), os.O_APPEND|os.O_WRONLY, 0)
			f.WriteString(`{"step":3,"reward":{"an`)
			f.Close()
			if err := trainer.Train(context.Background(), cfg.Training(), trainer.Options{RunDir: part, Resume: true}); err != nil {
				t.Fatalf("resume: %v", err)
			}
			a, b := readJSONL(t, filepath.Join(full, "metrics.jsonl")), readJSONL(t, filepath.Join(part, "metrics.jsonl"))
			if len(a) != len(b) {
				t.Fatalf("uninterrupted run logged %d steps, resumed run %d", len(a), len(b))
			}
			timing := map[string]bool{"step_time_s": true, "rollout_time_s": true, "score_time_s": true, "update_time_s": true, "tokens_per_s": true}
			for i := range a {
				for k, v := range a[i] {
					if timing[k] {
						continue
					}
					if fmt.Sprint(v) != fmt.Sprint(b[i][k]) {
						t.Errorf("step %v: %s = %v uninterrupted, %v resumed", a[i]["step"], k, v, b[i][k])
					}
				}
				// The phases' times are each step's own; memory peaks are a GPU's.
				if ut, _ := a[i]["update_time_s"].(float64); ut <= 0 || ut > a[i]["step_time_s"].(float64) {
					t.Errorf("step %v: update_time_s %v, want within (0, step_time_s %v]", a[i]["step"], a[i]["update_time_s"], a[i]["step_time_s"])
				}
				if _, ok := a[i]["device_peak_gib"]; ok {
					t.Errorf("step %v: device_peak_gib on the CPU", a[i]["step"])
				}
				if want := cfg.Train.LR * cfg.Train.LRFactor(i+1); math.Abs(a[i]["lr"].(float64)-want) > 1e-12*want {
					t.Errorf("step %d: lr %v in metrics.jsonl, want train.lr × LRFactor = %v", i+1, a[i]["lr"], want)
				}
			}
			wa, wb := params(t, filepath.Join(full, "checkpoints", "last")), params(t, filepath.Join(part, "checkpoints", "last"))
			for name := range wa {
				if string(wa[name]) != string(wb[name]) {
					x := math.Float32frombits(binary.LittleEndian.Uint32(wa[name]))
					y := math.Float32frombits(binary.LittleEndian.Uint32(wb[name]))
					t.Errorf("final %s differs between the runs (first element %v vs %v)", name, x, y)
				}
			}
			// checkpoints/best is the first validation with the highest
			// mean well-formed F1, in both runs.
			for _, run := range []string{full, part} {
				best, bestF1 := "", -1.0
				for _, v := range readJSONL(t, filepath.Join(run, "validation.jsonl")) {
					if f1 := v["avg"].(map[string]any)["f1_well_formed"].(float64); f1 > bestF1 {
						best, bestF1 = fmt.Sprintf("step-%v", v["step"]), f1
					}
				}
				if got, err := os.Readlink(filepath.Join(run, "checkpoints", "best")); err != nil || got != best {
					t.Errorf("%s: checkpoints/best names %q (%v), want %s, the first validation with the highest F1 %.3f", filepath.Base(run), got, err, best, bestF1)
				}
			}
		})
	}
}

// A real OpenAI-compatible endpoint (an httptest server) in the pool: the
// API key, set in the environment, appears in no file the run writes; a
// missing key stops the job before anything is written.
func TestSecretsStayOut(t *testing.T) {
	if err := rollout.SetThreads(2); err != nil {
		t.Fatal(err)
	}
	const secret = "sk-recal-test-7f3a9c1e5b"
	var calls atomic.Int64 // the handler runs on concurrent requests
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.Header.Get("Authorization") != "Bearer "+secret {
			http.Error(w, `{"error":{"message":"bad key"}}`, 401)
			return
		}
		fmt.Fprint(w, `{"choices":[{"message":{"role":"assistant","content":"The answer is Paris."}}],"usage":{"prompt_tokens":9,"completion_tokens":5}}`)
	}))
	defer srv.Close()
	ck := microCheckpoint(t)
	base := filepath.Join(t.TempDir(), "recal.toml")
	text, _ := os.ReadFile("../recal.toml")
	extra := fmt.Sprintf(`
[[pool.models]]
name = "remote"
description = "an OpenAI-compatible endpoint"
provider = "openai"
  [pool.models.openai]
  base_url = "%s/v1"
  model = "test-model"
  api_key_env = "RECAL_TEST_KEY"
`, srv.URL)
	// The [[pool.models]] array must stay inside [pool]: insert before [router].
	cfgText := strings.Replace(string(text), "\n[router]", extra+"\n[router]", 1)
	if err := os.WriteFile(base, []byte(cfgText), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Symlink(filepath.Join(mustAbs(t, ".."), "data"), filepath.Join(filepath.Dir(base), "data"))
	os.Symlink(filepath.Join(mustAbs(t, ".."), "router"), filepath.Join(filepath.Dir(base), "router"))
	cache := filepath.Join(t.TempDir(), "cache")
	sets := []string{"policy.checkpoint=" + ck, "pool.cache=read-write", "pool.cache_dir=" + cache, "sft.steps=2", "sft.batch_size=8",
		"train.steps=1", "train.batch_size=2", "train.group_size=2", "data.val_per_dataset=2", "router.turn_tokens=8"}
	cfg, err := config.Load(base, sets)
	if err != nil {
		t.Fatal(err)
	}
	run := filepath.Join(t.TempDir(), "run")
	t.Setenv("RECAL_TEST_KEY", "")
	os.Unsetenv("RECAL_TEST_KEY")
	err = trainer.Train(context.Background(), cfg.Training(), trainer.Options{RunDir: run})
	if err == nil || !strings.Contains(err.Error(), "RECAL_TEST_KEY") {
		t.Fatalf("missing API key: %v, want an error naming RECAL_TEST_KEY", err)
	}
	if _, err := os.Stat(run); !os.IsNotExist(err) {
		t.Errorf("the run folder was created before the missing key was noticed")
	}
	t.Setenv("RECAL_TEST_KEY", secret)
	if err := trainer.Train(context.Background(), cfg.Training(), trainer.Options{RunDir: run}); err != nil {
		t.Fatal(err)
	}
	if calls.Load() == 0 {
		t.Fatal("no request reached the endpoint; the test would prove nothing")
	}
	for _, dir := range []string{run, cache} {
		filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
			if err != nil || info.IsDir() {
				return err
			}
			b, _ := os.ReadFile(path)
			if strings.Contains(string(b), secret) {
				t.Errorf("%s contains the API key", path)
			}
			return nil
		})
	}
}

func mustAbs(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// sft.answer_weight scales the loss weight of exactly the answer turn's
// tokens of a demonstration; everything else is unchanged.
func TestDemoAnswerWeight(t *testing.T) {
	ck := microCheckpoint(t)
	cfg := testConfig(t, ck, "router.info_tokens=32") // the whole reply, answer included
	eng, err := rollout.OpenEngine(ck, torchbridge.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	env, err := rollout.NewEnv(cfg.Rollout(), eng, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	qs := []data.Example{
		{ID: "nq-1", Dataset: "nq", Question: "who wrote the iliad", Golden: []string{"Homer"}},
		{ID: "hotpotqa-2", Dataset: "hotpotqa", Question: "Which river flows through the capital of Egypt?", Golden: []string{"Nile"}},
	}
	ctx := context.Background()
	plain, err := trainer.BuildDemos(ctx, env, qs, 7, 1)
	if err != nil {
		t.Fatal(err)
	}
	heavy, err := trainer.BuildDemos(ctx, env, qs, 7, 3)
	if err != nil {
		t.Fatal(err)
	}
	for i := range plain {
		p, h := plain[i], heavy[i]
		if fmt.Sprint(p.Tokens) != fmt.Sprint(h.Tokens) {
			t.Fatalf("demo %d: the weight changed the tokens", i)
		}
		var span []int
		for k := range p.Mask {
			switch {
			case h.Mask[k] == 3 && p.Mask[k] == 1:
				span = append(span, int(p.Tokens[k]))
			case h.Mask[k] != p.Mask[k]:
				t.Fatalf("demo %d token %d: mask %v with weight 3, %v with weight 1", i, k, h.Mask[k], p.Mask[k])
			}
		}
		text := eng.Tok.Decode(span)
		if !strings.HasPrefix(text, "<answer> ") || !strings.HasSuffix(text, "</answer>") {
			t.Errorf("demo %d: the weighted tokens decode to %q, want the answer turn with a space before the answer", i, text)
			continue
		}
		// The answer's first token is one the reply has ("The answer is
		// Nile." → " Nile"), so answering is copying.
		first := span[len(eng.Tok.Encode("<answer>"))]
		if !slices.Contains(p.Tokens[:len(p.Tokens)-len(span)], int32(first)) {
			t.Errorf("demo %d: the answer's first token %q is not in the prompt or the reply", i, eng.Tok.Decode([]int{first}))
		}
	}

	// A reply that states no answer (here every call fails: "[pool error:
	// …]") gives none to copy: the demonstration ends with the reply, and
	// only its think and search turn train.
	failing := testConfig(t, ck, "router.info_tokens=32")
	for i := range failing.Pool.Models {
		failing.Pool.Models[i].Sim.FailureRate = 1
	}
	fenv, err := rollout.NewEnv(failing.Rollout(), eng, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer fenv.Close()
	failed, err := trainer.BuildDemos(ctx, fenv, qs, 7, 3)
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range failed {
		ids := make([]int, len(d.Tokens))
		for k, v := range d.Tokens {
			ids[k] = int(v)
		}
		text := eng.Tok.Decode(ids)
		if !strings.HasSuffix(strings.TrimSpace(text), router.InfoClose) || !strings.Contains(text, "pool error") {
			t.Errorf("demo %d of a failed call: %q, want it to end with the error's information block", i, text)
		}
		for k, m := range d.Mask {
			if m != 0 && m != 1 {
				t.Errorf("demo %d of a failed call: token %d weighs %v, want no answer turn", i, k, m)
			}
		}
		if slices.Index(d.Mask, 1) < 0 {
			t.Errorf("demo %d of a failed call trains nothing, want its think and search turn", i)
		}
	}
}

// optimizerStep reads the AdamW step count a checkpoint's
// optimizer.safetensors holds, and whether its first moments are all zero.
func optimizerStep(t *testing.T, ckpt string) (step string, zeroMoments bool) {
	t.Helper()
	w, err := hfmodel.OpenWeightsFile(filepath.Join(ckpt, "optimizer.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	zeroMoments = true
	for _, n := range w.Names() {
		if !strings.HasPrefix(n, "exp_avg/") {
			continue
		}
		tn, _ := w.Lookup(n)
		b, err := w.Read(tn)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range b {
			zeroMoments = zeroMoments && x == 0
		}
	}
	return w.Metadata()["step"], zeroMoments
}

// train.reset_optimizer_after_sft: GRPO starts from a fresh AdamW (step 0,
// zero moments) after the warm-up, or, when false, continues the warm-up's.
func TestResetOptimizerAfterSFT(t *testing.T) {
	if err := rollout.SetThreads(2); err != nil {
		t.Fatal(err)
	}
	ck := microCheckpoint(t)
	cases := []struct {
		reset              bool
		sftStep, finalStep string // optimizer steps after the warm-up and after 2 GRPO steps
	}{
		{true, "0", "2"},
		{false, "2", "4"},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("reset=%v", c.reset), func(t *testing.T) {
			run := filepath.Join(t.TempDir(), "run")
			cfg := testConfig(t, ck, "train.steps=2", "train.validate_every=0", fmt.Sprintf("train.reset_optimizer_after_sft=%v", c.reset))
			if err := trainer.Train(context.Background(), cfg.Training(), trainer.Options{RunDir: run}); err != nil {
				t.Fatal(err)
			}
			step, zero := optimizerStep(t, filepath.Join(run, "checkpoints", "sft"))
			if step != c.sftStep || zero != c.reset {
				t.Errorf("optimizer state GRPO starts from: step %s, zero moments %v; want step %s, zero moments %v",
					step, zero, c.sftStep, c.reset)
			}
			if step, _ := optimizerStep(t, filepath.Join(run, "checkpoints", "step-2")); step != c.finalStep {
				t.Errorf("optimizer step after 2 GRPO updates %s, want %s", step, c.finalStep)
			}
		})
	}
}

// poisoned copies a checkpoint with one weight set to NaN: every gradient
// is then non-finite and every optimizer update is skipped.
func poisoned(t *testing.T, ck string) string {
	t.Helper()
	p, err := torchbridge.LoadPolicy(ck, torchbridge.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const name = "model.norm.weight"
	buf := make([]byte, 4*16)
	if err := p.GetParam(name, "F32", buf); err != nil {
		t.Fatal(err)
	}
	// The largest finite weights, not a NaN (a checkpoint with a NaN is
	// refused at load): the norm's output overflows to infinity, and the
	// gradients are NaN.
	for i := 0; i < len(buf); i += 4 {
		binary.LittleEndian.PutUint32(buf[i:], math.Float32bits(math.MaxFloat32))
	}
	if err := p.SetParam(name, "F32", buf); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "nan")
	if err := p.Save(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Updates skipped for a non-finite gradient norm are counted in
// metrics.jsonl (per step and over the run), each is warned about in the
// log, and train.max_skipped_updates in a row stop the run with an error
// naming the step; 0 never stops.
func TestSkippedUpdates(t *testing.T) {
	if err := rollout.SetThreads(2); err != nil {
		t.Fatal(err)
	}
	ck := poisoned(t, microCheckpoint(t))
	cases := []struct {
		max     int
		steps   int    // GRPO steps logged
		errStep string // "" = the run ends normally
	}{
		{3, 3, "step 3"},
		{0, 4, ""},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("max=%d", c.max), func(t *testing.T) {
			run := filepath.Join(t.TempDir(), "run")
			cfg := testConfig(t, ck, "sft.steps=0", "train.validate_every=0", "train.checkpoint_every=4",
				fmt.Sprintf("train.max_skipped_updates=%d", c.max))
			var logBuf bytes.Buffer
			err := trainer.Train(context.Background(), cfg.Training(), trainer.Options{RunDir: run, Log: slog.New(slog.NewTextHandler(&logBuf, nil))})
			if c.errStep == "" {
				if err != nil {
					t.Fatalf("train.max_skipped_updates = 0 must never stop the run: %v", err)
				}
			} else if !errors.Is(err, trainer.ErrNonFiniteGradients) || !strings.Contains(err.Error(), c.errStep) {
				t.Fatalf("error %v, want ErrNonFiniteGradients naming %q", err, c.errStep)
			}
			metrics := readJSONL(t, filepath.Join(run, "metrics.jsonl"))
			if len(metrics) != c.steps {
				t.Fatalf("%d metrics lines, want %d", len(metrics), c.steps)
			}
			for i, m := range metrics {
				if m["skipped_updates"] != 1.0 || m["skipped_updates_total"] != float64(i+1) {
					t.Errorf("step %v: skipped_updates %v, skipped_updates_total %v; want 1 and %d (every update of a NaN policy is skipped)",
						m["step"], m["skipped_updates"], m["skipped_updates_total"], i+1)
				}
			}
			if n := strings.Count(logBuf.String(), "optimizer update skipped"); n != c.steps {
				t.Errorf("%d warnings of skipped updates in the log, want %d:\n%s", n, c.steps, logBuf.String())
			}
		})
	}
}

// policy.decode_threads decodes the rollouts and validations with one
// thread and trains with two: the job's thread count is back at two after
// each stretch of decoding and after the run, and a resume may not change
// the key (another thread count may round the rollouts' log-probabilities
// differently in the last bit).
func TestDecodeThreads(t *testing.T) {
	if err := rollout.SetThreads(2); err != nil {
		t.Fatal(err)
	}
	ck := microCheckpoint(t)
	cfg := testConfig(t, ck, "sft.steps=0", "train.steps=2", "train.validate_every=1", "policy.decode_threads=1")
	run := filepath.Join(t.TempDir(), "run")
	if err := trainer.Train(context.Background(), cfg.Training(), trainer.Options{RunDir: run}); err != nil {
		t.Fatal(err)
	}
	if got, err := torchbridge.Threads(); err != nil || got != 2 {
		t.Fatalf("%d threads after the run (%v), want the job's 2", got, err)
	}
	restore, err := rollout.DecodeThreads(1)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := torchbridge.Threads(); got != 1 {
		t.Errorf("DecodeThreads(1): %d threads, want 1", got)
	}
	if err := restore(); err != nil {
		t.Fatal(err)
	}
	if got, _ := torchbridge.Threads(); got != 2 {
		t.Errorf("after restore: %d threads, want 2", got)
	}
	more := cfg
	more.Train.Steps, more.Policy.DecodeThreads = 3, 0
	err = trainer.Train(context.Background(), more.Training(), trainer.Options{RunDir: run, Resume: true})
	if err == nil || !strings.Contains(err.Error(), "policy.decode_threads") {
		t.Errorf("resume with another policy.decode_threads: %v, want an error naming the key", err)
	}
}

// policy.rollout_workers decodes a rollout's rows on several threads at
// once (one libtorch thread each) when the rollouts decode on one thread:
// the run is the same bit for bit as with one worker, rollouts, metrics,
// validations and weights (a row's log-probs do not depend on the rows
// sharing its decode call), and a resume may change the key.
func TestRolloutWorkers(t *testing.T) {
	if err := rollout.SetThreads(2); err != nil {
		t.Fatal(err)
	}
	ck := microCheckpoint(t)
	runs := map[int]string{}
	for _, w := range []int{1, 2, 3} {
		runs[w] = filepath.Join(t.TempDir(), fmt.Sprint("workers", w))
		cfg := testConfig(t, ck, "train.steps=3", "train.checkpoint_every=3", "train.group_size=3", "train.model_subsets=1",
			"policy.decode_threads=1", fmt.Sprintf("policy.rollout_workers=%d", w))
		before := torchbridge.ParallelCalls()
		if err := trainer.Train(context.Background(), cfg.Training(), trainer.Options{RunDir: runs[w]}); err != nil {
			t.Fatal(err)
		}
		if split := torchbridge.ParallelCalls() - before; (split > 0) != (w > 1) {
			t.Errorf("%d workers: %d decode calls split among threads", w, split)
		}
	}
	compareRuns(t, runs[1], runs[2], match{exactUpTo: 3, weights: map[string]float64{"last": 0}})
	compareRuns(t, runs[1], runs[3], match{exactUpTo: 3, weights: map[string]float64{"last": 0}})
	more := testConfig(t, ck, "train.steps=4", "train.checkpoint_every=3", "train.group_size=3", "train.model_subsets=1",
		"policy.decode_threads=1", "policy.rollout_workers=1")
	if err := trainer.Train(context.Background(), more.Training(), trainer.Options{RunDir: runs[2], Resume: true}); err != nil {
		t.Errorf("resume with another policy.rollout_workers: %v", err)
	}
}

// testConfig is recal.toml made small for tests (testenv.Config).
func testConfig(t *testing.T, ck string, sets ...string) config.Config {
	return testenv.Config(t, "..", ck, sets...)
}

func readJSONL(t *testing.T, path string) []map[string]any { return testenv.ReadJSONL(t, path) }
