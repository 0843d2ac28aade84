package baselines

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
)

// pickModel routes every question to the model its one weight names: a
// router whose picks the test sets, check by check.
type pickModel struct{ p *param }

func (m *pickModel) weights() []*param { return []*param{m.p} }

func (m *pickModel) scores(_ context.Context, in scoreInput) ([][]float64, error) {
	out := make([][]float64, in.n)
	for i := range out {
		out[i] = make([]float64, 2)
		out[i][int(m.p.w[0])] = 1
	}
	return out, nil
}

// Model selection keeps the weights whose held-out picks have the best
// F1 − cost_lambda · relative cost, the trade-off the router routes for:
// with cost_lambda = 0 the best F1 (the big model: F1 1, relative cost 1);
// with a cost_lambda that makes the small model (F1 0.8, relative cost
// 0.1) the better trade, the small one, whichever check came first.
func TestSelectionWeighsCost(t *testing.T) {
	const big, small = 0, 1
	m := &Matrix{Models: []string{"big", "small"}}
	for i := range 10 {
		m.Questions = append(m.Questions, Question{ID: string(rune('a' + i)), Dataset: "nq", Text: "q"})
		m.F1 = append(m.F1, []float64{1, 0.8})
		m.EM = append(m.EM, []float64{1, 0.8})
		m.Cost = append(m.Cost, []float64{4e-6, 0.4e-6})
		m.Failed = append(m.Failed, make([]bool, 2))
	}
	m.seal()
	models := routedModels(m)
	cases := []struct {
		name   string
		lambda float64
		order  []int // the model each check's weights pick
		want   int   // the model the kept weights pick
	}{
		{"quality alone, big first", 0, []int{big, small}, big},
		{"quality alone, small first", 0, []int{small, big}, big},
		{"a small penalty keeps the big model", 0.1, []int{small, big}, big},
		{"a cost-aware router keeps the cheap model, big first", 0.5, []int{big, small}, small},
		{"a cost-aware router keeps the cheap model, small first", 0.5, []int{small, big}, small},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := &fitData{m: m, x: make([]float64, len(m.Questions)), dim: 1, models: models}
			d.train, d.val = split(len(m.Questions), 0.5, rand.New(rand.NewPCG(1, 2)))
			d.val.weigh(c.lambda, costs(models))
			mdl := &pickModel{p: &param{name: "pick", r: 1, c: 1, w: []float64{0}}}
			for _, pick := range c.order {
				mdl.p.w[0] = float64(pick)
				if err := d.val.check(context.Background(), d, mdl); err != nil {
					t.Fatal(err)
				}
			}
			d.val.restore(mdl)
			if got := int(mdl.p.w[0]); got != c.want {
				t.Fatalf("cost_lambda %g: kept the weights picking %s, want %s (F1 − cost_lambda·cost: big %.2f, small %.2f)",
					c.lambda, m.Models[got], m.Models[c.want], 1-c.lambda*models[big].Cost, 0.8-c.lambda*models[small].Cost)
			}
			ref := d.val.ref
			wantF1, wantCost := m.F1[0][c.want], models[c.want].Cost
			if math.Abs(ref.F1-wantF1) > 1e-12 || math.Abs(ref.Cost-wantCost) > 1e-12 || math.Abs(ref.Utility-(wantF1-c.lambda*wantCost)) > 1e-12 {
				t.Errorf("validation record %+v, want F1 %g, cost %g, utility %g: the manifest must say what was selected and why",
					ref, wantF1, wantCost, wantF1-c.lambda*wantCost)
			}
		})
	}
}
