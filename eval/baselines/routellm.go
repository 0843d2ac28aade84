package baselines

import (
	"context"
	"fmt"
	"math/rand/v2"
)

// mfModel is "routellm-mf", RouteLLM's matrix-factorisation router (Ong et
// al., 2025, "RouteLLM: Learning to Route LLMs with Preference Data", §4.2;
// lm-sys/RouteLLM routers/matrix_factorization): the score of model m on
// question q is the bilinear form
//
//	s(q, m) = wᵀ (v̂_m ⊙ W x_q)
//
// with x_q the question embedding, W a learned projection (no bias), v̂_m
// the l2-normalised learned embedding of model m and w a learned vector (no
// bias). RouteLLM trains it on pairs of two models with the logistic
// (Bradley–Terry) loss −log σ(s(q, winner) − s(q, loser)); since s is linear
// in v̂, this generalises to the pool unchanged: every pair of models whose
// F1 differ on a training question is a preference (ties, RouteLLM's
// filtered "tie" labels, give none), and the router picks argmax_m s(q, m)
// − λ·c_m (cost_lambda in logit units) instead of thresholding the win
// probability of the strong model. Departures: RouteLLM adds Gaussian noise
// (α = 0.1) to the 1536-d embedding; here routellm_mf.noise is added to the
// projected question W x_q, which keeps the sparse local embedding's product
// sparse; steps take routellm_mf.batch_size questions with all their pairs
// instead of pairs drawn alone; AdamW instead of Adam with L2.
type mfModel struct {
	p, proj, w *param
	cost       []float64
	lambda     float64
}

func newMF(dim, k, models int, rng *rand.Rand) *mfModel {
	return &mfModel{
		p:    newParam("model_embeddings", models, k, 1, rng),
		proj: newParam("text_proj", dim, k, glorot(dim, k), rng),
		w:    newParam("classifier", 1, k, glorot(k, 1), rng),
	}
}

func (m *mfModel) weights() []*param { return []*param{m.p, m.proj, m.w} }

// forward returns the n×models score matrix; noise, when not nil, is added
// to the projected questions.
func (m *mfModel) forward(t *tape, x *node, noise []float64) *node {
	z := t.matmul(x, t.param(m.proj))
	if noise != nil {
		z = t.add2(z, t.input(z.r, z.c, noise))
	}
	return t.matmulT(t.mulRow(z, t.param(m.w)), t.normRows(t.param(m.p)))
}

func (m *mfModel) scores(_ context.Context, in scoreInput) ([][]float64, error) {
	t := &tape{infer: true}
	return penalised(m.forward(t, t.input(in.n, in.dim, in.x), nil), m.cost, m.lambda), nil
}

// preferences lists, per question, the (winner, loser) pairs of models
// whose F1 differ.
func preferences(f1 [][]float64) [][][2]int {
	out := make([][][2]int, len(f1))
	for i, row := range f1 {
		for a := range row {
			for b := range row {
				if row[a] > row[b] {
					out[i] = append(out[i], [2]int{a, b})
				}
			}
		}
	}
	return out
}

func fitMF(ctx context.Context, d *fitData, c Config, rng *rand.Rand) (model, error) {
	h := c.RouteLLMMF
	m := newMF(d.dim, h.Dim, len(d.models), rng)
	m.cost, m.lambda = costs(d.models), h.CostLambda
	prefs := preferences(d.m.F1)
	var qs []int // training questions with at least one preference
	for _, i := range d.train {
		if len(prefs[i]) > 0 {
			qs = append(qs, i)
		}
	}
	if len(qs) == 0 {
		return nil, fmt.Errorf("no question separates two models (every F1 ties)")
	}
	opt := newAdamW(h.LR, h.WeightDecay, m.weights())
	err := epochs(ctx, d, m, opt, h.Epochs, h.BatchSize, "baselines.routellm_mf.lr",
		func() []int {
			rng.Shuffle(len(qs), func(i, j int) { qs[i], qs[j] = qs[j], qs[i] })
			return qs
		},
		func(t *tape, idx []int) *node {
			var pairs []pair
			for r, q := range idx {
				for _, p := range prefs[q] {
					pairs = append(pairs, pair{row: r, win: p[0], lose: p[1]})
				}
			}
			var noise []float64
			if h.Noise > 0 {
				noise = make([]float64, len(idx)*h.Dim)
				for i := range noise {
					noise[i] = h.Noise * rng.NormFloat64()
				}
			}
			return t.pairBCE(m.forward(t, t.input(len(idx), d.dim, batchRows(d.x, d.dim, idx)), noise), pairs)
		})
	if err != nil {
		return nil, err
	}
	return m, nil
}

func buildMF(man *Manifest) (model, error) {
	var h MFConfig
	if err := decodeHyper(man, &h); err != nil {
		return nil, err
	}
	if h.Dim < 1 {
		return nil, fmt.Errorf("dim %d", h.Dim)
	}
	m := newMF(man.Dim, h.Dim, len(man.Models), nil)
	m.cost, m.lambda = costs(man.Models), h.CostLambda
	return m, nil
}
