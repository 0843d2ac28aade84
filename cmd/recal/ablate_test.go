package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/eval"
	"github.com/recal-project/recal/experiments/ablate"
	"github.com/recal-project/recal/llmpool"
)

// recal ablate on another world than the paper's seven datasets (the
// hand-written replay world: nq in domain, triviaqa out of domain)
// evaluates the config's own test datasets, takes in-domain from
// data.train, and adds the reference rows computed from the logged
// answers: guesser (judgments rendered "The answer is <golden>.") is right
// on e1 and v1, oracle's prose ("I believe it is ...") never matches
// exactly, so the oracle and the best single model are guesser's 0.5 on
// each dataset; --split ood is triviaqa alone.
func TestAblateOnReplayWorld(t *testing.T) {
	w := newReplayWorld(t, "")
	cfg := worldConfig(t, w.dir, worldReplayModels, "")
	root := filepath.Join(w.dir, "study")
	code, stdout, stderr := runCLI(t, "--threads", "2", "ablate", "--config", cfg, "--run-dir", root, "--steps", "1")
	if code != 0 {
		t.Fatalf("ablate: exit %d: %s", code, stderr)
	}
	var tab ablate.Table
	if err := json.Unmarshal(readFile(t, filepath.Join(root, "ablation.json")), &tab); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tab.Datasets, []string{"nq", "triviaqa"}) || !slices.Equal(tab.InDomain, []string{"nq"}) {
		t.Fatalf("datasets %v, in domain %v; want nq and triviaqa, nq in domain (the config's data.test and data.train)", tab.Datasets, tab.InDomain)
	}
	// Expected from the log itself: each test question's replayed reply per model.
	render := map[string]string{"oracle": llmpool.RenderText, "guesser": llmpool.RenderJudgment}
	em := map[string]map[string]float64{} // model → dataset → EM
	for _, q := range worldQuestions {
		if q.split != "test" {
			continue
		}
		for m, r := range render {
			if em[m] == nil {
				em[m] = map[string]float64{}
			}
			reply := w.render.Text(w.rows[[2]string{q.ds + "/" + q.id, m}], r)
			em[m][q.ds] += data.ExactMatch(eval.ExtractAnswer(reply), []string{q.golden}) / 2
		}
	}
	if em["guesser"]["nq"] != 0.5 || em["guesser"]["triviaqa"] != 0.5 || em["oracle"]["nq"] != 0 || em["oracle"]["triviaqa"] != 0 {
		t.Fatalf("the world is not as this test reads it: EM %v", em)
	}
	refs := map[string]ablate.Row{}
	for _, r := range tab.References {
		refs[r.Name] = r
	}
	for _, c := range []struct {
		kind, label string
	}{{eval.RefOracle, "oracle"}, {eval.RefBest, "best (guesser)"}, {eval.RefCheapest, "cheapest (guesser)"}} {
		r, ok := refs[c.kind]
		if !ok || r.Label != c.label {
			t.Errorf("reference row %s: %+v, want label %q", c.kind, r, c.label)
			continue
		}
		for col, want := range map[string]float64{"nq": 0.5, "triviaqa": 0.5, ablate.ColInDomain: 0.5, ablate.ColOutOfDomain: 0.5, ablate.ColAverage: 0.5} {
			if got := r.Cells[col].Mean; math.Abs(got-want) > 1e-12 {
				t.Errorf("%s %s = %v, want %v", c.kind, col, got, want)
			}
		}
	}
	if cost := refs[eval.RefOracle].Cells[ablate.ColCost].Mean; cost <= 0 || cost != refs[eval.RefBest].Cells[ablate.ColCost].Mean {
		t.Errorf("oracle cost per question %v, want guesser's %v (its answers are guesser's)", cost, refs[eval.RefBest].Cells[ablate.ColCost].Mean)
	}
	for _, s := range []string{"oracle", "best (guesser)", "nq†", "cost/q"} {
		if !strings.Contains(stdout, s) {
			t.Errorf("the printed table lacks %q:\n%s", s, stdout)
		}
	}
	md := string(readFile(t, filepath.Join(root, "ablation.md")))
	if !strings.Contains(md, "| *oracle* (reference) | 0.500 | 0.500 | 0.500 | 0.500 | 0.500 |") {
		t.Errorf("ablation.md lacks the oracle row:\n%s", md)
	}

	// --split ood: the datasets of data.test not in data.train, evaluated
	// with the runs already trained.
	code, _, stderr = runCLI(t, "--threads", "2", "ablate", "--config", cfg, "--run-dir", root, "--steps", "1", "--split", "ood")
	if code != 0 {
		t.Fatalf("ablate --split ood: exit %d: %s", code, stderr)
	}
	if err := json.Unmarshal(readFile(t, filepath.Join(root, "ablation.json")), &tab); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tab.Datasets, []string{"triviaqa"}) || !slices.Contains(tab.Columns, ablate.ColOutOfDomain) || slices.Contains(tab.Columns, ablate.ColInDomain) {
		t.Errorf("--split ood: datasets %v, columns %v; want triviaqa alone, no in-domain column", tab.Datasets, tab.Columns)
	}
	if _, err := os.Stat(filepath.Join(root, "reference-ood", eval.ModelResultsFile("guesser"))); err != nil {
		t.Errorf("--split ood: %v", err)
	}
}
