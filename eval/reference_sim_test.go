package eval_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/eval"
	"github.com/recal-project/recal/internal/rollout"
)

// On the offline default's simulated pool (no policy needed), the
// reference rows bound the largest router's row as they must: the oracle's
// EM is at least the best single model's, which is at least the largest
// model's; the cheapest model costs no more per question; a rerun asks
// nothing again; and every format shows the rows.
func TestReferencesOnSimulatedPool(t *testing.T) {
	cfg, err := config.Load("../recal.toml", []string{"data.test_per_dataset=6", "eval.batch=4", `data.test=["nq", "popqa"]`})
	if err != nil {
		t.Fatal(err)
	}
	qs, err := cfg.Data.LoadTest()
	if err != nil {
		t.Fatal(err)
	}
	env, err := rollout.NewEnv(cfg.Rollout(), nil, rollout.AnswerBank(qs), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	s := eval.Setup{Env: env, Batch: 4, Pool: cfg.Pool, InDomain: cfg.Data.InDomain()}
	out := t.TempDir()
	tab, err := eval.Run(context.Background(), s, qs, []string{"largest"}, out, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	refs, err := eval.References(context.Background(), s, qs, out, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	tab.References = refs
	if len(refs) != 3 || refs[0].Reference != eval.RefOracle || refs[1].Reference != eval.RefBest || refs[2].Reference != eval.RefCheapest {
		t.Fatalf("reference rows %+v, want oracle, best, cheapest", refs)
	}
	largest := tab.Rows[0]
	oracle, best, cheapest := refs[0], refs[1], refs[2]
	for _, d := range tab.Datasets {
		if oracle.Datasets[d].EM < best.Datasets[d].EM || oracle.Datasets[d].EM < cheapest.Datasets[d].EM {
			t.Errorf("%s: oracle EM %.3f below the best's %.3f or the cheapest's %.3f", d, oracle.Datasets[d].EM, best.Datasets[d].EM, cheapest.Datasets[d].EM)
		}
	}
	if best.Avg.EM < largest.Avg.EM {
		t.Errorf("best single model %s: Avg EM %.3f below the largest router's %.3f", best.Model, best.Avg.EM, largest.Avg.EM)
	}
	if cheapest.CostPerQuestion > largest.CostPerQuestion || cheapest.CostPerQuestion <= 0 {
		t.Errorf("cheapest single model %s costs %g per question; the largest router %g", cheapest.Model, cheapest.CostPerQuestion, largest.CostPerQuestion)
	}
	for _, r := range append([]eval.Row{largest}, refs...) {
		if r.Avg.N != len(qs) || r.CostPerQuestion != r.Avg.Cost/float64(len(qs)) {
			t.Errorf("%s: n %d, cost/q %g; want n %d and cost/q = cost %g / n", r.Label(), r.Avg.N, r.CostPerQuestion, len(qs), r.Avg.Cost)
		}
	}
	// Each model's answers are kept in its own results file.
	if b, err := os.ReadFile(filepath.Join(out, eval.ModelResultsFile(best.Model))); err != nil || strings.Count(string(b), "\n") != len(qs) {
		t.Errorf("results file of model %s: %v, %d lines; want %d", best.Model, err, strings.Count(string(b), "\n"), len(qs))
	}
	// A rerun reuses every answer.
	asked := 0
	again, err := eval.References(context.Background(), s, qs, out, nil, func(string, int, int) { asked++ })
	if err != nil {
		t.Fatal(err)
	}
	if asked != 0 || again[0].Avg != oracle.Avg || again[1].Model != best.Model {
		t.Errorf("rerun asked %d batches and gave %+v; want none asked and the same rows", asked, again)
	}
	if err := tab.Write(out); err != nil {
		t.Fatal(err)
	}
	var txt bytes.Buffer
	tab.Text(&txt)
	md, _ := os.ReadFile(filepath.Join(out, "table.md"))
	cs, _ := os.ReadFile(filepath.Join(out, "table.csv"))
	js, _ := os.ReadFile(filepath.Join(out, "table.json"))
	for format, want := range map[string][]string{
		"text":     {"-- reference", "oracle", "best (" + best.Model + ")", "cheapest (" + cheapest.Model + ")", "cost/question", "not routers", "nq*"},
		"markdown": {"| *oracle* (reference) |", "| *best (" + best.Model + ")* (reference) |", "cost/q", "not routers", "nq†"},
	} {
		got := map[string]string{"text": txt.String(), "markdown": string(md)}[format]
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Errorf("%s table lacks %q:\n%s", format, w, got)
			}
		}
	}
	lines, err := csv.NewReader(bytes.NewReader(cs)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, l := range lines {
		if l[0] == "" && l[3] == "avg" && (l[1] == eval.RefOracle || l[1] == eval.RefBest && l[2] == best.Model || l[1] == eval.RefCheapest && l[2] == cheapest.Model) {
			found++
		}
	}
	if found != 3 || lines[0][8] != "cost_per_question" {
		t.Errorf("table.csv has %d of the 3 reference rows' avg lines (header %v):\n%s", found, lines[0], cs)
	}
	var back eval.Table
	if err := json.Unmarshal(js, &back); err != nil || len(back.References) != 3 || back.References[1].Model != best.Model ||
		back.References[0].CostPerQuestion != oracle.CostPerQuestion || len(back.InDomain) != 2 {
		t.Errorf("table.json: %v; references %+v, in-domain %v", err, back.References, back.InDomain)
	}
}
