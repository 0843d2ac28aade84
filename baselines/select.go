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
// held-out questions; the weights whose picks have the highest mean F1 are
// kept (the earliest on a tie). GraphRouter's code keeps its best
// validation model the same way; RouterDC's picks its checkpoint on the
// test sets, which this never does. The simulated pool's outcomes are
// draws, and a router fitted to the last epoch learns their noise.

// ValidationRef records the model selection of a fit.
type ValidationRef struct {
	// Questions held out (0: no selection, the last weights are kept).
	Questions int `json:"questions"`
	// F1 is the held-out questions' mean F1 of the kept weights' picks.
	F1 float64 `json:"f1"`
	// Check is the check (1-based) that gave them, of Checks.
	Check  int `json:"check"`
	Checks int `json:"checks"`
}

// validation holds out questions and keeps the best weights seen.
type validation struct {
	idx   []int
	ref   ValidationRef
	saved [][]float64
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
	return train, &validation{idx: val, ref: ValidationRef{Questions: nv, F1: -1}}
}

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
	var f1 float64
	for i, q := range v.idx {
		best := 0
		for j := range sc[i] {
			if sc[i][j] > sc[i][best] {
				best = j
			}
		}
		f1 += d.m.F1[q][best]
	}
	f1 /= float64(len(v.idx))
	if f1 > v.ref.F1 {
		v.ref.F1, v.ref.Check = f1, v.ref.Checks
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
