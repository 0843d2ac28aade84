package eval

import (
	"os"
	"path/filepath"
)

// DefaultOut is recal eval's output folder for the test selection sel
// (a split's name, or datasets joined by "+") when --out is not given:
// eval-<sel> in the run folder of checkpoint (RUN/checkpoints/X) when
// there is one (it holds config.toml), else runs/eval-<sel>.
func DefaultOut(checkpoint, sel string) string {
	run := filepath.Dir(filepath.Dir(filepath.Clean(checkpoint)))
	if !exists(filepath.Join(run, "config.toml")) {
		return filepath.Join("runs", "eval-"+sel)
	}
	return filepath.Join(run, "eval-"+sel)
}

// RunRollouts is the rollouts.jsonl of checkpoint's run (RUN/checkpoints/X),
// the knn routers' logged outcomes, or "" when there is none.
func RunRollouts(checkpoint string) string {
	if guess := filepath.Join(filepath.Dir(filepath.Dir(filepath.Clean(checkpoint))), "rollouts.jsonl"); exists(guess) {
		return guess
	}
	return ""
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
