package trainer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/internal/testing/testpolicy"
	"github.com/recal-project/recal/router"
	"github.com/recal-project/recal/torchbridge"
)

var errCrash = errors.New("simulated crash")

// crashOps runs the writer's operations until the k-th (1-based) or the one
// named at, which it does not run: the writer returns there and cleans up
// nothing, as if the process had been killed. k = 0 and at = "" run all.
type crashOps struct {
	k       int
	at      string
	done    []string
	crashed bool // a killed process runs nothing more
}

func (c *crashOps) do(what string, op func() error) error {
	if c.crashed {
		return errCrash
	}
	c.done = append(c.done, what)
	if len(c.done) == c.k || what == c.at {
		c.crashed = true
		return errCrash
	}
	return op()
}

// failOps fails the operation named at with err, as a full disk would, and
// runs every other: the writer's clean-up runs.
type failOps struct {
	at  string
	err error
}

func (f failOps) do(what string, op func() error) error {
	if what == f.at {
		return f.err
	}
	return op()
}

// A checkpoint that fails to write (a full disk) leaves no staging folder
// behind; one that is written lists every file's SHA-256, and they match.
func TestCheckpointFailureLeavesNothing(t *testing.T) {
	if err := rollout.SetThreads(2); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load("../recal.toml", nil)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := rollout.OpenEngine(testpolicy.Micro(t, "..", 1), torchbridge.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	sampler, err := data.NewSampler([]data.Example{{ID: "q1", Dataset: "nq"}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	r, err := openRun(runPlan{dir: filepath.Join(t.TempDir(), "run")}, cfg.Training())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	state := &State{Step: 1, SFTDone: true, Balance: router.NewBalance(0.9, []string{"a", "b"})}
	ck := filepath.Join(r.dir, "checkpoints")
	for _, at := range []string{"write the optimizer state", "write trainer_state.json", "write the checksums", "sync the new folder"} {
		r.ops = failOps{at: at, err: syscall.ENOSPC}
		if err := r.checkpoint(eng, state, sampler, ""); !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("checkpoint failing at %q: error %v, want ENOSPC", at, err)
		}
		entries, _ := os.ReadDir(ck)
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), ".new-") {
				t.Errorf("checkpoint failing at %q left %s behind; a failed write must remove its staging folder", at, e.Name())
			}
		}
	}
	r.ops = nil
	if err := r.checkpoint(eng, state, sampler, ""); err != nil {
		t.Fatal(err)
	}
	names, err := hfmodel.VerifyChecksums(filepath.Join(ck, "step-1"), nil)
	if err != nil || !slices.Contains(names, "model.safetensors") || !slices.Contains(names, "optimizer.safetensors") || !slices.Contains(names, "trainer_state.json") {
		t.Fatalf("checksums of a written checkpoint: %v, %v; want every file listed and matching", names, err)
	}
}

// snapshot is a policy with optimizer state and the files a checkpoint of it
// must hold.
type snapshot struct {
	eng          *rollout.Engine
	model, optim []byte
}

func trainOneStep(t *testing.T, eng *rollout.Engine) {
	t.Helper()
	ctx := context.Background()
	if _, _, err := eng.Policy.BackwardNLL(ctx, [][]int32{{11, 12, 13, 14, 15, 16}}, [][]float32{{0, 1, 1, 1, 1, 1}}, 0.2, 64); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Policy.Step(ctx, torchbridge.AdamW{LR: 1e-2, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, MaxGradNorm: 1}); err != nil {
		t.Fatal(err)
	}
}

// takeSnapshot saves eng's weights and optimizer and returns them with an
// engine of their own that holds them.
func takeSnapshot(t *testing.T, eng *rollout.Engine) snapshot {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "ref")
	if err := eng.Policy.Save(dir); err != nil {
		t.Fatal(err)
	}
	if err := eng.Policy.SaveOptimizer(filepath.Join(dir, "optimizer.safetensors")); err != nil {
		t.Fatal(err)
	}
	own, err := rollout.OpenEngine(dir, torchbridge.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { own.Close() })
	if err := own.Policy.LoadOptimizer(filepath.Join(dir, "optimizer.safetensors")); err != nil {
		t.Fatal(err)
	}
	model, _ := os.ReadFile(filepath.Join(dir, "model.safetensors"))
	optim, _ := os.ReadFile(filepath.Join(dir, "optimizer.safetensors"))
	return snapshot{eng: own, model: model, optim: optim}
}

