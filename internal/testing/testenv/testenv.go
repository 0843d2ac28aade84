// Package testenv opens a policy's routing environment for tests, as
// recal eval does: the checkpoint on the CPU in float32, the pool and
// protocol of a configuration; and it fakes finished run folders. (It
// imports rollout, so rollout's own internal tests cannot use it; its
// external tests and those of the packages above it can.)
package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/torchbridge"
)

// Open loads checkpoint ck on the CPU (2 threads) with cfg's pool and
// protocol; both are closed when the test ends.
func Open(t testing.TB, ck string, cfg config.Config) *rollout.Env {
	t.Helper()
	if err := rollout.SetThreads(2); err != nil {
		t.Fatal(err)
	}
	eng, err := rollout.OpenEngine(ck, torchbridge.Options{Device: "cpu", DType: "float32"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	env, err := rollout.NewEnv(cfg.Rollout(), eng, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Close() })
	return env
}

// FakeRun makes dir a run folder trained with cfg whose checkpoints/last
// names checkpoints/step-<step>: every file of a checkpoint is there (the
// weights empty), as trainer.TrainedAs, trainer.Finished and `recal train --resume`'s
// checks read them.
func FakeRun(t testing.TB, dir string, cfg config.Config, step int) {
	t.Helper()
	ck := filepath.Join(dir, "checkpoints")
	name := fmt.Sprintf("step-%d", step)
	if err := os.MkdirAll(filepath.Join(ck, name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Write(filepath.Join(dir, "config.toml")); err != nil {
		t.Fatal(err)
	}
	for f, text := range map[string]string{"config.json": "{}", "model.safetensors": "", "optimizer.safetensors": "",
		"trainer_state.json": fmt.Sprintf(`{"sft_done": true, "step": %d}`, step)} {
		if err := os.WriteFile(filepath.Join(ck, name, f), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(filepath.Join(ck, "last")); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if err := os.Symlink(name, filepath.Join(ck, "last")); err != nil {
		t.Fatal(err)
	}
}
