package eval_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/eval"
	"github.com/recal-project/recal/internal/testpolicy"
	"github.com/recal-project/recal/torchbridge"
	"github.com/recal-project/recal/trainer"
)

func microCheckpoint(t *testing.T) string { return testpolicy.Micro(t, "..", 2) }

type fixture struct {
	setup eval.Setup
	qs    []data.Example
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	trainer.SetThreads(2)
	ck := microCheckpoint(t)
	cfg, err := config.Load("../recal.toml", []string{"router.turn_tokens=8", "data.test_per_dataset=6", "eval.batch=4", `data.test=["ood"]`})
	if err != nil {
		t.Fatal(err)
	}
	qs, err := cfg.Data.LoadTest()
	if err != nil {
		t.Fatal(err)
	}
	eng, err := trainer.OpenEngine(ck, torchbridge.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	env, err := trainer.NewEnv(cfg, eng, trainer.AnswerBank(qs), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Close() })
	return fixture{eval.Setup{Env: env, Batch: 4, Seed: 0}, qs}
}

var routers = []string{"policy", "direct", "largest", "random", "prompt"}

func tableText(t eval.Table) string {
	var b bytes.Buffer
	t.Text(&b)
	return b.String()
}

// An evaluation killed halfway finishes the rest on rerun, without redoing
// what was done, and gives the uninterrupted table; reruns are deterministic.
func TestRunResumesAndIsDeterministic(t *testing.T) {
	f := newFixture(t)
	full := t.TempDir()
	want, err := eval.Run(context.Background(), f.setup, f.qs, routers, full, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(want.Datasets) != 5 || len(want.Rows) != len(routers) {
		t.Fatalf("table has %d datasets and %d rows, want the 5 ood datasets and %d routers", len(want.Datasets), len(want.Rows), len(routers))
	}
	for _, r := range want.Rows {
		if r.Avg.N != len(f.qs) {
			t.Errorf("router %s answered %d questions, want %d", r.Router, r.Avg.N, len(f.qs))
		}
	}
	// Interrupt after the second batch of the first router.
	part := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	batches := 0
	_, err = eval.Run(ctx, f.setup, f.qs, routers, part, nil, func(string, int, int) {
		if batches++; batches == 2 {
			cancel()
		}
	})
	if err == nil {
		t.Fatal("the interrupted run reported no error")
	}
	before, _ := os.ReadFile(filepath.Join(part, "results-policy.jsonl"))
	doneBefore := strings.Count(string(before), "\n")
	if doneBefore == 0 || doneBefore >= len(f.qs) {
		t.Fatalf("%d results before the rerun; want a partial file", doneBefore)
	}
	asked := 0
	got, err := eval.Run(context.Background(), f.setup, f.qs, routers, part, nil, func(r string, done, total int) {
		if r == "policy" {
			asked++
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	after, _ := os.ReadFile(filepath.Join(part, "results-policy.jsonl"))
	if n := strings.Count(string(after), "\n"); n != len(f.qs) {
		t.Errorf("results-policy.jsonl holds %d lines after the rerun, want %d (no question redone)", n, len(f.qs))
	}
	if tableText(got) != tableText(want) {
		t.Errorf("resumed table differs from the uninterrupted one:\n%s\nvs\n%s", tableText(got), tableText(want))
	}
	again, err := eval.Run(context.Background(), f.setup, f.qs, routers, t.TempDir(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tableText(again) != tableText(want) {
		t.Error("two evaluations of the same checkpoint, config and seed differ")
	}
	if err := want.Write(full); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"table.json", "table.csv", "table.md"} {
		if b, err := os.ReadFile(filepath.Join(full, name)); err != nil || len(b) == 0 {
			t.Errorf("%s missing or empty", name)
		}
	}
}

func TestBadInput(t *testing.T) {
	f := newFixture(t)
	if _, err := eval.NewRouter("oracle", f.setup); err == nil || !strings.Contains(err.Error(), "knn") {
		t.Errorf("unknown router: %v, want an error listing the known ones", err)
	}
	if _, err := eval.NewRouter("knn", f.setup); err == nil || !strings.Contains(err.Error(), "knn-log") {
		t.Errorf("knn without logged outcomes: %v", err)
	}
	dir := t.TempDir()
	bad := filepath.Join(dir, "extra.toml")
	os.WriteFile(bad, []byte("[[models]]\nname = \"new\"\nprovider = \"openai\"\n[models.openai]\nmodel = \"m\"\napi_key_env = \"K\"\n"), 0o644)
	if _, err := eval.LoadExtraModels(bad); err == nil || !strings.Contains(err.Error(), "extra.toml") || !strings.Contains(err.Error(), "description") && !strings.Contains(err.Error(), "base_url") {
		t.Errorf("an extra model without description or base_url: %v", err)
	}
	good := filepath.Join(dir, "good.toml")
	os.WriteFile(good, []byte("[[models]]\nname = \"sim-new\"\ndescription = \"an unseen simulated model\"\nprovider = \"sim\"\n[models.sim]\ndefault_accuracy = 0.9\n"), 0o644)
	if m, err := eval.LoadExtraModels(good); err != nil || len(m) != 1 {
		t.Errorf("a valid extra-models file: %v", err)
	}
	if _, err := trainer.OpenEngine(dir, torchbridge.Options{}); err == nil {
		t.Error("a folder that is not a policy opened as one")
	}
}

func TestExtractAnswer(t *testing.T) {
	cases := map[string]string{
		"[simulated sim-a] The answer is Paris.":  "Paris",
		"It is <answer>Rome</answer> I think":     "Rome",
		"Berlin":                                  "Berlin",
		"I believe the answer is  New York City.": "New York City",
	}
	for in, want := range cases {
		if got := eval.ExtractAnswer(in); got != want {
			t.Errorf("ExtractAnswer(%q) = %q, want %q", in, got, want)
		}
	}
}
