package trainer_test

import (
	"context"
	"math"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/llmpool"
	"github.com/recal-project/recal/router"
	"github.com/recal-project/recal/trainer"
)

// A run with the cost component weighted (and gated) scores each response's cost from
// its calls' costs and the pool's dearest call about its question
// (router.CostReward, llmpool.Pool.DearestCall), logs it in rollouts.jsonl
// and its mean in metrics.jsonl, and trains with the advantages the
// independent reference computes from those logs.
func TestTrainCostReward(t *testing.T) {
	if err := rollout.SetThreads(2); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, microCheckpoint(t), "train.steps=2",
		`calibration.gated=["info", "format", "route", "balance", "cost"]`, "calibration.weights.cost=0.5")
	run := filepath.Join(t.TempDir(), "run")
	if err := trainer.Train(context.Background(), cfg.Training(), trainer.Options{RunDir: run}); err != nil {
		t.Fatal(err)
	}
	pool, err := llmpool.New(cfg.Pool)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rolls := readJSONL(t, filepath.Join(run, "rollouts.jsonl"))
	if len(rolls) != 2*2*2 {
		t.Fatalf("%d rollout lines, want 8", len(rolls))
	}
	var mean [3]float64 // by step
	calls := 0
	for _, r := range rolls {
		q := llmpool.Question{ID: r["question_id"].(string), Dataset: r["dataset"].(string), Text: r["question"].(string)}
		for _, g := range r["golden_answers"].([]any) {
			q.Golden = append(q.Golden, g.(string))
		}
		var spend float64
		cs, _ := r["calls"].([]any) // null: no call
		for _, c := range cs {
			spend += c.(map[string]any)["cost"].(float64)
			calls++
		}
		want := router.CostReward(spend, cfg.Router.MaxTurns, pool.DearestCall(&q))
		got := r["rewards_raw"].(map[string]any)["cost"].(float64)
		if got != want {
			t.Errorf("step %v question %s: rewards_raw.cost %v, want %v (spend %v of %d calls at most the dearest %v)",
				r["step"], q.ID, got, want, spend, cfg.Router.MaxTurns, pool.DearestCall(&q))
		}
		mean[int(r["step"].(float64))] += got / 4
	}
	// The micro policy rarely calls (spend 0, cost 1); router's TestCostReward
	// and llmpool's TestDearestCall cover a spend and the dearest call.
	t.Logf("%d pool calls in %d responses", calls, len(rolls))
	for _, m := range readJSONL(t, filepath.Join(run, "metrics.jsonl")) {
		step := int(m["step"].(float64))
		if got := m["reward"].(map[string]any)["cost"].(float64); math.Abs(got-mean[step]) > 1e-12 {
			t.Errorf("step %d: metrics reward.cost %v, want the responses' mean %v", step, got, mean[step])
		}
	}
	if py := python3(t); py != "" {
		script := filepath.Join("..", "calibration", "testdata", "reference.py")
		if out, err := exec.Command(py, script, "check", run).CombinedOutput(); err != nil {
			t.Errorf("reference.py check on a run with the cost component: %v\n%s", err, out)
		}
	}
}
