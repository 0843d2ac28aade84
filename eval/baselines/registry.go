package baselines

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
)

// model is a variant's trained network.
type model interface {
	// weights lists the saved tensors, in a fixed order.
	weights() []*param
	// scores returns, per question, the utility of each model (higher is
	// better, cost penalty included): the router picks the argmax.
	scores(ctx context.Context, in scoreInput) ([][]float64, error)
}

// scoreInput is what a model scores.
type scoreInput struct {
	x        []float64 // n×dim question embeddings, row-major
	n, dim   int
	datasets []string
	embed    func(ctx context.Context, texts []string) ([]float64, error) // n×dim, flat
}

// spec is a registered router.
type spec struct {
	// hyper returns the router's table of c, saved in the manifest.
	hyper func(c Config) any
	// fit trains a model on d with the router's table of c.
	fit func(ctx context.Context, d *fitData, c Config, rng *rand.Rand) (model, error)
	// build makes an untrained model with a manifest's shapes (its table,
	// embedding size and models), for Load to fill with the saved weights.
	build func(man *Manifest) (model, error)
	// lambda is the router's cost_lambda in c (its model selection weighs
	// cost with it, as its routing does).
	lambda func(c Config) float64
}

// registry holds the trainable baseline routers of the ReCal paper's
// Table 1, each documented at its type: "mlp" (mlpModel, RouterBench),
// "routellm-mf" (mfModel, RouteLLM), "routerdc" (dcModel, RouterDC) and
// "graphrouter" (graphModel, GraphRouter). Unknown names are an error
// listing these.
var registry = map[string]spec{
	"mlp": {hyper: func(c Config) any { return c.MLP }, fit: fitMLP, build: buildMLP,
		lambda: func(c Config) float64 { return c.MLP.CostLambda }},
	"routellm-mf": {hyper: func(c Config) any { return c.RouteLLMMF }, fit: fitMF, build: buildMF,
		lambda: func(c Config) float64 { return c.RouteLLMMF.CostLambda }},
	"routerdc": {hyper: func(c Config) any { return c.RouterDC }, fit: fitDC, build: buildDC,
		lambda: func(c Config) float64 { return c.RouterDC.CostLambda }},
	"graphrouter": {hyper: func(c Config) any { return c.GraphRouter }, fit: fitGraph, build: buildGraph,
		lambda: func(c Config) float64 { return c.GraphRouter.CostLambda }},
}

// Names lists the registered routers, sorted.
func Names() []string {
	out := make([]string, 0, len(registry))
	for k := range registry {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func lookup(name string) (spec, error) {
	s, ok := registry[name]
	if !ok {
		return spec{}, fmt.Errorf("baselines: unknown router %q (known: %s)", name, strings.Join(Names(), ", "))
	}
	return s, nil
}
