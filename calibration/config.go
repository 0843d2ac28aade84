package calibration

import (
	"errors"
	"fmt"
	"math"
	"strings"
)

// Components names the raw reward components in their fixed order: the
// paper's five, then cost (not in the paper; weight 0 by default). Every
// [NumComponents]float64 in this package (Response.Raw, Result.Gated,
// Weights.Vector, …) is indexed by it, and the indices Ans … Cost name the
// positions.
var Components = []string{"ans", "info", "format", "route", "balance", "cost"}

// Positions of the components in Components and in every [NumComponents]float64.
const (
	Ans = iota
	Info
	Format
	Route
	Balance
	Cost
	// NumComponents is the number of reward components.
	NumComponents
)

// ComponentIndex returns the position of a component name in Components.
func ComponentIndex(name string) (int, bool) {
	for i, c := range Components {
		if c == name {
			return i, true
		}
	}
	return 0, false
}

// Config is the calibration table of recal.toml (keys calibration.*). The four switches turn the
// pipeline steps of docs/method.md on and off; all four on is full ReCal, all four
// off is plain GRPO on the scalar reward.
type Config struct {
	// Gating turns on hierarchical gating (step 1): each component in Gated
	// counts only when the response's answer reward exceeds GateThreshold.
	Gating bool `toml:"gating" json:"gating"`
	// Gated lists the components gated on the answer reward (names from
	// Components, never "ans"). Default: info, format, route, balance, cost.
	Gated []string `toml:"gated" json:"gated"`
	// GateThreshold is δ: a gated component keeps its raw value when
	// r_ans > δ and is 0 otherwise. Unitless (rewards are in [0, 1]). Default 0.
	GateThreshold float64 `toml:"gate_threshold" json:"gate_threshold"`
	// ComponentAdvantages turns on component-wise advantage estimation (CAE,
	// step 3): each component is normalised within its group before the
	// weighted sum, instead of normalising the weighted scalar reward.
	ComponentAdvantages bool `toml:"component_advantages" json:"component_advantages"`
	// VarianceReweighting turns on variance-aware reweighting (step 4): a
	// group's advantages are scaled by τᵢ = clip(σᵢ/σ̄, TauMin, TauMax).
	VarianceReweighting bool `toml:"variance_reweighting" json:"variance_reweighting"`
	// TauMin is the lower clip of τᵢ (unitless ratio). Default 0.8 (paper).
	TauMin float64 `toml:"tau_min" json:"tau_min"`
	// TauMax is the upper clip of τᵢ (unitless ratio). Default 1.25 (paper).
	TauMax float64 `toml:"tau_max" json:"tau_max"`
	// DatasetNormalization turns on per-dataset normalisation (step 5): the
	// advantages of each dataset's responses are standardised over the batch.
	DatasetNormalization bool `toml:"dataset_normalization" json:"dataset_normalization"`
	// Epsilon is ε, added to every standard deviation before dividing by it
	// (steps 3 and 5), and the σ̄ below which τ is 1 (step 4). Default 1e-6.
	Epsilon float64 `toml:"epsilon" json:"epsilon"`
	// Weights are the component weights λₘ (table calibration.weights).
	Weights Weights `toml:"weights" json:"weights"`
}

// Weights are the weights λₘ of the reward components, used both in the
// scalar reward r = Σₘ λₘ r⁽ᵐ⁾ and in the CAE sum A = Σₘ λₘ A⁽ᵐ⁾. They must be
// non-negative and not all zero.
type Weights struct {
	Ans     float64 `toml:"ans" json:"ans"`         // λ_ans, answer F1
	Info    float64 `toml:"info" json:"info"`       // λ_info, best F1 of an <information> block
	Format  float64 `toml:"format" json:"format"`   // λ_format, well-formedness (0 or 1)
	Route   float64 `toml:"route" json:"route"`     // λ_route, routing efficiency
	Balance float64 `toml:"balance" json:"balance"` // λ_balance, load balance over the pool
	// Cost is λ_cost, the weight of the cost component (cheapness of the
	// response's pool spend against the pool's dearest call for the
	// question, in [0, 1]; docs/method.md §4). Not in the paper: 0 (off) by
	// default, and with 0 every advantage is bit for bit the five-component one.
	Cost float64 `toml:"cost" json:"cost"`
}

