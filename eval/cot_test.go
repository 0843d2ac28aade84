package eval_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/eval"
	"github.com/recal-project/recal/experiments/sftdirect"
)

// The no-routing rows make no pool call; cot reads its own template
// (results keyed by its text), sft its own checkpoint.
func TestNoRoutingRows(t *testing.T) {
	f := newFixture(t)
	ck := microCheckpoint(t)
	cfg, err := config.Load("../recal.toml", []string{"policy.checkpoint=" + ck, "sft.steps=2", "sft.batch_size=4",
		"data.train_per_dataset=8", "data.val_per_dataset=2"})
	if err != nil {
		t.Fatal(err)
	}
	sft := filepath.Join(t.TempDir(), "sft-direct")
	if err := sftdirect.Train(context.Background(), cfg, sftdirect.Options{Out: sft, BaseID: "test",
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}); err != nil {
		t.Fatal(err)
	}
	tmpl := filepath.Join(t.TempDir(), "cot.tmpl")
	if err := os.WriteFile(tmpl, []byte("Think step by step, then answer.\nQuestion: {{.Question}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := f.setup
	s.SFTCheckpoint, s.CoTTemplate = sft, tmpl
	dir := t.TempDir()
	qs := f.qs[:4]
	before := s.Env.Pool.Usage()
	table, err := eval.Run(context.Background(), s, qs, []string{"cot", "sft"}, dir, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range table.Rows {
		if r.Avg.N != len(qs) || r.Avg.Calls != 0 || r.Avg.Cost != 0 {
			t.Errorf("%s: %d answers, %.2f calls per question, cost %g; want %d answers with no call", r.Router, r.Avg.N, r.Avg.Calls, r.Avg.Cost, len(qs))
		}
	}
	for m, u := range s.Env.Pool.Usage().Sub(before) {
		if u.Calls != 0 {
			t.Errorf("the pool was called %d times (model %s) by routers that answer alone", u.Calls, m)
		}
	}
	// Another CoT template is another evaluation: its results start afresh.
	if err := os.WriteFile(tmpl, []byte("Reason step by step first.\nQuestion: {{.Question}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := eval.Run(context.Background(), s, qs, []string{"cot"}, dir, nil, nil); err != nil {
		t.Fatal(err)
	}
	if aside, _ := filepath.Glob(filepath.Join(dir, "results-cot.*.jsonl")); len(aside) != 1 {
		t.Errorf("after changing the CoT template, results moved aside: %v; want the first template's results kept apart", aside)
	}
}

// A router asked for without what it is built from fails, naming the
// command or flag that makes it.
func TestMissingInputsNameTheirCommand(t *testing.T) {
	f := newFixture(t)
	cases := []struct {
		name   string
		router string
		edit   func(*eval.Setup)
		want   string
	}{
		{"sft without a checkpoint", "sft", func(s *eval.Setup) {}, "recal train-sft-direct"},
		{"sft with a folder that is no checkpoint", "sft", func(s *eval.Setup) { s.SFTCheckpoint = t.TempDir() }, "recal train-sft-direct"},
		{"cot without its template", "cot", func(s *eval.Setup) { s.CoTTemplate = filepath.Join(t.TempDir(), "none.tmpl") }, "none.tmpl"},
		{"knn-decomp without logged outcomes", "knn-decomp", func(s *eval.Setup) {}, "--knn-log"},
		{"prompt-decomp with an unknown selector", "prompt-decomp", func(s *eval.Setup) { s.Selector = "nobody" }, "--selector"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := f.setup
			c.edit(&s)
			_, err := eval.NewRouter(c.router, s)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("NewRouter(%s) = %v, want an error naming %q", c.router, err, c.want)
			}
		})
	}
}
