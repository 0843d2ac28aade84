package baselines

import (
	"context"
	"errors"
	"fmt"

	"github.com/recal-project/recal/eval/embed"
)

var (
	// ErrNotFitted: no fitted router where one was expected.
	ErrNotFitted = errors.New("baselines: router not fitted")
	// ErrCorrupt: a router folder that cannot be read back as written
	// (missing or unreadable files, digests that do not match, tensors of
	// the wrong shape).
	ErrCorrupt = errors.New("baselines: corrupt router folder")
	// ErrEmbedding: the configured embeddings are not those the router was
	// fitted on.
	ErrEmbedding = errors.New("baselines: embeddings differ from the router's")
)

// Query is a question to route.
type Query struct {
	Text    string
	Dataset string // the question's dataset (GraphRouter's task node)
}

// RoutedModel is a pool model a router chooses among.
type RoutedModel struct {
	Name string `json:"name"`
	// MeanCost is the model's mean cost per question on the matrix (USD).
	MeanCost float64 `json:"mean_cost"`
	// Cost is MeanCost over the highest model's: the unit of cost_lambda.
	Cost float64 `json:"cost"`
	// Description is the pool's description of the model.
	Description string `json:"description"`
}

// Router is a fitted baseline router: it embeds a question, scores each
// pool model and picks the best.
type Router struct {
	man Manifest
	emb embed.Embedder
	mdl model
}

// Name is the router's registered name.
func (r *Router) Name() string { return r.man.Router }

// Models lists the models the router chooses among, in pool order.
func (r *Router) Models() []string {
	out := make([]string, len(r.man.Models))
	for i, m := range r.man.Models {
		out[i] = m.Name
	}
	return out
}

// Manifest returns the router's manifest.
func (r *Router) Manifest() Manifest { return r.man }

// Scores returns, per query, each model's utility (see model.scores).
func (r *Router) Scores(ctx context.Context, qs []Query) ([][]float64, error) {
	if len(qs) == 0 {
		return nil, nil
	}
	texts := make([]string, len(qs))
	in := scoreInput{n: len(qs), dim: r.man.Dim, datasets: make([]string, len(qs)), embed: r.embedFlat}
	for i, q := range qs {
		texts[i], in.datasets[i] = q.Text, q.Dataset
	}
	x, err := r.embedFlat(ctx, texts)
	if err != nil {
		return nil, err
	}
	in.x = x
	return r.mdl.scores(ctx, in)
}

// Route returns the chosen model per query: the highest utility, the first
// in pool order on a tie.
func (r *Router) Route(ctx context.Context, qs []Query) ([]string, error) {
	sc, err := r.Scores(ctx, qs)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(qs))
	for i, s := range sc {
		best := 0
		for j := range s {
			if s[j] > s[best] {
				best = j
			}
		}
		out[i] = r.man.Models[best].Name
	}
	return out, nil
}

// embedFlat embeds texts into one row-major float64 matrix of width Dim.
func (r *Router) embedFlat(ctx context.Context, texts []string) ([]float64, error) {
	return embedFlat(ctx, r.emb, texts, r.man.Dim)
}

func embedFlat(ctx context.Context, e embed.Embedder, texts []string, dim int) ([]float64, error) {
	vs, err := e.Embed(ctx, texts)
	if err != nil {
		return nil, err
	}
	out := make([]float64, 0, len(texts)*dim)
	for i, v := range vs {
		if dim > 0 && len(v) != dim {
			return nil, fmt.Errorf("%w: text %d has a %d-dimensional vector, the router's are %d-dimensional", ErrEmbedding, i, len(v), dim)
		}
		for _, x := range v {
			out = append(out, float64(x))
		}
	}
	return out, nil
}
