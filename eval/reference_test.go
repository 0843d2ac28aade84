package eval

import (
	"math"
	"testing"

	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/llmpool"
	"github.com/recal-project/recal/router"
)

// The reference rows of hand-made answers whose oracle, best and cheapest
// model are known.
func TestReferenceRowsByHand(t *testing.T) {
	type ans struct {
		em, f1, cost float64
	}
	// qs: q1, q2 (nq), q3, q4 (triviaqa).
	ds := []string{"nq", "nq", "triviaqa", "triviaqa"}
	results := func(as ...ans) []rollout.QuestionResult {
		out := make([]rollout.QuestionResult, len(as))
		for i, a := range as {
			out[i] = rollout.QuestionResult{ID: string(rune('1' + i)), Dataset: ds[i], EM: a.em, F1: a.f1, Cost: a.cost, WellFormed: true,
				Calls: make([]router.Call, 1)}
		}
		return out
	}
	type want struct {
		model           string
		em, f1          map[string]float64 // per dataset
		avgEM, avgF1    float64
		cost            float64 // total
		costPerQuestion float64
	}
	tests := []struct {
		name                   string
		models                 []llmpool.ModelInfo
		per                    [][]rollout.QuestionResult
		oracle, best, cheapest want
	}{{
		name:   "three models",
		models: []llmpool.ModelInfo{{Name: "a", PriceIn: 1, PriceOut: 1}, {Name: "b", PriceIn: 10, PriceOut: 10}, {Name: "c", PriceIn: 0.1, PriceOut: 0.1}},
		per: [][]rollout.QuestionResult{
			results(ans{1, 1, 0.02}, ans{0, 0.5, 0.02}, ans{0, 0, 0.02}, ans{1, 1, 0.02}),
			results(ans{1, 1, 0.2}, ans{1, 1, 0.2}, ans{0, 0.4, 0.2}, ans{1, 1, 0.2}),
			results(ans{0, 0, 0.001}, ans{0, 0.2, 0.001}, ans{0, 0.3, 0.002}, ans{1, 1, 0.001}),
		},
		// q1: a and b right, a cheaper; q2: b alone right; q3: none right,
		// c the cheapest (F1 0.3, not b's 0.4); q4: all right, c cheapest.
		oracle: want{em: map[string]float64{"nq": 1, "triviaqa": 0.5}, f1: map[string]float64{"nq": 1, "triviaqa": 0.65},
			avgEM: 0.75, avgF1: 0.825, cost: 0.223, costPerQuestion: 0.223 / 4},
		// Avg EM: a 0.5, b 0.75, c 0.25.
		best: want{model: "b", em: map[string]float64{"nq": 1, "triviaqa": 0.5}, f1: map[string]float64{"nq": 1, "triviaqa": 0.7},
			avgEM: 0.75, avgF1: 0.85, cost: 0.8, costPerQuestion: 0.2},
		// Cost per question: a 0.02, b 0.2, c 0.00125.
		cheapest: want{model: "c", em: map[string]float64{"nq": 0, "triviaqa": 0.5}, f1: map[string]float64{"nq": 0.1, "triviaqa": 0.65},
			avgEM: 0.25, avgF1: 0.375, cost: 0.005, costPerQuestion: 0.00125},
	}, {
		name:   "ties",
		models: []llmpool.ModelInfo{{Name: "x", PriceIn: 1, PriceOut: 1}, {Name: "y", PriceIn: 0.5, PriceOut: 0.5}},
		per: [][]rollout.QuestionResult{
			results(ans{1, 1, 0.01}, ans{0, 0, 0.01}, ans{0, 0, 0.01}, ans{0, 0.5, 0.01}),
			results(ans{1, 1, 0.01}, ans{0, 0, 0.01}, ans{0, 0, 0.01}, ans{0, 0.5, 0.01}),
		},
		// Equal answers and costs: the oracle keeps the first model, the
		// best is the first in pool order, the cheapest the lower price.
		oracle: want{em: map[string]float64{"nq": 0.5, "triviaqa": 0}, f1: map[string]float64{"nq": 0.5, "triviaqa": 0.25},
			avgEM: 0.25, avgF1: 0.375, cost: 0.04, costPerQuestion: 0.01},
		best: want{model: "x", em: map[string]float64{"nq": 0.5, "triviaqa": 0}, f1: map[string]float64{"nq": 0.5, "triviaqa": 0.25},
			avgEM: 0.25, avgF1: 0.375, cost: 0.04, costPerQuestion: 0.01},
		cheapest: want{model: "y", em: map[string]float64{"nq": 0.5, "triviaqa": 0}, f1: map[string]float64{"nq": 0.5, "triviaqa": 0.25},
			avgEM: 0.25, avgF1: 0.375, cost: 0.04, costPerQuestion: 0.01},
	}}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-12 }
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rows, err := referenceRows(tt.models, tt.per, []string{"nq", "triviaqa"})
			if err != nil {
				t.Fatal(err)
			}
			if len(rows) != 3 {
				t.Fatalf("%d rows, want 3", len(rows))
			}
			for i, c := range []struct {
				kind string
				want want
			}{{RefOracle, tt.oracle}, {RefBest, tt.best}, {RefCheapest, tt.cheapest}} {
				r, w := rows[i], c.want
				if r.Reference != c.kind || r.Model != w.model || r.Router != "" {
					t.Errorf("row %d is %q of model %q (router %q), want %q of model %q and no router", i, r.Reference, r.Model, r.Router, c.kind, w.model)
				}
				for d := range w.em {
					if sc := r.Datasets[d]; !near(sc.EM, w.em[d]) || !near(sc.F1, w.f1[d]) || sc.N != 2 {
						t.Errorf("%s on %s: EM %v F1 %v n %d, want EM %v F1 %v n 2", c.kind, d, sc.EM, sc.F1, sc.N, w.em[d], w.f1[d])
					}
				}
				if !near(r.Avg.EM, w.avgEM) || !near(r.Avg.F1, w.avgF1) || !near(r.Avg.Cost, w.cost) || !near(r.CostPerQuestion, w.costPerQuestion) || r.Avg.N != 4 {
					t.Errorf("%s: avg EM %v F1 %v cost %v cost/q %v n %d; want %v %v %v %v 4", c.kind, r.Avg.EM, r.Avg.F1, r.Avg.Cost, r.CostPerQuestion, r.Avg.N,
						w.avgEM, w.avgF1, w.cost, w.costPerQuestion)
				}
				if !near(r.Avg.Calls, 1) {
					t.Errorf("%s: %v calls per question, want 1", c.kind, r.Avg.Calls)
				}
			}
		})
	}
	if _, err := referenceRows([]llmpool.ModelInfo{{Name: "a"}, {Name: "b"}}, [][]rollout.QuestionResult{results(ans{}), results(ans{}, ans{})}, []string{"nq"}); err == nil {
		t.Error("answer sets of different lengths gave no error")
	}
}
