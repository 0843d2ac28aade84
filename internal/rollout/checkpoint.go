package rollout

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// CheckpointFiles are the files every complete checkpoint holds (the layout
// of a run's checkpoints/ folder is trainer's; see docs/training.md).
var CheckpointFiles = []string{"config.json", "model.safetensors", "optimizer.safetensors", "trainer_state.json"}

// bestRecord is what ResolveCheckpoint reads of checkpoints/best.json.
type bestRecord struct {
	Step         int     `json:"step"`
	Checkpoint   string  `json:"checkpoint"`
	F1WellFormed float64 `json:"f1_well_formed"`
	F1           float64 `json:"f1"`
}

func readBest(path string, b *bestRecord) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(raw, b)
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// Complete reports whether dir holds every file of a checkpoint.
func Complete(dir string) bool {
	for _, f := range CheckpointFiles {
		if !fileExists(filepath.Join(dir, f)) {
			return false
		}
	}
	return true
}

// ResolveCheckpoint returns the policy checkpoint a command given dir should
// load: dir itself when it is a checkpoint folder; for a training run folder
// (one holding checkpoints/), the folder its checkpoints/best names when
// there is one (train.keep_best), else the one checkpoints/last names. which
// says what was picked ("best (step 40, validation F1 0.512, well-formed
// F1 0.498)", "last", or "" for dir itself).
func ResolveCheckpoint(dir string) (path, which string, err error) {
	ck := filepath.Join(dir, "checkpoints")
	if st, err := os.Stat(ck); err != nil || !st.IsDir() {
		return dir, "", nil
	}
	for _, name := range []string{"best", "last"} {
		target, err := os.Readlink(filepath.Join(ck, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", "", fmt.Errorf("rollout: %w", err)
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(ck, target)
		}
		if !Complete(target) {
			return "", "", fmt.Errorf("rollout: %s names %s, which is not a complete checkpoint", filepath.Join(ck, name), target)
		}
		which = name
		var b bestRecord
		if name == "best" && readBest(filepath.Join(ck, "best.json"), &b) == nil && filepath.Base(target) == b.Checkpoint {
			which = fmt.Sprintf("best (step %d, validation F1 %.3f, well-formed F1 %.3f)", b.Step, b.F1, b.F1WellFormed)
		}
		return target, which, nil
	}
	return "", "", fmt.Errorf("rollout: run folder %s has no checkpoint yet (neither checkpoints/best nor checkpoints/last)", dir)
}
