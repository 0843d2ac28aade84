package baselines

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"

	"github.com/recal-project/recal/eval/embed"
)

// fitData is what a variant is fitted on.
type fitData struct {
	m      *Matrix
	x      []float64 // question embeddings, len(m.Questions)×dim
	dim    int
	models []RoutedModel
	embed  func(ctx context.Context, texts []string) ([]float64, error)
	// train are the questions trained on; val selects the weights (select.go).
	train []int
	val   *validation
}

// Fit trains router name on the outcome matrix m with questions embedded by
// emb (fitted on the matrix's questions first when it keeps statistics, as
// the local IDF) and the router's table of cfg, deterministically for a
// seed: fitting twice gives the same weights, and Save the same bytes. The
// weights are rounded to float32, as saved, so the returned router routes
// as a loaded one.
func Fit(ctx context.Context, name string, cfg Config, m *Matrix, emb embed.Embedder, seed int64) (*Router, error) {
	sp, err := lookup(name)
	if err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if m == nil || len(m.Questions) == 0 || len(m.Models) < 2 {
		return nil, fmt.Errorf("baselines: fit %s: the matrix needs questions and at least two models", name)
	}
	texts := make([]string, len(m.Questions))
	for i, q := range m.Questions {
		texts[i] = q.Text
	}
	if emb, err = embed.Fit(emb, texts); err != nil {
		return nil, fmt.Errorf("baselines: fit %s: %w", name, err)
	}
	vs, err := emb.Embed(ctx, texts)
	if err != nil {
		return nil, fmt.Errorf("baselines: fit %s: embed the questions: %w", name, err)
	}
	dim := len(vs[0])
	x, err := embedFlat(ctx, emb, texts, dim) // served by the embedder's memory cache
	if err != nil {
		return nil, err
	}
	d := &fitData{m: m, x: x, dim: dim, models: routedModels(m),
		embed: func(ctx context.Context, t []string) ([]float64, error) { return embedFlat(ctx, emb, t, dim) }}
	h := fnv.New64a()
	h.Write([]byte(name))
	rng := rand.New(rand.NewPCG(uint64(seed), h.Sum64()))
	d.train, d.val = split(len(m.Questions), cfg.ValShare, rng)
	d.val.weigh(sp.lambda(cfg), costs(d.models))
	mdl, err := sp.fit(ctx, d, cfg, rng)
	if err != nil {
		return nil, fmt.Errorf("baselines: fit %s: %w", name, err)
	}
	d.val.restore(mdl)
	for _, p := range mdl.weights() {
		for i, w := range p.w {
			p.w[i] = float64(float32(w))
		}
	}
	hyper, err := json.Marshal(sp.hyper(cfg))
	if err != nil {
		return nil, fmt.Errorf("baselines: fit %s: %w", name, err)
	}
	ref := MatrixRef{Digest: m.Digest, Pool: m.Pool.ID, Questions: len(m.Questions), Datasets: map[string]int{}}
	for _, q := range m.Questions {
		ref.Datasets[q.Dataset]++
	}
	man := Manifest{Router: name, Format: formatVersion, Embedding: emb.Info(), Dim: dim, Models: d.models,
		Hyper: hyper, Seed: seed, Matrix: ref, ValShare: cfg.ValShare, Validation: d.val.ref}
	return &Router{man: man, emb: emb, mdl: mdl}, nil
}

// routedModels are the matrix's models with their mean and relative costs.
func routedModels(m *Matrix) []RoutedModel {
	out := make([]RoutedModel, len(m.Models))
	top := 0.0
	for j, name := range m.Models {
		var s float64
		for i := range m.Questions {
			s += m.Cost[i][j]
		}
		out[j] = RoutedModel{Name: name, MeanCost: s / float64(len(m.Questions))}
		if j < len(m.Pool.Models) {
			out[j].Description = m.Pool.Models[j].Description
		}
		top = max(top, out[j].MeanCost)
	}
	for j := range out {
		if top > 0 {
			out[j].Cost = out[j].MeanCost / top
		}
	}
	return out
}

// costs returns the models' relative costs.
func costs(ms []RoutedModel) []float64 {
	out := make([]float64, len(ms))
	for i, m := range ms {
		out[i] = m.Cost
	}
	return out
}

// batchRows copies rows idx of the n×dim matrix x.
func batchRows(x []float64, dim int, idx []int) []float64 {
	out := make([]float64, len(idx)*dim)
	for i, k := range idx {
		copy(out[i*dim:(i+1)*dim], x[k*dim:(k+1)*dim])
	}
	return out
}

// checkCtx returns ctx's error every 16 steps (fits check between steps).
func checkCtx(ctx context.Context, step int) error {
	if step%16 == 0 {
		return ctx.Err()
	}
	return nil
}

// permOf returns the indices idx in a random order.
func permOf(idx []int, rng *rand.Rand) []int {
	out := make([]int, len(idx))
	for i, k := range rng.Perm(len(idx)) {
		out[i] = idx[k]
	}
	return out
}

// epochs is the fitted routers' training loop: per epoch, order gives the
// questions to train on in their epoch's order; per batch of at most batch
// of them, loss builds the batch's loss on a fresh tape, and a backward
// pass and an AdamW step follow; after each epoch the held-out questions
// are routed (validation.check). A non-finite loss is an error that names
// the learning-rate key lr.
func epochs(ctx context.Context, d *fitData, m model, opt *adamW, n, batch int, lr string,
	order func() []int, loss func(t *tape, idx []int) *node) error {
	step := 0
	for epoch := 0; epoch < n; epoch++ {
		qs := order()
		for lo := 0; lo < len(qs); lo += batch {
			if err := checkCtx(ctx, step); err != nil {
				return err
			}
			idx := qs[lo:min(lo+batch, len(qs))]
			t := &tape{}
			l := loss(t, idx)
			if !finite(l.v[0]) {
				return fmt.Errorf("loss %v at epoch %d; lower %s", l.v[0], epoch, lr)
			}
			t.backward(l)
			opt.update()
			step++
		}
		if err := d.val.check(ctx, d, m); err != nil {
			return err
		}
	}
	return nil
}
