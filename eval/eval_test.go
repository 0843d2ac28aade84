package eval_test

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/eval"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/internal/testing/testpolicy"
	"github.com/recal-project/recal/torchbridge"
)

func microCheckpoint(t *testing.T) string { return testpolicy.Micro(t, "..", 2) }

type fixture struct {
	setup eval.Setup
	qs    []data.Example
}

func newFixture(t *testing.T) fixture { return fixtureFor(t, microCheckpoint(t)) }

// fixtureFor evaluates checkpoint ck on 6 questions of each ood dataset.
func fixtureFor(t *testing.T, ck string) fixture { return fixtureWith(t, ck, torchbridge.Options{}) }

// fixtureWith is fixtureFor with the policy opened with opts.
func fixtureWith(t *testing.T, ck string, opts torchbridge.Options) fixture {
	t.Helper()
	rollout.SetThreads(2)
	cfg, err := config.Load("../recal.toml", []string{"router.turn_tokens=8", "data.test_per_dataset=6", "eval.batch=4", `data.test=["ood"]`})
	if err != nil {
		t.Fatal(err)
	}
	qs, err := cfg.Data.LoadTest()
	if err != nil {
		t.Fatal(err)
	}
	eng, err := rollout.OpenEngine(ck, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	env, err := rollout.NewEnv(cfg.Rollout(), eng, rollout.AnswerBank(qs), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Close() })
	return fixture{eval.Setup{Env: env, Batch: 4, Seed: 0, Pool: cfg.Pool}, qs}
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
	if _, err := rollout.OpenEngine(dir, torchbridge.Options{}); err == nil {
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

// readAnswers returns the responses of a results file by question id.
func readAnswers(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var r rollout.QuestionResult
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if _, dup := out[r.ID]; dup {
			t.Errorf("%s answers %s twice: results of two evaluations mixed", path, r.ID)
		}
		out[r.ID] = r.Response
	}
	return out
}

// Results are keyed by what decides them: evaluating checkpoint A and then
// checkpoint B (other weights) into one folder reports B's own answers, not
// A's resumed ones; A's are kept aside and taken back when A is evaluated
// again; the baseline routers, which do not read the checkpoint, are not
// asked again.
func TestRunKeysResultsByCheckpoint(t *testing.T) {
	a := fixtureFor(t, testpolicy.Micro(t, "..", 2))
	b := fixtureFor(t, testpolicy.Micro(t, "..", 3))
	ctx := context.Background()
	routers := []string{"policy", "random"}
	wantB := t.TempDir()
	tableB, err := eval.Run(ctx, b.setup, b.qs, routers, wantB, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tableA, err := eval.Run(ctx, a.setup, a.qs, routers, dir, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	answersA := readAnswers(t, filepath.Join(dir, "results-policy.jsonl"))
	answersB := readAnswers(t, filepath.Join(wantB, "results-policy.jsonl"))
	if maps.Equal(answersA, answersB) {
		t.Fatal("checkpoints A and B give the same responses; the test needs policies that differ")
	}

	asked := map[string]int{}
	count := func(r string, done, total int) { asked[r]++ }
	got, err := eval.Run(ctx, b.setup, b.qs, routers, dir, nil, count)
	if err != nil {
		t.Fatal(err)
	}
	if g := readAnswers(t, filepath.Join(dir, "results-policy.jsonl")); !maps.Equal(g, answersB) {
		t.Error("evaluating B into A's folder did not give B's own answers (A's were resumed or mixed in)")
	}
	if tableText(got) != tableText(tableB) {
		t.Errorf("B's table in A's folder differs from B's table in a fresh folder:\n%s\nvs\n%s", tableText(got), tableText(tableB))
	}
	if asked["random"] != 0 {
		t.Errorf("the random router was asked again (%d batches) although its answers do not depend on the checkpoint", asked["random"])
	}
	aside, _ := filepath.Glob(filepath.Join(dir, "results-policy.*.jsonl"))
	if len(aside) != 1 || !maps.Equal(readAnswers(t, aside[0]), answersA) {
		t.Errorf("A's results moved aside: %v, want one file holding A's answers", aside)
	}

	asked = map[string]int{}
	again, err := eval.Run(ctx, a.setup, a.qs, routers, dir, nil, count)
	if err != nil {
		t.Fatal(err)
	}
	if asked["policy"] != 0 || tableText(again) != tableText(tableA) {
		t.Errorf("evaluating A again asked the policy %d times (want 0: its results were kept aside) and gave\n%s\nwant\n%s",
			asked["policy"], tableText(again), tableText(tableA))
	}
}

// A float32 policy on the CPU answers the same whatever eval.batch (its
// decoding is row-invariant), so the batch does not key its results and a
// rerun with another batch resumes them; a bfloat16 policy's rows depend on
// the rows decoded with them, so there the batch keys the results and a
// rerun with another batch starts afresh instead of mixing answers.
func TestRunKeysBatchingWhereAnswersDependOnIt(t *testing.T) {
	ck := microCheckpoint(t)
	ctx := context.Background()
	for _, tc := range []struct {
		dtype     string
		invariant bool
	}{{"float32", true}, {"bfloat16", false}} {
		t.Run(tc.dtype, func(t *testing.T) {
			f := fixtureWith(t, ck, torchbridge.Options{DType: tc.dtype})
			if inv, err := f.setup.Env.Engine.Policy.RowInvariant(); err != nil || inv != tc.invariant {
				t.Fatalf("RowInvariant() = %v, %v; want %v", inv, err, tc.invariant)
			}
			dir := t.TempDir()
			if _, err := eval.Run(ctx, f.setup, f.qs, []string{"policy"}, dir, nil, nil); err != nil {
				t.Fatal(err)
			}
			batch4 := readAnswers(t, filepath.Join(dir, "results-policy.jsonl"))
			one := f.setup
			one.Batch = 1
			asked := 0
			if _, err := eval.Run(ctx, one, f.qs, []string{"policy"}, dir, nil, func(string, int, int) { asked++ }); err != nil {
				t.Fatal(err)
			}
			aside, _ := filepath.Glob(filepath.Join(dir, "results-policy.*.jsonl"))
			if !tc.invariant {
				if len(aside) != 1 || asked == 0 {
					t.Errorf("a %s policy evaluated again with eval.batch 1 after 4: %d results files moved aside, policy asked %d times; want the batch-4 answers moved aside and all asked again (its answers depend on the batch)", tc.dtype, len(aside), asked)
				}
				return
			}
			if len(aside) != 0 || asked != 0 {
				t.Errorf("a %s policy evaluated again with eval.batch 1 after 4: %d results files moved aside, policy asked %d times; want the results resumed (the batch does not change its answers)", tc.dtype, len(aside), asked)
			}
			fresh := t.TempDir()
			if _, err := eval.Run(ctx, one, f.qs, []string{"policy"}, fresh, nil, nil); err != nil {
				t.Fatal(err)
			}
			if got := readAnswers(t, filepath.Join(fresh, "results-policy.jsonl")); !maps.Equal(got, batch4) {
				t.Errorf("a %s policy answered differently with eval.batch 1 and 4; its decoding must be row-invariant", tc.dtype)
			}
		})
	}
}

// A result that cannot be encoded (a NaN score) fails the evaluation,
// naming the question, instead of writing an empty line that the next run
// would skip.
func TestRunReportsUnencodableResults(t *testing.T) {
	f := newFixture(t)
	eval.Routers["nan"] = eval.Spec{New: func(s eval.Setup) (eval.Router, error) { return nanRouter{}, nil }}
	t.Cleanup(func() { delete(eval.Routers, "nan") })
	dir := t.TempDir()
	_, err := eval.Run(context.Background(), f.setup, f.qs, []string{"nan"}, dir, nil, nil)
	if err == nil || !strings.Contains(err.Error(), f.qs[0].ID) || !strings.Contains(err.Error(), "NaN") {
		t.Fatalf("error %v, want one naming question %s and the NaN", err, f.qs[0].ID)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "results-nan.jsonl")); len(b) != 0 {
		t.Errorf("results-nan.jsonl holds %q, want nothing written for a batch that failed", b)
	}
}

type nanRouter struct{}

func (nanRouter) Answer(_ context.Context, qs []data.Example) ([]rollout.QuestionResult, error) {
	out := make([]rollout.QuestionResult, len(qs))
	for i, q := range qs {
		out[i] = rollout.QuestionResult{ID: q.ID, Dataset: q.Dataset, Cost: math.NaN()}
	}
	return out, nil
}

// The checkpoint digest reads the files that decide answers, not the path
// or the optimizer and trainer state.
func TestCheckpointDigest(t *testing.T) {
	ck := testpolicy.Micro(t, "..", 2)
	base, err := eval.CheckpointDigest(ck)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ck, "trainer_state.json"), []byte(`{"step": 3}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if d, _ := eval.CheckpointDigest(ck); d != base {
		t.Error("the digest changed with trainer_state.json, which does not decide answers")
	}
	link := filepath.Join(t.TempDir(), "last")
	if err := os.Symlink(ck, link); err != nil {
		t.Fatal(err)
	}
	if d, _ := eval.CheckpointDigest(link); d != base {
		t.Error("the digest through a symlink (checkpoints/last) differs from the folder's")
	}
	w := filepath.Join(ck, "model.safetensors")
	b, err := os.ReadFile(w)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 1 // one bit of the last weight
	if err := os.WriteFile(w, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if d, _ := eval.CheckpointDigest(link); d == base {
		t.Error("the digest did not change with the weights")
	}
	if _, err := eval.CheckpointDigest(t.TempDir()); err == nil {
		t.Error("a folder without weights has a digest")
	}
}

// The text table says how many responses had a tag closed by
// router.on_repeat = "close", per router that had any, and says nothing
// when none had.
func TestTextNamesClosedShare(t *testing.T) {
	row := func(name string, closed float64) eval.Row {
		sc := rollout.Score{EM: 0.5, F1: 0.5, N: 4, WellFormed: 1, Closed: closed}
		return eval.Row{Router: name, Datasets: map[string]rollout.Score{"nq": sc}, Avg: sc}
	}
	for _, c := range []struct {
		rows []eval.Row
		want string
	}{
		{[]eval.Row{row("policy", 0.25), row("knn", 0)}, `responses with a looping tag closed by router.on_repeat = "close" (well-formed counts them): policy 0.250` + "\n"},
		{[]eval.Row{row("policy", 0.25), row("sft", 0.5)}, "policy 0.250, sft 0.500\n"},
		{[]eval.Row{row("policy", 0), row("knn", 0)}, ""},
	} {
		got := tableText(eval.Table{Datasets: []string{"nq"}, Rows: c.rows})
		if c.want == "" {
			if strings.Contains(got, "closed by") {
				t.Errorf("no response closed, yet the table says:\n%s", got)
			}
		} else if !strings.HasSuffix(got, c.want) {
			t.Errorf("table ends\n%s\nwant it to end %q", got[max(0, len(got)-200):], c.want)
		}
	}
}