// A kill at any instant of a checkpoint write leaves checkpoints/last naming
// a complete checkpoint, the old or the new one, that loads (weights,
// optimizer, trainer state), and the resume logic continues from it.
func TestCheckpointSurvivesACrashAtEveryOperation(t *testing.T) {
	if err := rollout.SetThreads(2); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load("../recal.toml", nil)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := rollout.OpenEngine(testpolicy.Micro(t, "..", 1), torchbridge.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	trainOneStep(t, eng)
	old := takeSnapshot(t, eng)
	trainOneStep(t, eng)
	cur := takeSnapshot(t, eng)
	if bytes.Equal(old.model, cur.model) || bytes.Equal(old.optim, cur.optim) {
		t.Fatal("a training step left the weights or the optimizer unchanged: the test could not tell old from new")
	}
	examples := []data.Example{{ID: "q1", Dataset: "nq"}, {ID: "q2", Dataset: "nq"}, {ID: "q3", Dataset: "nq"}}

	// setup writes the checkpoints a scenario starts from; it returns the
	// run, the state of the checkpoint to write and its expected name.
	type scenario struct {
		name  string
		setup func(t *testing.T, r *runDir, sampler *data.Sampler)
		prev  string // what last names before the write ("" = nothing)
	}
	state := func(step int) *State {
		return &State{Step: step, SFTDone: true, Balance: router.NewBalance(0.9, []string{"a", "b"})}
	}
	scenarios := []scenario{
		{"first checkpoint of a run", func(*testing.T, *runDir, *data.Sampler) {}, ""},
		{"next step", func(t *testing.T, r *runDir, s *data.Sampler) {
			if err := r.checkpoint(old.eng, state(1), s, ""); err != nil {
				t.Fatal(err)
			}
		}, "step-1"},
		{"over a stale folder of the same name", func(t *testing.T, r *runDir, s *data.Sampler) {
			if err := r.checkpoint(old.eng, state(1), s, ""); err != nil {
				t.Fatal(err)
			}
			// A write of step 2 stopped just before switching last leaves a
			// complete step-2 that nothing names.
			r.ops = &crashOps{at: "switch last"}
			if err := r.checkpoint(old.eng, state(2), s, ""); !errors.Is(err, errCrash) || !exists(filepath.Join(r.dir, "checkpoints", "step-2", "trainer_state.json")) {
				t.Fatalf("setting up a stale step-2: %v", err)
			}
			r.ops = nil
		}, "step-1"},
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			// newRun starts a run folder in the scenario's state.
			newRun := func(t *testing.T) (*runDir, *data.Sampler) {
				sampler, err := data.NewSampler(examples, 0)
				if err != nil {
					t.Fatal(err)
				}
				r, err := openRun(runPlan{dir: filepath.Join(t.TempDir(), "run")}, cfg.Training())
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { r.Close() })
				sc.setup(t, r, sampler)
				sampler.Next(2) // the new checkpoint's data order differs from the old one's
				return r, sampler
			}
			r, sampler := newRun(t)
			count := &crashOps{}
			r.ops = count
			if err := r.checkpoint(cur.eng, state(2), sampler, ""); err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(count.done, "switch last") || len(count.done) < 8 {
				t.Fatalf("the writer ran the operations %q: want the whole write, the switch of last included, to go through fileOps", count.done)
			}
			switchAt := slices.Index(count.done, "switch last") + 1
			for k := 1; k <= len(count.done); k++ {
				r, sampler := newRun(t)
				r.ops = &crashOps{k: k}
				if err := r.checkpoint(cur.eng, state(2), sampler, ""); !errors.Is(err, errCrash) {
					t.Fatalf("crash at operation %d: the writer returned %v", k, err)
				}
				want, snap := sc.prev, old
				if k > switchAt {
					want, snap = "step-2", cur
				}
				checkAfterCrash(t, r.dir, cfg, want, snap, count.done[k-1])
			}
		})
	}

	// Checkpointing the step last already names (an interruption right after
	// a checkpoint or a resume) touches nothing: rewriting it would remove
	// the folder last names.
	sampler, _ := data.NewSampler(examples, 0)
	r, err := openRun(runPlan{dir: filepath.Join(t.TempDir(), "run")}, cfg.Training())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.checkpoint(eng, state(2), sampler, ""); err != nil {
		t.Fatal(err)
	}
	ops := &crashOps{k: 1}
	r.ops = ops
	if err := r.checkpoint(eng, state(2), sampler, ""); err != nil || len(ops.done) > 0 {
		t.Errorf("checkpointing step 2 again: error %v after the operations %q, want nil after none", err, ops.done)
	}
	if err := r.checkpoint(eng, &State{Step: 2, Balance: state(2).Balance}, sampler, ""); err == nil {
		t.Errorf("checkpointing another state under the name last names succeeded, want an error")
	}
	// Likewise step-0 right after the sft checkpoint: the same state.
	r2, err := openRun(runPlan{dir: filepath.Join(t.TempDir(), "run")}, cfg.Training())
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if err := r2.checkpoint(eng, state(0), sampler, "sft"); err != nil {
		t.Fatal(err)
	}
	ops = &crashOps{k: 1}
	r2.ops = ops
	if err := r2.checkpoint(eng, state(0), sampler, ""); err != nil || len(ops.done) > 0 || exists(filepath.Join(r2.dir, "checkpoints", "step-0")) {
		t.Errorf("checkpointing step 0 after the sft checkpoint: error %v after the operations %q, want nil after none and no step-0", err, ops.done)
	}
}

