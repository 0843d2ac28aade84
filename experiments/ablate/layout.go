package ablate

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/recal-project/recal/calibration"
	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/internal/atomicfile"
)

// SeedDir is the folder of seed's runs in the study folder root.
func SeedDir(root string, seed int64) string {
	return filepath.Join(root, "seed-"+strconv.FormatInt(seed, 10))
}

// WarmupDir is the run folder of seed's supervised warm-up.
func WarmupDir(root string, seed int64) string { return filepath.Join(SeedDir(root, seed), "warmup") }

// VariantDir is the run folder of one variant's GRPO for seed.
func VariantDir(root string, seed int64, variant string) string {
	return filepath.Join(SeedDir(root, seed), variant)
}

// WarmupConfig is the configuration a seed's warm-up is trained with: cfg
// with no GRPO step (train.steps = 0) and the full ReCal calibration. The
// warm-up reads neither ([calibration] and train.steps only shape GRPO), so
// one warm-up serves every variant; fixing them makes the warm-up's
// configuration the same whichever variant the study was started from.
func WarmupConfig(cfg config.Config) config.Config {
	w := cfg
	w.Train.Steps = 0
	full, err := calibration.Ablation(Full)
	if err != nil {
		panic(err) // Full is a registered ablation: a broken invariant
	}
	full(&w.Calibration)
	return w
}

// Seed makes dir the run folder of a combined run (`recal train` with the
// warm-up and GRPO in one job) stopped right after its warm-up, the warm-up
// being the finished one in warmup: config.toml is cfg (the variant's),
// checkpoints/sft links to warmup's checkpoints/sft, checkpoints/last names
// it, and sft.jsonl is a copy of warmup's. `recal train --resume` on dir
// then starts GRPO exactly as the combined run does: the same weights,
// optimizer state (train.reset_optimizer_after_sft was applied before the
// warm-up's checkpoint), sampler and routing counts (trainer_state.json),
// and the same KL reference (checkpoints/sft). Nothing of warmup is
// written.
//
// dir must hold no checkpoints/last; what else it holds is a stopped
// attempt and is replaced. The link last is made last, so a Seed stopped
// midway leaves a folder Seed can be called on again.
func Seed(dir, warmup string, cfg config.Config) error {
	sft := filepath.Join(warmup, "checkpoints", "sft")
	if _, err := os.Stat(filepath.Join(sft, "trainer_state.json")); err != nil {
		return fmt.Errorf("ablate: warm-up %s has no finished checkpoint: %w", warmup, err)
	}
	ck := filepath.Join(dir, "checkpoints")
	if _, err := os.Lstat(filepath.Join(ck, "last")); err == nil {
		return fmt.Errorf("ablate: %s already holds a run (checkpoints/last); it is not seeded again", dir)
	}
	if err := os.MkdirAll(ck, 0o755); err != nil {
		return fmt.Errorf("ablate: %w", err)
	}
	if err := writeConfig(filepath.Join(dir, "config.toml"), cfg); err != nil {
		return err
	}
	if err := copyFile(filepath.Join(warmup, "sft.jsonl"), filepath.Join(dir, "sft.jsonl")); err != nil {
		return err
	}
	// Relative links: the study folder can be moved.
	target, err := filepath.Rel(ck, sft)
	if err != nil {
		if target, err = filepath.Abs(sft); err != nil {
			return fmt.Errorf("ablate: %w", err)
		}
	}
	if err := os.RemoveAll(filepath.Join(ck, "sft")); err != nil { // a link (or folder) of a stopped attempt
		return fmt.Errorf("ablate: %w", err)
	}
	if err := os.Symlink(target, filepath.Join(ck, "sft")); err != nil {
		return fmt.Errorf("ablate: %w", err)
	}
	tmp := filepath.Join(ck, ".last-seed-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	if err := os.Symlink("sft", tmp); err != nil {
		return fmt.Errorf("ablate: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(ck, "last")); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("ablate: %w", err)
	}
	return nil
}

func writeConfig(path string, cfg config.Config) error {
	tmp := path + ".tmp"
	if err := cfg.Write(tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("ablate: %w", err)
	}
	return nil
}

// copyFile copies src to dst atomically; a missing src gives an empty dst.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if errors.Is(err, fs.ErrNotExist) {
		return atomicfile.Write(dst, func(io.Writer) error { return nil })
	}
	if err != nil {
		return fmt.Errorf("ablate: %w", err)
	}
	defer in.Close()
	return atomicfile.Write(dst, func(w io.Writer) error {
		_, err := io.Copy(w, in)
		return err
	})
}
