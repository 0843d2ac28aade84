package eval

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/eval/baselines"
	"github.com/recal-project/recal/eval/embed"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/router"
)

// The fitted baseline routers (package baselines: mlp, routellm-mf,
// routerdc, graphrouter) are loaded from Setup.RouterDir/<name>, written by
// `recal fit`; each embeds the question, picks a pool model and that model
// answers the question directly, as the other direct routers. Their results
// are keyed by the pool and by the digest of their folder ("fitted/<name>"),
// so refitting starts them afresh.

// fittedSpec is the registry entry of fitted router name.
func fittedSpec(name string) Spec {
	return Spec{New: func(s Setup) (Router, error) { return newFitted(name, s) }, Inputs: []string{"pool", "fitted/" + name}}
}

func init() {
	for _, name := range baselines.Names() {
		inputParts["fitted/"+name] = func(s Setup) (any, error) { // the digest of the router's folder
			if s.RouterDir == "" {
				return nil, fitHint(name, s, "")
			}
			d, err := baselines.Digest(filepath.Join(s.RouterDir, name))
			if errors.Is(err, baselines.ErrNotFitted) {
				return nil, fitHint(name, s, filepath.Join(s.RouterDir, name))
			}
			if s.CostLambda != nil { // routed at another cost_lambda than fitted
				return struct {
					Digest     string
					CostLambda float64
				}{d, *s.CostLambda}, err
			}
			return d, err
		}
	}
}

// fitHint is the error of a fitted router requested without its folder: it
// names the commands that make one.
func fitHint(name string, s Setup, dir string) error {
	where := "--router-dir is not set"
	routerDir := "DIR"
	if dir != "" {
		where, routerDir = "no fitted router in "+dir, s.RouterDir
	}
	return fmt.Errorf("eval: router %s: %s; fit one with `recal collect --config CONFIG --out OUTCOMES` then "+
		"`recal fit --config CONFIG --outcomes OUTCOMES --router-dir %s --routers %s`, and pass --router-dir %s",
		name, where, routerDir, name, routerDir)
}

// fittedRouter routes with a fitted baseline router.
type fittedRouter struct {
	s Setup
	r *baselines.Router
}

func newFitted(name string, s Setup) (Router, error) {
	if s.RouterDir == "" {
		return nil, fitHint(name, s, "")
	}
	dir := filepath.Join(s.RouterDir, name)
	cfg := s.Embedding
	if cfg.Provider == "" {
		cfg = embed.DefaultConfig()
	}
	var opts []embed.Option
	if s.EmbeddingCache != "" {
		opts = append(opts, embed.WithCacheDir(s.EmbeddingCache))
	}
	emb, err := embed.New(cfg, opts...)
	if err != nil {
		return nil, fmt.Errorf("eval: router %s: %w", name, err)
	}
	r, err := baselines.Load(dir, emb)
	if errors.Is(err, baselines.ErrNotFitted) {
		return nil, fitHint(name, s, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("eval: router %s: %w", name, err)
	}
	if r.Name() != name {
		return nil, fmt.Errorf("eval: router %s: %s holds router %s", name, dir, r.Name())
	}
	if s.CostLambda != nil {
		if err := r.SetCostLambda(*s.CostLambda); err != nil {
			return nil, fmt.Errorf("eval: router %s: %w", name, err)
		}
	}
	var missing []string
	for _, m := range r.Models() {
		if _, ok := s.Env.Pool.Lookup(m); !ok {
			missing = append(missing, m)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("eval: router %s in %s routes to %s, which the pool lacks (%s); fit it on this pool's outcomes",
			name, dir, strings.Join(missing, ", "), strings.Join(r.Models(), ", "))
	}
	return fittedRouter{s: s, r: r}, nil
}

func (f fittedRouter) Answer(ctx context.Context, qs []data.Example) ([]rollout.QuestionResult, error) {
	questions := make([]string, len(qs))
	for i, q := range qs {
		questions[i] = q.Question
	}
	picks, _, err := f.pickFor(ctx, qs, questions)
	if err != nil {
		return nil, err
	}
	return directAnswers(ctx, f.s.Env.Pool, qs, picks)
}

// pickFor routes queries[i] (a question of qs[i] or a sub-question of it,
// in qs[i]'s dataset); no call is made.
func (f fittedRouter) pickFor(ctx context.Context, qs []data.Example, queries []string) ([]string, [][]router.Call, error) {
	in := make([]baselines.Query, len(qs))
	for i, q := range qs {
		in[i] = baselines.Query{Text: queries[i], Dataset: q.Dataset}
	}
	picks, err := f.r.Route(ctx, in)
	if err != nil {
		return nil, nil, fmt.Errorf("eval: router %s: %w", f.r.Name(), err)
	}
	return picks, make([][]router.Call, len(qs)), nil
}
