package trainer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/internal/testing/testpolicy"
	"github.com/recal-project/recal/router"
	"github.com/recal-project/recal/torchbridge"
)

// bestRun is a run folder driven step by step as the training loop drives
// it: log the validation, checkpoint on checkpoint steps and on a new best,
// then switch best.
type bestRun struct {
	t       *testing.T
	cfg     config.Config
	eng     *rollout.Engine
	r       *runDir
	sampler *data.Sampler
	best    bestCheckpoint
}

func newBestRun(t *testing.T, eng *rollout.Engine, cfg config.Config, plan runPlan) *bestRun {
	t.Helper()
	sampler, err := data.NewSampler([]data.Example{{ID: "q1", Dataset: "nq"}, {ID: "q2", Dataset: "nq"}, {ID: "q3", Dataset: "nq"}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	r, err := openRun(plan, cfg.Training())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return &bestRun{t: t, cfg: cfg, eng: eng, r: r, sampler: sampler, best: plan.best}
}

// validation is a validation of mean F1 f1 whose responses are all well
// formed.
func validation(step int, f1 float64) rollout.ValidationResult {
	return validationWF(step, f1, 1)
}

// validationWF is a validation of mean F1 f1 of which the share wf of the
// responses are well formed (and score as the rest).
func validationWF(step int, f1, wf float64) rollout.ValidationResult {
	sc := rollout.Score{F1: f1, EM: f1 / 2, N: 2, WellFormed: wf, F1WellFormed: f1 * wf}
	return rollout.ValidationResult{Step: step, Datasets: map[string]rollout.Score{"nq": sc}, Avg: sc}
}

// step runs the end of GRPO step s with validation F1 f1 (< 0: no
// validation), checkpointing every third step.
func (b *bestRun) step(s int, f1 float64) error {
	b.t.Helper()
	return b.stepWF(s, f1, 1)
}

// stepWF is step with the share wf of the validation's responses well formed.
func (b *bestRun) stepWF(s int, f1, wf float64) error {
	b.t.Helper()
	st := &State{Step: s, SFTDone: true, Balance: router.NewBalance(0.9, []string{"a"})}
	save, newBest := s%3 == 0, false
	if f1 >= 0 {
		v := validationWF(s, f1, wf)
		if err := b.r.logValidation(v); err != nil {
			b.t.Fatal(err)
		}
		if b.best.improvedBy(v) {
			b.best, newBest, save = bestOf(v), true, true
		}
	}
	if save {
		if err := b.r.checkpoint(b.eng, st, b.sampler, ""); err != nil {
			return err
		}
	}
	if newBest {
		return b.r.keepBest(b.best)
	}
	return nil
}

// checkBest checks that checkpoints/best names step-want (0: no best),
// a complete checkpoint, and that best.json says the same.
func checkBest(t *testing.T, run string, want int, why string) {
	t.Helper()
	ck := filepath.Join(run, "checkpoints")
	target, err := os.Readlink(filepath.Join(ck, "best"))
	if want == 0 {
		if !errors.Is(err, os.ErrNotExist) || exists(filepath.Join(ck, "best.json")) {
			t.Fatalf("%s: checkpoints/best names %q (%v), want no best", why, target, err)
		}
		return
	}
	if err != nil || target != fmt.Sprintf("step-%d", want) {
		t.Fatalf("%s: checkpoints/best names %q (%v), want step-%d", why, target, err, want)
	}
	if !rollout.Complete(filepath.Join(ck, target)) {
		t.Fatalf("%s: checkpoints/best names %s, which is not a complete checkpoint", why, target)
	}
	var rec bestCheckpoint
	if err := readJSON(filepath.Join(ck, "best.json"), &rec); err != nil || rec.Step != want || rec.Checkpoint != target {
		t.Fatalf("%s: best.json says %+v (%v), want step %d", why, rec, err, want)
	}
}

func microEngine(t *testing.T) *rollout.Engine {
	t.Helper()
	if err := rollout.SetThreads(2); err != nil {
		t.Fatal(err)
	}
	eng, err := rollout.OpenEngine(testpolicy.Micro(t, "..", 1), torchbridge.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	return eng
}

// checkpoints/best follows the validation F1 with ill-formed responses
// scored 0: a strictly higher mean takes it (a tie keeps the earlier step), a new best off the checkpoint
// steps is checkpointed, a resume recovers it from validation.jsonl (only
// validations up to the checkpoint it continues from), and the tidying of a
// resume never removes it.
func TestBestCheckpoint(t *testing.T) {
	eng := microEngine(t)
	cfg, err := config.Load("../recal.toml", nil)
	if err != nil {
		t.Fatal(err)
	}
	run := filepath.Join(t.TempDir(), "run")
	b := newBestRun(t, eng, cfg, runPlan{dir: run})
	// step, validation F1 (−1: none), best after it (0: none yet).
	seq := []struct {
		step int
		f1   float64
		best int
	}{
		{1, -1, 0},
		{2, 0.2, 2},  // the first validation is the best so far (not a checkpoint step: checkpointed)
		{3, 0.2, 2},  // a tie keeps the earlier step
		{4, 0.5, 4},  // strictly higher
		{5, 0.45, 4}, // lower
	}
	for _, s := range seq {
		if err := b.step(s.step, s.f1); err != nil {
			t.Fatal(err)
		}
		checkBest(t, run, s.best, fmt.Sprintf("after step %d (F1 %g)", s.step, s.f1))
	}
	for _, want := range []string{"step-2", "step-3", "step-4"} {
		if !rollout.Complete(filepath.Join(run, "checkpoints", want)) {
			t.Errorf("no complete %s: each new best and each checkpoint_every step is a checkpoint", want)
		}
	}
	// Step 6 is better still, but the process dies after logging its
	// validation and writing step-6, before switching last: the resume
	// continues from step-4, the best of validation.jsonl up to step 4.
	b.r.ops = &crashOps{at: "switch last"}
	if err := b.step(6, 0.9); !errors.Is(err, errCrash) {
		t.Fatalf("step 6 with a crash before switching last: %v", err)
	}
	plan, err := inspectRun(run, cfg.Training(), true, false)
	if err != nil {
		t.Fatal(err)
	}
	if plan.best.Checkpoint != "step-4" || plan.best.F1 != 0.5 {
		t.Fatalf("the resume recovered the best %+v, want step-4 with F1 0.5 (step 6's validation came after the checkpoint)", plan.best)
	}
	b = newBestRun(t, eng, cfg, plan)
	checkBest(t, run, 4, "after the resume")
	if exists(filepath.Join(run, "checkpoints", "step-6")) {
		t.Errorf("the resume left step-6, which no pointer names")
	}
	// The resumed run redoes steps 5 and 6 (F1 0.45, then a tie with step
	// 4). At step 8 the F1 is higher but the format collapsed (a tenth of
	// the responses well formed): best stays at step 7.
	for _, s := range []struct {
		step   int
		f1, wf float64
		best   int
	}{{5, 0.45, 1, 4}, {6, 0.5, 1, 4}, {7, 0.6, 1, 7}, {8, 0.9, 0.1, 7}, {9, 0.7, 1, 9}} {
		if err := b.stepWF(s.step, s.f1, s.wf); err != nil {
			t.Fatal(err)
		}
		checkBest(t, run, s.best, fmt.Sprintf("after the resumed step %d (F1 %g, well formed %g)", s.step, s.f1, s.wf))
	}

	// With train.keep_best off, a resume recovers and writes no best, and
	// leaves the one a run has as it is.
	off := cfg
	off.Train.KeepBest = false
	if plan, err := inspectRun(run, off.Training(), true, true); err != nil || plan.best.Checkpoint != "" {
		t.Errorf("keep_best off: the resume recovered %+v (%v), want no best", plan.best, err)
	}
}

// A kill at any instant of the write of a new best's checkpoint and of the
// switch of best leaves checkpoints/best naming a complete checkpoint, and
// the resume makes it the best of the validations up to the checkpoint it
// continues from.
func TestBestCheckpointSurvivesACrashAtEveryOperation(t *testing.T) {
	eng := microEngine(t)
	cfg, err := config.Load("../recal.toml", nil)
	if err != nil {
		t.Fatal(err)
	}
	// newRun has best at step-2 (F1 0.3) and last at step-3; step 4
	// (F1 0.6) is the next best.
	newRun := func(t *testing.T) *bestRun {
		b := newBestRun(t, eng, cfg, runPlan{dir: filepath.Join(t.TempDir(), "run")})
		if err := b.step(2, 0.3); err != nil {
			t.Fatal(err)
		}
		if err := b.step(3, 0.1); err != nil {
			t.Fatal(err)
		}
		return b
	}
	count := &crashOps{}
	b := newRun(t)
	b.r.ops = count
	if err := b.step(4, 0.6); err != nil {
		t.Fatal(err)
	}
	checkBest(t, b.r.dir, 4, "without a crash")
	if !slices.Contains(count.done, "switch best") || !slices.Contains(count.done, "switch last") {
		t.Fatalf("the writer ran %q: want the switches of last and best to go through fileOps", count.done)
	}
	lastAt := slices.Index(count.done, "switch last") + 1
	for k := 1; k <= len(count.done); k++ {
		at := count.done[k-1]
		b := newRun(t)
		b.r.ops = &crashOps{k: k}
		if err := b.step(4, 0.6); !errors.Is(err, errCrash) {
			t.Fatalf("crash at %q: the writer returned %v", at, err)
		}
		// Whatever the instant, best names a complete checkpoint.
		ck := filepath.Join(b.r.dir, "checkpoints")
		target, err := os.Readlink(filepath.Join(ck, "best"))
		if err != nil || (target != "step-2" && target != "step-4") || !rollout.Complete(filepath.Join(ck, target)) {
			t.Fatalf("crash at %q: best names %q (%v), want a complete step-2 or step-4", at, target, err)
		}
		want := 2
		if k > lastAt {
			want = 4 // last names step-4, and its validation is the best
		}
		plan, err := inspectRun(b.r.dir, cfg.Training(), true, false)
		if err != nil {
			t.Fatalf("crash at %q: resume: %v", at, err)
		}
		r, err := openRun(plan, cfg.Training())
		if err != nil {
			t.Fatalf("crash at %q: reopening the run: %v", at, err)
		}
		r.Close()
		checkBest(t, b.r.dir, want, fmt.Sprintf("crash at %q, then resume", at))
		entries, _ := os.ReadDir(ck)
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), ".") {
				t.Errorf("crash at %q: the resume left %s", at, e.Name())
			}
		}
	}
}

// scaleLR scales the value head's learning rate with the policy's, and
// leaves 0 (= follow the policy's) as it is.
func TestScaleLR(t *testing.T) {
	cases := []struct {
		in        torchbridge.AdamW
		f         float64
		lr, value float64
	}{
		{torchbridge.AdamW{LR: 1e-3, ValueLR: 1e-2, Beta1: 0.9}, 0.5, 5e-4, 5e-3},
		{torchbridge.AdamW{LR: 1e-3}, 0.25, 2.5e-4, 0},
		{torchbridge.AdamW{LR: 1e-3, ValueLR: 1e-2}, 1, 1e-3, 1e-2},
	}
	for _, c := range cases {
		got := scaleLR(c.in, c.f)
		if got.LR != c.lr || got.ValueLR != c.value || got.Beta1 != c.in.Beta1 {
			t.Errorf("scaleLR(%+v, %g) = %+v, want LR %g and ValueLR %g, the rest unchanged", c.in, c.f, got, c.lr, c.value)
		}
	}
}
