package baselines

import (
	"errors"
	"fmt"
	"math"
)

// ErrCostLambda: a cost_lambda that is not a finite number >= 0.
var ErrCostLambda = errors.New("baselines: bad cost_lambda")

// CheckCostLambda returns an error wrapping ErrCostLambda naming key unless
// l is finite and >= 0.
func CheckCostLambda(key string, l float64) error {
	if math.IsNaN(l) || math.IsInf(l, 0) || l < 0 {
		return fmt.Errorf("%w: %s = %v, want a finite number >= 0", ErrCostLambda, key, l)
	}
	return nil
}

// SetCostLambda makes r route at cost_lambda l from now on: argmax score −
// l · cost, as if fitted with it, except that the epoch kept by validation
// (baselines.val_share) was chosen at the fitted cost_lambda. It sweeps a
// router's operating points without refitting it (recal frontier).
func (r *Router) SetCostLambda(l float64) error {
	if err := CheckCostLambda("cost_lambda", l); err != nil {
		return err
	}
	switch m := r.mdl.(type) {
	case *mlpModel:
		m.lambda = l
	case *mfModel:
		m.lambda = l
	case *dcModel:
		m.lambda = l
	case *graphModel:
		m.lambda = l
	default:
		return fmt.Errorf("baselines: router %s has no cost_lambda", r.Name())
	}
	return nil
}
