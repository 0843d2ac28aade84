package eval_test

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/eval"
	"github.com/recal-project/recal/eval/baselines"
	"github.com/recal-project/recal/internal/rollout"
)

// collectOutcomes writes the outcome matrix of the fixture's pool on a few
// training questions and returns its folder.
func collectOutcomes(t *testing.T, f fixture) string {
	t.Helper()
	cfg, err := config.Load("../recal.toml", []string{"data.train_per_dataset=30", "data.val_per_dataset=2"})
	if err != nil {
		t.Fatal(err)
	}
	train, _, err := cfg.Data.LoadTrain()
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	info, err := baselines.PoolIdentity(f.setup.Pool, rollout.AnswerBank(f.qs))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := baselines.Collect(context.Background(), out, baselines.CollectOptions{Pool: f.setup.Env.Pool, Info: info,
		Questions: train, Extract: eval.ExtractAnswer}); err != nil {
		t.Fatal(err)
	}
	return out
}

// The cascade asks the chain's models in order: at threshold 0 the cheapest
// alone, at 1 every model of the chain; its cost is every call's.
func TestCascadeRouter(t *testing.T) {
	f := newFixture(t)
	if _, err := eval.NewRouter("cascade", f.setup); err == nil || !strings.Contains(err.Error(), "recal collect") {
		t.Fatalf("no --outcomes: error %v, want one naming recal collect", err)
	}
	f.setup.Outcomes = collectOutcomes(t, f)
	m, err := baselines.LoadMatrix(f.setup.Outcomes)
	if err != nil {
		t.Fatal(err)
	}
	rule, err := baselines.FitCascade(m)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		threshold float64
		calls     int
	}{{0, 1}, {1, len(rule.Chain)}} {
		f.setup.CascadeThreshold = c.threshold
		r, err := eval.NewRouter("cascade", f.setup)
		if err != nil {
			t.Fatal(err)
		}
		res, err := r.Answer(context.Background(), f.qs)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range res {
			if len(q.Calls) != c.calls {
				t.Fatalf("threshold %v: question %s made %d calls, want %d (chain %v)", c.threshold, q.ID, len(q.Calls), c.calls, rule.Chain)
			}
			sum := 0.0
			for k, call := range q.Calls {
				if call.Model != rule.Chain[k] {
					t.Errorf("threshold %v: call %d went to %s, want %s: the chain's order", c.threshold, k, call.Model, rule.Chain[k])
				}
				sum += call.Cost
			}
			if math.Abs(q.Cost-sum) > 1e-15 {
				t.Errorf("threshold %v: question %s cost %v, want the sum of its calls' %v", c.threshold, q.ID, q.Cost, sum)
			}
			if want := eval.ExtractAnswer(q.Calls[len(q.Calls)-1].Reply); q.Answer != want {
				t.Errorf("answer %q, want the last asked model's %q", q.Answer, want)
			}
		}
	}
	for _, bad := range []float64{-0.5, 1.5, math.NaN()} {
		f.setup.CascadeThreshold = bad
		if _, err := eval.NewRouter("cascade", f.setup); err == nil || !strings.Contains(err.Error(), "--cascade-threshold") {
			t.Errorf("threshold %v: error %v, want one naming --cascade-threshold", bad, err)
		}
	}
}
