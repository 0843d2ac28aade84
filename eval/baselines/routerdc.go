package baselines

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// dcModel is "routerdc", RouterDC (Chen et al., 2024, "RouterDC: Query-Based
// Router by Dual Contrastive Learning for Assembling Large Language Models",
// §3; shuhao02/RouterDC train_router_mdeberta.py). A query encoder E maps
// the question to a vector, each model m has a learned embedding k_m, and
//
//	sim(q, m) = cos(E(x_q), k_m) / τ.
//
// Training minimises L_sample-LLM + λ·L_sample-sample:
//
//   - sample-LLM: for each of the top_k models of highest F1 on the
//     question (skipped when that F1 is 0), −log of the softmax of its
//     similarity against the last_k models of lowest F1 (those scoring above
//     0.5 removed, as the code masks them), averaged over the batch;
//   - sample-sample: the training questions are clustered by k-means on
//     their embeddings (routerdc.clusters, k-means++ seeding, Lloyd's
//     iterations), and each question of a batch is contrasted, by the
//     softmax of cosine similarities of encoded questions, between one
//     question of its own cluster in the batch (possibly itself, as the code
//     draws) and sample_negatives of other clusters (questions without
//     enough negatives are skipped).
//
// The router picks argmax_m softmax(sim(q, ·))_m − λ·c_m. Departures: the
// encoder is a two-layer ReLU network on the configured embedding
// (routerdc.hidden, routerdc.dim) instead of a fine-tuned mDeBERTa; model
// embeddings start uniform in [−1, 1] (N(0, 0.78) in the code); with a pool
// of three models the defaults are top_k 1 and last_k 2 (the paper's 3 and 3
// need seven); τ = 0.2 (the code's default 1 leaves cosines in [−1, 1]
// nearly flat under a softmax with so few models); epochs instead of steps
// and no checkpoint selection on test data.
type dcModel struct {
	w1, b1, w2, b2, k *param
	temperature       float64
	cost              []float64
	lambda            float64
}

func newDC(dim, hidden, out, models int, temperature float64, rng *rand.Rand) *dcModel {
	return &dcModel{
		w1: newParam("encoder.w1", dim, hidden, glorot(dim, hidden), rng), b1: newParam("encoder.b1", 1, hidden, 0, rng),
		w2: newParam("encoder.w2", hidden, out, glorot(hidden, out), rng), b2: newParam("encoder.b2", 1, out, 0, rng),
		k:           newParam("model_embeddings", models, out, 1, rng),
		temperature: temperature,
	}
}

func (m *dcModel) weights() []*param { return []*param{m.w1, m.b1, m.w2, m.b2, m.k} }

// encode returns the l2-normalised encoded questions.
func (m *dcModel) encode(t *tape, x *node) *node {
	h := t.relu(t.addRow(t.matmul(x, t.param(m.w1)), t.param(m.b1)))
	return t.normRows(t.addRow(t.matmul(h, t.param(m.w2)), t.param(m.b2)))
}

// similarity is the n×models matrix of cos(E(x), k_m)/τ.
func (m *dcModel) similarity(t *tape, e *node) *node {
	return t.scale(t.matmulT(e, t.normRows(t.param(m.k))), 1/m.temperature)
}

func (m *dcModel) scores(_ context.Context, in scoreInput) ([][]float64, error) {
	t := &tape{infer: true}
	s := m.similarity(t, m.encode(t, t.input(in.n, in.dim, in.x)))
	for i := 0; i < s.r; i++ { // softmax over models
		row := s.v[i*s.c : (i+1)*s.c]
		top := slices.Max(row)
		var z float64
		for j := range row {
			row[j] = math.Exp(row[j] - top)
			z += row[j]
		}
		for j := range row {
			row[j] /= z
		}
	}
	return penalised(s, m.cost, m.lambda), nil
}

// sampleLLMTerms builds the sample-LLM loss terms of a batch (rows) from
// their F1 rows.
func sampleLLMTerms(f1 [][]float64, topK, lastK int) []choice {
	var terms []choice
	for r, row := range f1 {
		order := make([]int, len(row))
		for j := range order {
			order[j] = j
		}
		slices.SortStableFunc(order, func(a, b int) int { // highest first, pool order on ties
			switch {
			case row[a] > row[b]:
				return -1
			case row[a] < row[b]:
				return 1
			}
			return 0
		})
		lowest := slices.Clone(order)
		slices.Reverse(lowest)
		lowest = lowest[:min(lastK, len(lowest))]
		for _, pos := range order[:min(topK, len(order))] {
			if row[pos] <= 0 {
				continue // the code masks a positive that does not do well
			}
			cols := []int{pos}
			for _, neg := range lowest {
				if neg != pos && row[neg] <= 0.5 {
					cols = append(cols, neg)
				}
			}
			if len(cols) > 1 {
				terms = append(terms, choice{row: r, cols: cols})
			}
		}
	}
	return terms
}