// checkAfterCrash checks that checkpoints/last names want ("" = nothing),
// that the folder behind it is snap's and loads, and that a resume continues
// from it, tidies the leftovers and checkpoints again.
func checkAfterCrash(t *testing.T, run string, cfg config.Config, want string, snap snapshot, at string) {
	t.Helper()
	ck := filepath.Join(run, "checkpoints")
	last, err := lastCheckpoint(ck)
	if err != nil {
		t.Fatalf("crash at %q: checkpoints/last: %v, want it to name a complete checkpoint", at, err)
	}
	if filepath.Base(last) != want && !(want == "" && last == "") {
		t.Fatalf("crash at %q: last names %q, want %q", at, last, want)
	}
	plan, err := inspectRun(run, cfg.Training(), true, false)
	if err != nil {
		t.Fatalf("crash at %q: resume: %v", at, err)
	}
	if plan.last != last {
		t.Fatalf("crash at %q: the resume continues from %q, want %q", at, plan.last, last)
	}
	if want != "" {
		// The path eval is given, through the link.
		path := filepath.Join(ck, "last")
		for file, b := range map[string][]byte{"model.safetensors": snap.model, "optimizer.safetensors": snap.optim} {
			got, err := os.ReadFile(filepath.Join(path, file))
			if err != nil || !bytes.Equal(got, b) {
				t.Fatalf("crash at %q: last/%s (%v) is not the %s checkpoint's", at, file, err, want)
			}
		}
		eng, err := rollout.OpenEngine(path, torchbridge.Options{})
		if err != nil {
			t.Fatalf("crash at %q: loading last: %v", at, err)
		}
		defer eng.Close()
		sampler, _ := data.NewSampler([]data.Example{{ID: "q1", Dataset: "nq"}, {ID: "q2", Dataset: "nq"}, {ID: "q3", Dataset: "nq"}}, 0)
		var st State
		if err := loadState(path, eng.Policy, &st, sampler); err != nil {
			t.Fatalf("crash at %q: loading the optimizer and trainer state of last: %v", at, err)
		}
		if fmt.Sprintf("step-%d", st.Step) != want {
			t.Fatalf("crash at %q: last's trainer state is at step %d, want %s", at, st.Step, want)
		}
	}
	r, err := openRun(plan, cfg.Training())
	if err != nil {
		t.Fatalf("crash at %q: reopening the run: %v", at, err)
	}
	defer r.Close()
	entries, _ := os.ReadDir(ck)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") || (e.Name() == "step-2" && want != "step-2") {
			t.Errorf("crash at %q: the resume left %s, which nothing names", at, e.Name())
		}
	}
	// The resumed run checkpoints its next step.
	sampler, _ := data.NewSampler([]data.Example{{ID: "q1", Dataset: "nq"}, {ID: "q2", Dataset: "nq"}, {ID: "q3", Dataset: "nq"}}, 0)
	if err := r.checkpoint(snap.eng, &State{Step: 3, SFTDone: true, Balance: router.NewBalance(0.9, nil)}, sampler, ""); err != nil {
		t.Fatalf("crash at %q: checkpointing after the resume: %v", at, err)
	}
	if last, err := lastCheckpoint(ck); err != nil || filepath.Base(last) != "step-3" {
		t.Fatalf("crash at %q: after the next checkpoint last names %q (%v), want step-3", at, last, err)
	}
}
