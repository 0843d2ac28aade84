package table1

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/eval"
	"github.com/recal-project/recal/internal/testing/testenv"
	"github.com/recal-project/recal/internal/testing/testpolicy"
	"github.com/recal-project/recal/trainer"
)

// table1Config is the offline default cut to seconds: a micro policy, four
// training questions per dataset, two test questions per dataset, one step
// of each training.
func table1Config(t *testing.T) config.Config {
	t.Helper()
	ck := testpolicy.Micro(t, "../..", 1)
	cfg, err := config.Load("../../recal.toml", []string{
		"policy.checkpoint=" + ck, "policy.threads=2",
		"data.train_per_dataset=4", "data.val_per_dataset=2", "data.test_per_dataset=2",
		"router.turn_tokens=8", "router.info_tokens=8", "router.max_turns=1",
		"sft.steps=1", "sft.batch_size=2", "train.steps=1", "train.batch_size=2", "train.group_size=2",
		"train.micro_batch=4", "train.checkpoint_every=1", "train.validate_every=1", "eval.batch=8",
	})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// Run makes what is missing, evaluates every row it can run and
// marks the others with why; run again on the same work folder it trains
// nothing, fits nothing, calls no pool and writes no checkpoint, outcome or
// result again, and gives the same table. Router-R1 trains as many steps
// as the ReCal run did and is evaluated at the checkpoint the same rule as
// ReCal's picks (checkpoints/best, else checkpoints/last).
func TestTable1TrainsOnceAndReuses(t *testing.T) {
	cfg := table1Config(t)
	ctx := context.Background()
	run := filepath.Join(t.TempDir(), "recal")
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := trainer.Train(ctx, cfg.Training(), trainer.Options{RunDir: run, Log: quiet}); err != nil {
		t.Fatal(err)
	}
	// The micro policy's one step logs no well-formed call to route by: the
	// knn routers read a log written here.
	knnLog := filepath.Join(t.TempDir(), "rollouts.jsonl")
	logged := `{"question":"who wrote the iliad","rewards_raw":{"ans":1},"calls":[{"model":"sim-factoid"}]}
{"question":"which band was formed first","rewards_raw":{"ans":1},"calls":[{"model":"sim-multihop"}]}
`
	if err := os.WriteFile(knnLog, []byte(logged), 0o644); err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	o := Options{Work: work, Checkpoint: filepath.Join(run, "checkpoints", "last"), Datasets: []string{"nq", "hotpotqa", "popqa"},
		Split: "test", KNNLog: knnLog, KNNK: 2, Log: quiet}
	first, rep, err := Run(ctx, cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Collected == 0 || rep.Calls == 0 {
		t.Errorf("first run: collected %d pairs, %d pool calls; want both > 0", rep.Collected, rep.Calls)
	}
	for _, want := range []string{"sft-direct", "router-r1", "mlp", "routellm-mf", "routerdc", "graphrouter"} {
		if !strings.Contains(strings.Join(rep.Made, ","), want) {
			t.Errorf("first run made %v, want %s among them", rep.Made, want)
		}
	}
	var text bytes.Buffer
	first.Text(&text)
	t.Log(text.String())
	if len(first.Rows) != len(eval.Table1Rows) {
		t.Fatalf("%d rows, want Table 1's %d", len(first.Rows), len(eval.Table1Rows))
	}
	for _, r := range first.Rows {
		switch r.Label {
		case "RAG", "Search-R1":
			if r.Scores != nil || !strings.HasPrefix(r.Status, "not run: ") || !strings.Contains(r.Status, "Wikipedia") {
				t.Errorf("%s: status %q, scores %v; want not run for want of a Wikipedia corpus, no numbers", r.Label, r.Status, r.Scores)
			}
		default:
			if r.Scores == nil || r.Status != "" || r.Scores.Avg.N != 6 {
				t.Errorf("%s: status %q, scores %+v; want 6 questions evaluated", r.Label, r.Status, r.Scores)
			}
		}
	}
	byLabel := map[string]*eval.Row{}
	for _, r := range first.Rows {
		byLabel[r.Label] = r.Scores
	}
	r1Dir := filepath.Join(work, "router-r1")
	if done, err := trainer.Finished(r1Dir, cfg.Train.Steps); err != nil || !done {
		t.Errorf("router-r1 trainer.Finished at the ReCal run's %d steps: %v (%v); want the same step budget as ReCal", cfg.Train.Steps, done, err)
	}
	r1Best, err := os.Readlink(filepath.Join(r1Dir, "checkpoints", "best"))
	if err != nil {
		t.Fatalf("the Router-R1 run has no checkpoints/best (%v): train.keep_best is on and it validated", err)
	}
	for _, r := range first.Rows {
		if r.Label == "Router-R1" && r.Policy != filepath.Join(r1Dir, "checkpoints", r1Best) {
			t.Errorf("the Router-R1 row ran %s, want its run's checkpoints/best (%s), as the ReCal row's run is resolved", r.Policy, r1Best)
		}
	}
	for label, calls := range map[string]float64{"Vanilla": 0, "CoT": 0, "SFT": 0, "Largest LLM": 1, "Prompt LLM": 2, "Prompt LLM*": 4, "KNN Router*": 3} {
		if got := byLabel[label].Avg.Calls; got != calls {
			t.Errorf("%s: %.2f calls per question, want %.0f", label, got, calls)
		}
	}
	// The reference rows: the best single model is at least as good as
	// the largest one (the Largest LLM row asks it the same questions), the
	// oracle at least as good as the best.
	if len(first.References) != 3 {
		t.Fatalf("%d reference rows, want oracle, best and cheapest", len(first.References))
	}
	oracle, best := first.References[0], first.References[1]
	if oracle.Reference != eval.RefOracle || best.Reference != eval.RefBest || best.Avg.EM < byLabel["Largest LLM"].Avg.EM || oracle.Avg.EM < best.Avg.EM {
		t.Errorf("reference rows %+v, %+v: want the oracle ≥ the best single model ≥ Largest LLM (%.3f)", oracle, best, byLabel["Largest LLM"].Avg.EM)
	}
	out := filepath.Join(work, "eval-test")
	for _, f := range []string{"table.json", "table.csv", "table.md"} {
		if b, err := os.ReadFile(filepath.Join(out, f)); err != nil || !bytes.Contains(b, []byte("Router-R1")) || !bytes.Contains(b, []byte(best.Model)) ||
			!bytes.Contains(b, []byte("cost_per_question")) && !bytes.Contains(b, []byte("cost/q")) {
			t.Errorf("%s: %v, want a table naming every row, the reference rows and the cost per question", f, err)
		}
	}
	if !strings.Contains(text.String(), "-- "+eval.GroupReference) || !strings.Contains(text.String(), "cost/question") {
		t.Errorf("the printed table lacks the reference rows or the cost per question:\n%s", text.String())
	}

	before := testenv.Mtimes(t, work)
	second, rep, err := Run(ctx, cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Made) != 0 || rep.Collected != 0 || rep.Calls != 0 {
		t.Errorf("second run made %v, collected %d pairs and made %d pool calls; want nothing made and no call", rep.Made, rep.Collected, rep.Calls)
	}
	after := testenv.Mtimes(t, work)
	for p, m := range before {
		if strings.HasPrefix(filepath.Base(p), "table.") {
			continue // the table is written again, with the same contents
		}
		if !after[p].Equal(m) {
			t.Errorf("%s was written again by the second run", p)
		}
	}
	a, _ := json.Marshal(first)
	b, _ := json.Marshal(second)
	if !bytes.Equal(a, b) {
		t.Errorf("the second run's table differs from the first:\n%s\nvs\n%s", a, b)
	}
}

// Without the ReCal checkpoint or the logged outcomes the knn rows route
// by, table1 stops before doing anything, naming the command that makes
// what is missing.
func TestTable1MissingInputsNameTheirCommand(t *testing.T) {
	cfg := table1Config(t)
	dir := t.TempDir()
	ck := filepath.Join(dir, "run", "checkpoints", "last")
	cases := []struct {
		name  string
		setup func()
		want  string
	}{
		{"no checkpoint", func() {}, "make train"},
		{"a checkpoint without its run's rollouts", func() {
			if err := os.MkdirAll(ck, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(ck, "model.safetensors"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}, "recal train"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.setup()
			work := filepath.Join(dir, "work")
			_, _, err := Run(context.Background(), cfg, Options{Work: work, Checkpoint: ck, Datasets: []string{"nq"}, Split: "nq", R1Steps: 1})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one naming %q", err, c.want)
			}
			if _, err := os.Stat(work); err == nil {
				t.Error("the work folder was created although the run could not start")
			}
		})
	}
}

// The Router-R1 row's run is trained with ReCal's step budget by default
// (train.steps of the ReCal run's configuration; --r1-steps overrides it)
// and reused or refused as `recal train --resume` would continue it, with
// errors that say table1, not another command. No case trains: each finds
// a trainer.Finished run, or is refused before training.
func TestTable1RouterR1Reuse(t *testing.T) {
	cfg := table1Config(t)
	start := cfg.Policy.Checkpoint
	digest, err := eval.CheckpointDigest(start)
	if err != nil {
		t.Fatal(err)
	}
	// r1 is the configuration table1 trains Router-R1 with, for steps.
	r1 := func(steps int, edit func(c *config.Config)) config.Config {
		c := cfg
		c.Train.Algorithm, c.Train.Steps = "ppo", steps
		c.Policy.Checkpoint, c.SFT.Steps = start, 0
		if edit != nil {
			edit(&c)
		}
		return c
	}
	cases := []struct {
		name       string
		recalSteps int           // train.steps of the ReCal run
		r1Steps    int           // --r1-steps (0: not given)
		run        config.Config // what the Router-R1 run was trained with
		step       int           // its last checkpoint
		want       string        // "" = reused; else the error holds it
	}{
		{"by default as many steps as the ReCal run", 2, 0, r1(2, nil), 2, ""},
		{"the default follows the ReCal run", 7, 0, r1(2, nil), 2, "train.steps: 2 in the run, 7 now"},
		{"--r1-steps overrides the default", 7, 2, r1(2, nil), 2, ""},
		{"keys train --resume accepts", 2, 0, r1(2, func(c *config.Config) {
			c.Train.MicroBatch, c.Train.ValidateEvery, c.Data.Test, c.Pool.MaxConcurrency = 3, 5, []string{"popqa"}, 9
		}), 2, ""},
		{"a training key", 2, 0, r1(2, func(c *config.Config) { c.Train.LR = 1 }), 2, "train.lr"},
		{"past the final step", 2, 0, r1(2, nil), 3, "past train.steps"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			recalRun := t.TempDir()
			rc := cfg
			rc.Train.Steps = c.recalSteps
			if err := rc.Write(filepath.Join(recalRun, "config.toml")); err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(t.TempDir(), "router-r1")
			testenv.FakeRun(t, dir, c.run, c.step)
			if err := os.WriteFile(filepath.Join(dir, "start.digest"), []byte(digest), 0o644); err != nil {
				t.Fatal(err)
			}
			before := testenv.Mtimes(t, dir)
			o := Options{R1Steps: c.r1Steps, R1Start: start, Log: quietLog()}
			made, err := routerR1(context.Background(), cfg, dir, recalRun, o)
			if made {
				t.Errorf("routerR1 trained; want the trainer.Finished run reused or refused")
			}
			if c.want == "" {
				if err != nil {
					t.Fatalf("%v; want the trainer.Finished run reused", err)
				}
			} else {
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("error %v; want one naming %q", err, c.want)
				}
				if !strings.HasPrefix(err.Error(), "table1: router-r1: ") || strings.Contains(err.Error(), "ablate") {
					t.Errorf("error %q: want it to start with table1: router-r1: and name no other command", err)
				}
			}
			after := testenv.Mtimes(t, dir)
			for p, m := range before {
				if !after[p].Equal(m) {
					t.Errorf("%s was written: a reused or refused run is left as it is", p)
				}
			}
		})
	}
}
