package baselines

import (
	"context"
	"fmt"
	"math/rand/v2"
)

// mlpModel is "mlp", RouterBench's MLP router (Hu et al., 2024, "RouterBench:
// A Benchmark for Multi-LLM Routing System", §4 predictive routers): a
// network on the question embedding predicts each model's score, and the
// router picks argmax_m ŝ_m − λ·c_m, c_m the model's relative mean cost
// (Config). Choices here: one hidden ReLU layer of mlp.hidden units (the
// size of scikit-learn's MLPRegressor default, 100, rounded up), one linear
// output per pool model regressing the answer F1 in the outcome matrix with
// the mean squared error (failed calls count as F1 0), AdamW, mini-batches
// of mlp.batch_size questions reshuffled every epoch, Glorot-uniform
// initialisation. RouterBench embeds with a sentence encoder; here the
// question embedding is the configured [embedding] provider's.
type mlpModel struct {
	w1, b1, w2, b2 *param
	cost           []float64
	lambda         float64
}

func newMLP(dim, hidden, models int, rng *rand.Rand) *mlpModel {
	return &mlpModel{
		w1: newParam("w1", dim, hidden, glorot(dim, hidden), rng), b1: newParam("b1", 1, hidden, 0, rng),
		w2: newParam("w2", hidden, models, glorot(hidden, models), rng), b2: newParam("b2", 1, models, 0, rng),
	}
}

func (m *mlpModel) weights() []*param { return []*param{m.w1, m.b1, m.w2, m.b2} }

func (m *mlpModel) forward(t *tape, x *node) *node {
	h := t.relu(t.addRow(t.matmul(x, t.param(m.w1)), t.param(m.b1)))
	return t.addRow(t.matmul(h, t.param(m.w2)), t.param(m.b2))
}

func (m *mlpModel) scores(_ context.Context, in scoreInput) ([][]float64, error) {
	t := &tape{infer: true}
	out := m.forward(t, t.input(in.n, in.dim, in.x))
	return penalised(out, m.cost, m.lambda), nil
}

// penalised turns an n×models score node into rows of score − λ·cost.
func penalised(s *node, cost []float64, lambda float64) [][]float64 {
	out := make([][]float64, s.r)
	for i := range out {
		out[i] = make([]float64, s.c)
		for j := range out[i] {
			out[i][j] = s.v[i*s.c+j] - lambda*cost[j]
		}
	}
	return out
}

func fitMLP(ctx context.Context, d *fitData, c Config, rng *rand.Rand) (model, error) {
	h := c.MLP
	nm := len(d.models)
	m := newMLP(d.dim, h.Hidden, nm, rng)
	m.cost, m.lambda = costs(d.models), h.CostLambda
	opt := newAdamW(h.LR, h.WeightDecay, m.weights())
	ones := make([]float64, h.BatchSize*nm)
	for i := range ones {
		ones[i] = 1
	}
	err := epochs(ctx, d, m, opt, h.Epochs, h.BatchSize, "baselines.mlp.lr",
		func() []int { return permOf(d.train, rng) },
		func(t *tape, idx []int) *node {
			y := make([]float64, 0, len(idx)*nm)
			for _, q := range idx {
				y = append(y, d.m.F1[q]...)
			}
			return t.mse(m.forward(t, t.input(len(idx), d.dim, batchRows(d.x, d.dim, idx))), y, ones[:len(y)])
		})
	if err != nil {
		return nil, err
	}
	return m, nil
}

func buildMLP(man *Manifest) (model, error) {
	var h MLPConfig
	if err := decodeHyper(man, &h); err != nil {
		return nil, err
	}
	if h.Hidden < 1 {
		return nil, fmt.Errorf("hidden %d", h.Hidden)
	}
	m := newMLP(man.Dim, h.Hidden, len(man.Models), nil)
	m.cost, m.lambda = costs(man.Models), h.CostLambda
	return m, nil
}
