package eval_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/eval"
	"github.com/recal-project/recal/eval/baselines"
	"github.com/recal-project/recal/eval/embed"
	"github.com/recal-project/recal/internal/rollout"
)

// fitRouters collects the outcomes of the fixture's pool on a few training
// questions and fits every baseline router into one folder.
func fitRouters(t *testing.T, f fixture, seed int64) string {
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
	m, err := baselines.LoadMatrix(out)
	if err != nil {
		t.Fatal(err)
	}
	bc := baselines.DefaultConfig()
	bc.MLP.Epochs, bc.RouteLLMMF.Epochs, bc.RouterDC.Epochs, bc.GraphRouter.Steps = 2, 2, 2, 5
	dir := t.TempDir()
	ecfg := embed.DefaultConfig()
	ecfg.Dim = 256
	emb, err := embed.New(ecfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range baselines.Names() {
		r, err := baselines.Fit(context.Background(), name, bc, m, emb, seed)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Save(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// The fitted routers evaluate through the harness; their results are keyed
// by their folder's digest (a refit starts afresh, the earlier answers are
// moved aside), and a router without its folder is an error naming the
// commands that make one.
func TestFittedRouters(t *testing.T) {
	f := newFixture(t)
	f.setup.Embedding = embed.DefaultConfig()
	f.setup.Embedding.Dim = 256
	names := baselines.Names()
	if _, err := eval.Run(context.Background(), f.setup, f.qs, names[:1], t.TempDir(), nil, nil); err == nil ||
		!strings.Contains(err.Error(), "recal collect") || !strings.Contains(err.Error(), "recal fit") {
		t.Fatalf("no --router-dir: error %v, want one naming recal collect and recal fit", err)
	}
	f.setup.RouterDir = fitRouters(t, f, 0)
	out := t.TempDir()
	table, err := eval.Run(context.Background(), f.setup, f.qs, names, out, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range table.Rows {
		if r.Avg.N != len(f.qs) || r.Avg.Calls != 1 || r.Avg.WellFormed != 1 {
			t.Errorf("router %s: %d questions, %.2f calls, well-formed %.2f; want %d, 1 direct call each, 1",
				r.Router, r.Avg.N, r.Avg.Calls, r.Avg.WellFormed, len(f.qs))
		}
	}
	f.setup.RouterDir = fitRouters(t, f, 1) // refit with another seed
	if _, err := eval.Run(context.Background(), f.setup, f.qs, names[:1], out, nil, nil); err != nil {
		t.Fatal(err)
	}
	aside, _ := filepath.Glob(filepath.Join(out, "results-"+names[0]+".*.jsonl"))
	if len(aside) != 1 {
		t.Errorf("after a refit, %d results files moved aside, want 1 (the fitted folder keys the results)", len(aside))
	}
	os.RemoveAll(filepath.Join(f.setup.RouterDir, names[1]))
	if _, err := eval.NewRouter(names[1], f.setup); err == nil || !strings.Contains(err.Error(), "recal fit") {
		t.Errorf("missing folder: error %v, want one naming recal fit", err)
	}
}
