package baselines

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
)

// Model selection. A fit holds out baselines.val_share of the matrix's
// questions (drawn with the fit's seed), trains on the rest, and after
// every epoch (GraphRouter: every twentieth of its steps) routes the
// held-out questions; the weights whose picks have the highest mean
// utility are kept (the earliest on a tie): F1 − cost_lambda · cost of
// each pick, cost being the picked model's relative mean cost (the unit
// of cost_lambda, see Config), the trade-off the router routes for. With
// cost_lambda = 0 that is the picks' mean F1. (MLP and GraphRouter score
// in F1 units, so there the utility is exactly their routing rule on the
// observed F1; RouteLLM-MF's logits and RouterDC's softmax are other
// units, and their cost_lambda weighs the held-out cost in F1 units.)
// GraphRouter's code keeps its best validation model the same way;
// RouterDC's picks its checkpoint on the test sets, which this never does.
// The simulated pool's outcomes are draws, and a router fitted to the last
// epoch learns their noise.

// ValidationRef records the model selection of a fit.
type ValidationRef struct {
	// Questions held out (0: no selection, the last weights are kept).
	Questions int `json:"questions"`
	// F1 is the held-out questions' mean F1 of the kept weights' picks.
	F1 float64 `json:"f1"`
	// Cost is the mean relative cost of those picks (see RoutedModel.Cost).
	Cost float64 `json:"cost"`
	// Utility is F1 − cost_lambda · Cost: what the selection maximised.
	Utility float64 `json:"utility"`
	// Check is the check (1-based) that gave them, of Checks.
	Check  int `json:"check"`
	Checks int `json:"checks"`
}

// validation holds out questions and keeps the best weights seen.
type validation struct {
	idx    []int
	ref    ValidationRef
	saved  [][]float64
	lambda float64   // the router's cost_lambda
	cost   []float64 // the models' relative costs
	best   float64   // the best utility so far (−Inf before the first check)
}

// split draws the held-out questions: share of n (none when fewer than two
// would be left to train on).
func split(n int, share float64, rng *rand.Rand) (train []int, v *validation) {
	perm := rng.Perm(n)
	nv := int(math.Round(share * float64(n)))
	if n-nv < 2 || nv < 1 {
		nv = 0
	}
	val := slices.Clone(perm[:nv])
	train = slices.Clone(perm[nv:])
	slices.Sort(val)
	slices.Sort(train)
	return train, &validation{idx: val, ref: ValidationRef{Questions: nv, F1: -1}, best: math.Inf(-1)}
}

// weigh makes the selection cost-aware: lambda is the router's
// cost_lambda, cost the models' relative costs (costs(fitData.models)).
func (v *validation) weigh(lambda float64, cost []float64) { v.lambda, v.cost = lambda, cost }

// check routes the held-out questions with m's current weights and keeps
// them if they do best so far.
func (v *validation) check(ctx context.Context, d *fitData, m model) error {
	v.ref.Checks++
	if len(v.idx) == 0 {
		return nil
	}
	in := scoreInput{x: batchRows(d.x, d.dim, v.idx), n: len(v.idx), dim: d.dim, embed: d.embed}
	for _, q := range v.idx {
		in.datasets = append(in.datasets, d.m.Questions[q].Dataset)
	}
	sc, err := m.scores(ctx, in)
	if err != nil {
		return err
	}
	var f1, cost float64
	for i, q := range v.idx {
		best := 0
		for j := range sc[i] {
			if sc[i][j] > sc[i][best] {
				best = j
			}
		}
		f1 += d.m.F1[q][best]
		if best < len(v.cost) {
			cost += v.cost[best]
		}
	}
	f1 /= float64(len(v.idx))
	cost /= float64(len(v.idx))
	if u := f1 - v.lambda*cost; u > v.best {
		v.best = u
		v.ref.F1, v.ref.Cost, v.ref.Utility, v.ref.Check = f1, cost, u, v.ref.Checks
		v.saved = v.saved[:0]
		for _, p := range m.weights() {
			v.saved = append(v.saved, slices.Clone(p.w))
		}
	}
	return nil
}

// restore puts the kept weights back (nothing without a held-out set).
func (v *validation) restore(m model) {
	if len(v.saved) == 0 {
		return
	}
	for i, p := range m.weights() {
		copy(p.w, v.saved[i])
	}
}
