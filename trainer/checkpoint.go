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
	"github.com/recal-project/recal/internal/hfmodel"
)

// Checkpoints. A run's checkpoints/ folder holds
//
//	step-N/, sft/   complete checkpoints, never changed once they have their name
//	last            a symbolic link to the newest complete one
//	.*              leftovers of a write that was stopped; removed by the next
//	                checkpoint and by --resume
//
// A checkpoint is written into a fresh hidden folder, its files and the
// folder fsynced, renamed to its name, and then last is switched by renaming
// a new symbolic link over it. The folder last names is never removed or
// renamed, so a kill at any instant leaves last naming a complete checkpoint:
// the old one, or the new one once the switch is durable.

// checkpointFiles are the files every complete checkpoint holds.
var checkpointFiles = []string{"config.json", "model.safetensors", "optimizer.safetensors", "trainer_state.json"}

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
func (r *runDir) checkpoint(eng *Engine, st *State, sampler *data.Sampler, name string) error {
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
			return hfmodel.WriteAtomic(filepath.Join(staging, "trainer_state.json"), func(w io.Writer) error {
				_, err := w.Write(state)
				return err
			})
		}},
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
			return fmt.Errorf("trainer: checkpoint %s: %s: %w", name, o.what, err)
		}
	}
	r.last = final
	return nil
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
