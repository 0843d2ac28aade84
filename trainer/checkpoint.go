package trainer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/atomicfile"
	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/internal/rollout"
)

// Checkpoints. A run's checkpoints/ folder holds
//
//	step-N/, sft/   complete checkpoints, never changed once they have their name
//	last            a symbolic link to the newest complete one
//	best            a symbolic link to the step-N of the validation with the
//	                highest mean F1 so far, ill-formed responses scored 0
//	                (train.keep_best)
//	best.json       that validation: step, checkpoint, F1, EM
//	.*              leftovers of a write that was stopped; removed by the next
//	                checkpoint and by --resume
//
// A checkpoint is written into a fresh hidden folder, its files and the
// folder fsynced, renamed to its name, and then last is switched by renaming
// a new symbolic link over it. The folder last names is never removed or
// renamed, so a kill at any instant leaves last naming a complete checkpoint:
// the old one, or the new one once the switch is durable.
//
// best is switched the same way, after last: a validation whose mean F1 is
// strictly higher than every earlier one's makes its step a checkpoint
// (whatever train.checkpoint_every says), and best then names it. best thus
// never names a step past last, and nothing removes a step-N folder at or
// before last's, so best always names a complete checkpoint. validation.jsonl
// is what --resume recovers the best from (recoverBest), repairing best and
// best.json if a kill came between the switch of last and that of best.

// checkpointFiles are the files every complete checkpoint holds.
var checkpointFiles = rollout.CheckpointFiles

// fileOps runs the checkpoint writer's file operations, one call each. Tests
// substitute one that stops at the k-th operation, as a crash there would:
// the writer then returns at once and cleans up nothing.
type fileOps interface {
	do(what string, op func() error) error
}

// directOps runs every operation.
type directOps struct{}

func (directOps) do(_ string, op func() error) error { return op() }

// checkpoint writes checkpoints/<name> (step-N when name is ""): the policy
// in Hugging Face format, the optimizer state and the trainer state, then
// points checkpoints/last at it (see the layout above).
func (r *runDir) checkpoint(eng *rollout.Engine, st *State, sampler *data.Sampler, name string) error {
	if name == "" {
		name = fmt.Sprintf("step-%d", st.Step)
	}
	st.Sampler = sampler.State()
	state, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	// The log lines up to this step are durable before a checkpoint that a
	// resume truncates the logs to.
	for _, f := range []*os.File{r.metrics, r.rollouts, r.vals, r.sft} {
		if err := f.Sync(); err != nil {
			return fmt.Errorf("trainer: %w", err)
		}
	}
	if r.last != "" {
		// last may already hold this state (an interruption right after a
		// checkpoint or a resume, or the GRPO loop interrupted before its
		// first step after the sft checkpoint): the weights, the optimizer,
		// the data order and the routing counts only change with the step
		// and the end of the warm-up. Nothing to write, and rewriting the
		// folder last names would mean removing it.
		var old State
		if err := readJSON(filepath.Join(r.last, "trainer_state.json"), &old); err != nil {
			return err
		}
		if old.Step == st.Step && old.SFTDone == st.SFTDone {
			return nil
		}
		if filepath.Base(r.last) == name {
			return fmt.Errorf("trainer: checkpoint %s: last names it with step %d (sft done: %v), not step %d (%v)", name, old.Step, old.SFTDone, st.Step, st.SFTDone)
		}
	}
	ops := r.ops
	if ops == nil {
		ops = directOps{}
	}
	ck := filepath.Join(r.dir, "checkpoints")
	tag := strconv.FormatInt(time.Now().UnixNano(), 36)
	staging := filepath.Join(ck, ".new-"+name+"-"+tag)
	final := filepath.Join(ck, name)
	link := filepath.Join(ck, ".last-"+tag)
	type op struct {
		what string
		fn   func() error
	}
	plan := []op{
		{"write the policy", func() error { return eng.Policy.Save(staging) }},
		{"write the optimizer state", func() error {
			return eng.Policy.SaveOptimizer(filepath.Join(staging, "optimizer.safetensors"))
		}},
		{"write trainer_state.json", func() error {
			return atomicfile.Write(filepath.Join(staging, "trainer_state.json"), func(w io.Writer) error {
				_, err := w.Write(state)
				return err
			})
		}},
		// Every file's SHA-256, checked by the next load (the policy's
		// Save listed its own files; the optimizer and trainer state came
		// after).
		{"write the checksums", func() error { return hfmodel.WriteChecksums(staging) }},
		{"sync the new folder", func() error { return syncDir(staging) }},
	}
	if _, err := os.Lstat(final); err == nil {
		// A folder of this name that last does not name was left by a run
		// stopped before it switched last (this step is being redone): no
		// pointer needs it.
		plan = append(plan, op{"move the stale " + name + " aside", func() error {
			return os.Rename(final, filepath.Join(ck, ".old-"+name+"-"+tag))
		}})
	}
	plan = append(plan,
		op{"rename the new folder to " + name, func() error { return os.Rename(staging, final) }},
		op{"sync checkpoints/", func() error { return syncDir(ck) }},
		op{"create the new link", func() error { return os.Symlink(name, link) }},
		op{"switch last", func() error { return os.Rename(link, filepath.Join(ck, "last")) }},
		op{"sync checkpoints/ again", func() error { return syncDir(ck) }},
		op{"remove leftovers", func() error { return removeLeftovers(ck) }},
	)
	for _, o := range plan {
		if err := ops.do(o.what, o.fn); err != nil {
			// A half-written staging folder (a full disk) goes at once,
			// not at the next resume; once renamed, the path is free.
			ops.do("remove the new folder", func() error { return os.RemoveAll(staging) })
			return fmt.Errorf("trainer: checkpoint %s: %s: %w", name, o.what, err)
		}
	}
	r.last = final
	return nil
}