// sampleSampleTerms builds the sample-sample loss terms of a batch whose
// rows have the given clusters.
func sampleSampleTerms(clusters []int, negatives int, rng *rand.Rand) []choice {
	var terms []choice
	for r, c := range clusters {
		var same, other []int
		for j, d := range clusters {
			if d == c {
				same = append(same, j)
			} else {
				other = append(other, j)
			}
		}
		if len(other) < negatives {
			continue
		}
		cols := []int{same[rng.IntN(len(same))]}
		for _, k := range rng.Perm(len(other))[:negatives] {
			cols = append(cols, other[k])
		}
		terms = append(terms, choice{row: r, cols: cols})
	}
	return terms
}

func fitDC(ctx context.Context, d *fitData, c Config, rng *rand.Rand) (model, error) {
	h := c.RouterDC
	m := newDC(d.dim, h.Hidden, h.Dim, len(d.models), h.Temperature, rng)
	m.cost, m.lambda = costs(d.models), h.CostLambda
	var clusters []int // of every question: k-means reads no outcome
	if h.SampleWeight > 0 {
		clusters = kmeans(d.x, len(d.m.Questions), d.dim, min(h.Clusters, len(d.m.Questions)), 20, rng)
	}
	opt := newAdamW(h.LR, h.WeightDecay, m.weights())
	err := epochs(ctx, d, m, opt, h.Epochs, h.BatchSize, "baselines.routerdc.lr",
		func() []int { return permOf(d.train, rng) },
		func(t *tape, idx []int) *node {
			f1 := make([][]float64, len(idx))
			for r, q := range idx {
				f1[r] = d.m.F1[q]
			}
			e := m.encode(t, t.input(len(idx), d.dim, batchRows(d.x, d.dim, idx)))
			loss := t.choiceCE(m.similarity(t, e), sampleLLMTerms(f1, h.TopK, h.LastK), float64(len(idx)))
			if h.SampleWeight > 0 {
				cl := make([]int, len(idx))
				for r, q := range idx {
					cl[r] = clusters[q]
				}
				if terms := sampleSampleTerms(cl, h.SampleNegatives, rng); len(terms) > 0 {
					ss := t.choiceCE(t.matmulT(e, e), terms, float64(len(terms)))
					loss = t.sum2(loss, ss, h.SampleWeight)
				}
			}
			return loss
		})
	if err != nil {
		return nil, err
	}
	return m, nil
}

func buildDC(man *Manifest) (model, error) {
	var h RouterDCConfig
	if err := decodeHyper(man, &h); err != nil {
		return nil, err
	}
	if h.Hidden < 1 || h.Dim < 1 || !(h.Temperature > 0) {
		return nil, fmt.Errorf("hidden %d, dim %d, temperature %v", h.Hidden, h.Dim, h.Temperature)
	}
	m := newDC(man.Dim, h.Hidden, h.Dim, len(man.Models), h.Temperature, nil)
	m.cost, m.lambda = costs(man.Models), h.CostLambda
	return m, nil
}

// kmeans clusters the n rows of x (n×dim) into k clusters: k-means++ seeding
// (Arthur & Vassilvitskii, 2007) then iters rounds of Lloyd's algorithm, in
// squared Euclidean distance. It returns each row's cluster.
func kmeans(x []float64, n, dim, k, iters int, rng *rand.Rand) []int {
	row := func(i int) []float64 { return x[i*dim : (i+1)*dim] }
	dist := func(a, b []float64) float64 {
		var s float64
		for j := range a {
			d := a[j] - b[j]
			s += d * d
		}
		return s
	}
	centers := [][]float64{slices.Clone(row(rng.IntN(n)))}
	near := make([]float64, n)
	for i := range near {
		near[i] = dist(row(i), centers[0])
	}
	for len(centers) < k {
		var total float64
		for _, d := range near {
			total += d
		}
		pick := rng.IntN(n)
		if total > 0 {
			u := rng.Float64() * total
			for i, d := range near {
				if u -= d; u <= 0 {
					pick = i
					break
				}
			}
		}
		c := slices.Clone(row(pick))
		centers = append(centers, c)
		for i := range near {
			near[i] = min(near[i], dist(row(i), c))
		}
	}
	assign := make([]int, n)
	for it := 0; it < iters; it++ {
		changed := false
		for i := 0; i < n; i++ {
			best, bd := 0, math.Inf(1)
			for c, ctr := range centers {
				if d := dist(row(i), ctr); d < bd {
					best, bd = c, d
				}
			}
			if assign[i] != best || it == 0 {
				changed = changed || assign[i] != best
				assign[i] = best
			}
		}
		if !changed && it > 0 {
			break
		}
		counts := make([]int, k)
		for c := range centers {
			clear(centers[c])
		}
		for i, c := range assign {
			counts[c]++
			for j, v := range row(i) {
				centers[c][j] += v
			}
		}
		for c := range centers {
			if counts[c] == 0 { // an empty cluster keeps a random point
				copy(centers[c], row(rng.IntN(n)))
				continue
			}
			for j := range centers[c] {
				centers[c][j] /= float64(counts[c])
			}
		}
	}
	return assign
}
