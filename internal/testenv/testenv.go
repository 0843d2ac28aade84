// Package testenv opens a policy's routing environment for tests, as
// recal eval does: the checkpoint on the CPU in float32, the pool and
// protocol of a configuration. (It imports trainer, so trainer's own
// internal tests cannot use it; its external tests and the CLI's can.)
package testenv

import (
	"testing"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/rollout"
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
	env, err := rollout.NewEnv(cfg, eng, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Close() })
	return env
}