// Vector returns the weights in Components order.
func (w Weights) Vector() [NumComponents]float64 {
	return [NumComponents]float64{w.Ans, w.Info, w.Format, w.Route, w.Balance, w.Cost}
}

// DefaultWeights are the λₘ of DefaultConfig. The paper does not publish its
// weights, so these are ours: the answer reward, the objective the router is
// evaluated on, has weight 1; info and format, which directly support a
// correct answer (useful retrieved evidence, a parseable protocol), have half
// of it; route and balance, cost and load regularisers that must never
// outweigh correctness, have a quarter each. Under CAE every A⁽ᵐ⁾ has unit
// scale within its group, so λₘ is exactly the component's relative pull on
// the policy; the auxiliaries are gated on the answer anyway, so they only
// rank responses among those that answered. Cost, which the paper does not
// have, is 0: off.
func DefaultWeights() Weights {
	return Weights{Ans: 1, Info: 0.5, Format: 0.5, Route: 0.25, Balance: 0.25}
}

// DefaultConfig is full ReCal: all four switches on, gating of every
// auxiliary component (cost included: a cheap wrong answer earns nothing) at δ = 0, τ ∈ [0.8, 1.25] (the paper's Table of
// hyperparameters), ε = 1e-6 and DefaultWeights.
func DefaultConfig() Config {
	return Config{
		Gating:               true,
		Gated:                []string{"info", "format", "route", "balance", "cost"},
		GateThreshold:        0,
		ComponentAdvantages:  true,
		VarianceReweighting:  true,
		TauMin:               0.8,
		TauMax:               1.25,
		DatasetNormalization: true,
		Epsilon:              1e-6,
		Weights:              DefaultWeights(),
	}
}

// Validate reports every invalid field at once, each error naming its key
// (e.g. "calibration: calibration.tau_min (1.5) > calibration.tau_max (1.25)").
// Every field is checked, also those of switches that are off, so a saved
// config is valid whichever ablation is later applied to it.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("calibration: "+format, args...))
	}
	finite := func(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

	seen := map[string]bool{}
	for _, g := range c.Gated {
		switch _, ok := ComponentIndex(g); {
		case g == "ans":
			bad("calibration.gated: %q is never gated (gating is conditioned on it)", g)
		case !ok:
			bad("calibration.gated: unknown component %q (known: %s)", g, strings.Join(Components[1:], ", "))
		case seen[g]:
			bad("calibration.gated: %q listed twice", g)
		}
		seen[g] = true
	}
	if !finite(c.GateThreshold) {
		bad("calibration.gate_threshold (%g) must be finite", c.GateThreshold)
	}
	if !finite(c.TauMin) || c.TauMin < 0 {
		bad("calibration.tau_min (%g) must be finite and >= 0", c.TauMin)
	}
	if !finite(c.TauMax) || c.TauMax < 0 {
		bad("calibration.tau_max (%g) must be finite and >= 0", c.TauMax)
	}
	if c.TauMin > c.TauMax {
		bad("calibration.tau_min (%g) > calibration.tau_max (%g)", c.TauMin, c.TauMax)
	}
	if !finite(c.Epsilon) || c.Epsilon <= 0 {
		bad("calibration.epsilon (%g) must be finite and > 0", c.Epsilon)
	}
	w := c.Weights.Vector()
	var total float64
	for m, x := range w {
		if !finite(x) || x < 0 {
			bad("calibration.weights.%s (%g) must be finite and >= 0", Components[m], x)
			continue
		}
		total += x
	}
	if total == 0 {
		bad("calibration.weights: all zero, so every advantage would be 0")
	}
	return errors.Join(errs...)
}

// gatedMask marks the components gating applies to.
func (c Config) gatedMask() [NumComponents]bool {
	var mask [NumComponents]bool
	for _, g := range c.Gated {
		if m, ok := ComponentIndex(g); ok && m != Ans {
			mask[m] = true
		}
	}
	return mask
}
