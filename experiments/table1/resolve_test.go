package table1

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/recal-project/recal/eval"
	"github.com/recal-project/recal/internal/testing/testenv"
)

// The Router-R1 row runs its run's checkpoints/best where there is one,
// else checkpoints/last: the rule --checkpoint's run is resolved by for the
// ReCal row (rollout.ResolveCheckpoint), so that neither RL row is
// evaluated at another point of its run than the other's rule picks.
func TestTable1PoliciesResolveBothRLRowsAlike(t *testing.T) {
	cfg := table1Config(t)
	recal := filepath.Join(t.TempDir(), "recal", "checkpoints", "step-9")
	cases := []struct {
		name string
		best bool // the run has checkpoints/best → step-1; last names step-2
		want string
	}{
		{"best where there is one", true, "step-1"},
		{"else last", false, "step-2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			testenv.FakeRun(t, dir, cfg, 1)
			testenv.FakeRun(t, dir, cfg, 2)
			if c.best {
				if err := os.Symlink("step-1", filepath.Join(dir, "checkpoints", "best")); err != nil {
					t.Fatal(err)
				}
			}
			got, err := policies(cfg, recal, dir, quietLog())
			if err != nil {
				t.Fatal(err)
			}
			if want := filepath.Join(dir, "checkpoints", c.want); got[eval.PolicyRouterR1] != want {
				t.Errorf("Router-R1 runs %s, want %s", got[eval.PolicyRouterR1], want)
			}
			if got[eval.PolicyReCal] != recal || got[""] != recal || got[eval.PolicyBase] != cfg.Policy.Checkpoint {
				t.Errorf("policies %v: want ReCal and the direct routers at %s, the base policy at policy.checkpoint", got, recal)
			}
		})
	}
}