// bestCheckpoint is the validation checkpoints/best names (best.json).
type bestCheckpoint struct {
	Step         int     `json:"step"`
	Checkpoint   string  `json:"checkpoint"`     // step-N, the folder best names
	F1WellFormed float64 `json:"f1_well_formed"` // what best is chosen by: mean F1, ill-formed responses scored 0
	F1           float64 `json:"f1"`             // mean over the validation datasets
	EM           float64 `json:"em"`
	WellFormed   float64 `json:"well_formed"`
}

// improvedBy reports whether validation v beats the best so far (b.Checkpoint
// "" = none yet): a strictly higher mean F1 with every response that is not
// well formed scored 0 (Score.F1WellFormed), so a tie keeps the earlier step
// and a policy whose format collapsed is not kept for answers the protocol
// cannot rely on. A validation of no question beats nothing.
func (b bestCheckpoint) improvedBy(v rollout.ValidationResult) bool {
	return v.Avg.N > 0 && (b.Checkpoint == "" || v.Avg.F1WellFormed > b.F1WellFormed)
}

func bestOf(v rollout.ValidationResult) bestCheckpoint {
	return bestCheckpoint{Step: v.Step, Checkpoint: fmt.Sprintf("step-%d", v.Step),
		F1WellFormed: v.Avg.F1WellFormed, F1: v.Avg.F1, EM: v.Avg.EM, WellFormed: v.Avg.WellFormed}
}

// recoverBest replays the validations of validation.jsonl up to step (a
// resume's checkpoint; −1: none) with the rule of the training loop and
// returns the best whose step is a complete checkpoint: every best of a run
// with train.keep_best on is one. A run folder without validations (or
// checkpoints at them) has none ("" Checkpoint).
func recoverBest(dir string, step int) (bestCheckpoint, error) {
	var b bestCheckpoint
	path := filepath.Join(dir, "validation.jsonl")
	if step < 0 || !exists(path) {
		return b, nil
	}
	vals, err := readLines[rollout.ValidationResult](path)
	if err != nil {
		return b, err
	}
	for _, v := range vals {
		if v.Step > step || !b.improvedBy(v) || !rollout.Complete(filepath.Join(dir, "checkpoints", fmt.Sprintf("step-%d", v.Step))) {
			continue
		}
		b = bestOf(v)
	}
	return b, nil
}

// keepBest points checkpoints/best at b's checkpoint, which must be complete,
// by renaming a new symbolic link over it, and records b in best.json.
func (r *runDir) keepBest(b bestCheckpoint) error {
	ck := filepath.Join(r.dir, "checkpoints")
	if !rollout.Complete(filepath.Join(ck, b.Checkpoint)) {
		return fmt.Errorf("trainer: best checkpoint %s: not a complete checkpoint", b.Checkpoint)
	}
	text, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	ops := r.ops
	if ops == nil {
		ops = directOps{}
	}
	link := filepath.Join(ck, ".best-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	plan := []struct {
		what string
		fn   func() error
	}{
		{"create the new best link", func() error { return os.Symlink(b.Checkpoint, link) }},
		{"switch best", func() error { return os.Rename(link, filepath.Join(ck, "best")) }},
		{"sync checkpoints/ after best", func() error { return syncDir(ck) }},
		{"write best.json", func() error {
			return atomicfile.Write(filepath.Join(ck, "best.json"), func(w io.Writer) error {
				_, err := w.Write(append(text, '\n'))
				return err
			})
		}},
		{"sync checkpoints/ after best.json", func() error { return syncDir(ck) }},
	}
	for _, o := range plan {
		if err := ops.do(o.what, o.fn); err != nil {
			return fmt.Errorf("trainer: best checkpoint %s: %s: %w", b.Checkpoint, o.what, err)
		}
	}
	return nil
}

// repairBest makes checkpoints/best and best.json say b, as recovered by
// --resume (b.Checkpoint "": no best; both are removed).
func (r *runDir) repairBest(b bestCheckpoint) error {
	ck := filepath.Join(r.dir, "checkpoints")
	if b.Checkpoint == "" {
		for _, f := range []string{"best", "best.json"} {
			if err := os.Remove(filepath.Join(ck, f)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("trainer: %w", err)
			}
		}
		return nil
	}
	var rec bestCheckpoint
	target, err := os.Readlink(filepath.Join(ck, "best"))
	if err == nil && target == b.Checkpoint && readJSON(filepath.Join(ck, "best.json"), &rec) == nil && rec == b {
		return nil
	}
	return r.keepBest(b)
}

// lastCheckpoint returns the folder checkpoints/last names, "" when there is
// no last, and an error when it names no complete checkpoint.
func lastCheckpoint(ck string) (string, error) {
	target, err := os.Readlink(filepath.Join(ck, "last"))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("trainer: %w", err)
	}
	dir := target
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(ck, target)
	}
	for _, f := range checkpointFiles {
		if !exists(filepath.Join(dir, f)) {
			return "", fmt.Errorf("trainer: %s names %s, which lacks %s: not a complete checkpoint", filepath.Join(ck, "last"), target, f)
		}
	}
	return dir, nil
}

var stepFolder = regexp.MustCompile(`^step-(\d+)$`)

// tidyCheckpoints removes what a resume from a checkpoint at step (sftDone
// saying whether its supervised stage is done; step -1: no checkpoint) does
// not continue: leftovers of stopped writes, and step-N folders past step
// and an sft folder the resumed run will write anew (written by a run
// stopped before it switched last to them).
func tidyCheckpoints(ck string, step int, sftDone bool) error {
	if err := removeLeftovers(ck); err != nil {
		return err
	}
	entries, err := os.ReadDir(ck)
	if err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		stale := name == "sft" && !sftDone
		if m := stepFolder.FindStringSubmatch(name); m != nil {
			n, err := strconv.Atoi(m[1])
			stale = err != nil || n > step
		}
		if stale {
			if err := os.RemoveAll(filepath.Join(ck, name)); err != nil {
				return fmt.Errorf("trainer: %w", err)
			}
		}
	}
	return nil
}

// removeLeftovers removes the hidden entries of checkpoints/ (and the
// ".partial" folders of earlier versions): nothing names them.
func removeLeftovers(ck string) error {
	entries, err := os.ReadDir(ck)
	if err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") || strings.HasSuffix(e.Name(), ".partial") {
			if err := os.RemoveAll(filepath.Join(ck, e.Name())); err != nil {
				return fmt.Errorf("trainer: %w", err)
			}
		}
	}
	return nil
}

// syncDir makes the entries of a folder (files created or renamed in it)
// durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("trainer: sync %s: %w", dir, err)
	}
	return nil
}
