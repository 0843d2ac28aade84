package calibration

import (
	"errors"
	"fmt"
	"math"
)

// Errors Calibrate returns, wrapped with the offending response.
var (
	// ErrEmptyBatch means Calibrate got no responses.
	ErrEmptyBatch = errors.New("calibration: empty batch")
	// ErrNonFinite means a raw reward is NaN or ±Inf; it would poison every
	// advantage of its group and dataset.
	ErrNonFinite = errors.New("calibration: non-finite reward")
	// ErrMixedGroup means one group holds responses from two datasets. Groups
	// must be per globally unique question id (dataset + id); Router-R1's
	// per-dataset index lets an NQ and a HotpotQA question share a group.
	ErrMixedGroup = errors.New("calibration: group spans two datasets")
)

// Response is one sampled response of the step's batch.
type Response struct {
	// Group identifies the response's question within the batch: responses
	// with the same Group form one GRPO group. Any ints, in any order.
	Group int
	// Dataset is the question's source dataset, the unit of step 5.
	Dataset string
	// Raw holds the raw reward components before gating, in Components order.
	Raw [NumComponents]float64
}

// DatasetStats are the statistics of step 5 for one dataset: the mean and
// population std of the advantages after step 4 over the batch's responses
// from that dataset. They are filled in whether or not normalisation is on.
type DatasetStats struct {
	Name  string  // dataset name
	Count int     // responses of the batch from it
	Mean  float64 // μ⁽ᵈ⁾
	Std   float64 // σ⁽ᵈ⁾ (population)
}

// Result holds the final advantages and every intermediate quantity, one
// entry per response in input order unless said otherwise.
type Result struct {
	// Advantages are the final Â, exactly what the loss uses.
	Advantages []float64
	// Gated are the reward components after step 1 (the raw ones when gating is off).
	Gated [][NumComponents]float64
	// Scalar is r = Σₘ λₘ r⁽ᵐ⁾ after gating (step 2).
	Scalar []float64
	// ComponentAdvantages are the unweighted per-component group advantages
	// A⁽ᵐ⁾ = (r⁽ᵐ⁾ − μᵢ⁽ᵐ⁾)/(σᵢ⁽ᵐ⁾ + ε) of the gated rewards; computed for
	// logging whether or not CAE is on, used only when it is.
	ComponentAdvantages [][NumComponents]float64
	// Clarity is A after step 3 (CAE or scalar GRPO advantage).
	Clarity []float64
	// Reweighted is A after step 4, τᵢ·A (equal to Clarity when reweighting is off).
	Reweighted []float64
	// Tau is τᵢ of the response's group (1 when reweighting is off or σ̄ < ε).
	Tau []float64
	// GroupMean is μᵢ of the scalar rewards of the response's group.
	GroupMean []float64
	// GroupStd is σᵢ, the population std of the scalar rewards of the response's group.
	GroupStd []float64
	// SigmaBar is σ̄, the mean of σᵢ over the batch's groups (each group counted once).
	SigmaBar float64
	// Groups is the number of groups in the batch.
	Groups int
	// Datasets are the step-5 statistics, in order of first appearance.
	Datasets []DatasetStats
}

// group is one GRPO group: its members' indices in the batch, in input order.
type group struct {
	id      int
	dataset string
	members []int
}

// Calibrate computes the calibrated advantages Â of one step's batch with the
// pipeline of docs/method.md (see the package doc): gating, scalar reward,
// group advantage (CAE or scalar), variance-aware reweighting, per-dataset
// normalisation, each step switched by cfg. Groups and datasets are visited
// in order of first appearance and every sum runs in input order. The config
// is validated first; an empty batch, a non-finite reward or a group spanning
// two datasets is an error.
func Calibrate(cfg Config, batch []Response) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	groups, err := groupBatch(batch)
	if err != nil {
		return Result{}, err
	}
	n := len(batch)
	res := Result{
		Advantages:          make([]float64, n),
		Gated:               make([][NumComponents]float64, n),
		Scalar:              make([]float64, n),
		ComponentAdvantages: make([][NumComponents]float64, n),
		Clarity:             make([]float64, n),
		Reweighted:          make([]float64, n),
		Tau:                 make([]float64, n),
		GroupMean:           make([]float64, n),
		GroupStd:            make([]float64, n),
		Groups:              len(groups),
	}
	w := cfg.Weights.Vector()

	// 1. Hierarchical gating.
	mask := cfg.gatedMask()
	for j, r := range batch {
		res.Gated[j] = r.Raw
		if cfg.Gating {
			res.Gated[j] = gate(r.Raw, mask, cfg.GateThreshold)
		}
	}
	// 2. Scalar reward.
	for j := range batch {
		res.Scalar[j] = weightedSum(w, res.Gated[j])
	}
	// 3. Group advantages: the scalar GRPO one (whose σᵢ step 4 reuses) and
	// the per-component ones; the switch picks which becomes A.
	scalarAdv := make([]float64, n)
	sigmas := make([]float64, len(groups))
	for gi, g := range groups {
		mean, std := groupAdvantages(g.members, cfg.Epsilon, res.Scalar, scalarAdv)
		sigmas[gi] = std
		for _, j := range g.members {
			res.GroupMean[j], res.GroupStd[j] = mean, std
		}
		for m := range Components {
			componentAdvantages(g.members, m, cfg.Epsilon, res.Gated, res.ComponentAdvantages)
		}
	}
	for j := range batch {
		if cfg.ComponentAdvantages {
			res.Clarity[j] = weightedSum(w, res.ComponentAdvantages[j])
		} else {
			res.Clarity[j] = scalarAdv[j]
		}
	}
	// 4. Variance-aware reweighting.
	res.SigmaBar, _ = meanStd(sigmas)
	for gi, g := range groups {
		tau := 1.0
		if cfg.VarianceReweighting {
			tau = varianceWeight(sigmas[gi], res.SigmaBar, cfg)
		}
		for _, j := range g.members {
			res.Tau[j] = tau
			res.Reweighted[j] = tau * res.Clarity[j]
		}
	}
	// 5. Per-dataset normalisation.
	copy(res.Advantages, res.Reweighted)
	for _, d := range datasets(batch) {
		xs := make([]float64, len(d.members))
		for k, j := range d.members {
			xs[k] = res.Reweighted[j]
		}
		mean, std := meanStd(xs)
		res.Datasets = append(res.Datasets, DatasetStats{Name: d.dataset, Count: len(xs), Mean: mean, Std: std})
		if cfg.DatasetNormalization {
			for _, j := range d.members {
				res.Advantages[j] = (res.Reweighted[j] - mean) / (std + cfg.Epsilon)
			}
		}
	}
	return res, nil
}

// gate is hierarchical gating (paper eq. "r⁽ᵐ⁾ = 𝕀(r⁽ᵃⁿˢ⁾ > δ)·r̃⁽ᵐ⁾"): each
// gated component keeps its raw value when the answer reward is strictly
// above δ and is 0 otherwise. The answer reward itself is never gated.
func gate(raw [NumComponents]float64, gated [NumComponents]bool, delta float64) [NumComponents]float64 {
	out := raw
	if raw[Ans] > delta {
		return out
	}
	for m, g := range gated {
		if g {
			out[m] = 0
		}
	}
	return out
}

// weightedSum is Σₘ λₘ xₘ in Components order: the scalar reward
// r = Σₘ λₘ r⁽ᵐ⁾ (paper §3) and the clarity advantage A = Σₘ λₘ A⁽ᵐ⁾ (paper
// eq. "A^clarity"). The explicit conversion keeps it free of fused
// multiply-adds, like the reference script.
func weightedSum(w, x [NumComponents]float64) float64 {
	var s float64
	for m := range w {
		s += float64(w[m] * x[m])
	}
	return s
}

// groupAdvantages is GRPO's group-relative advantage on the scalar reward,
// A = (r − μᵢ)/(σᵢ + ε) with the population std, written to adv for the
// group's members. It returns μᵢ and σᵢ, which step 4 reuses.
func groupAdvantages(members []int, eps float64, r, adv []float64) (mean, std float64) {
	xs := make([]float64, len(members))
	for k, j := range members {
		xs[k] = r[j]
	}
	mean, std = meanStd(xs)
	for _, j := range members {
		adv[j] = (r[j] - mean) / (std + eps)
	}
	return mean, std
}

// componentAdvantages is the component-wise advantage of paper §4 (CAE),
// A⁽ᵐ⁾ = (r⁽ᵐ⁾ − μᵢ⁽ᵐ⁾)/(σᵢ⁽ᵐ⁾ + ε) with the population std, for component m
// of the group's members.
func componentAdvantages(members []int, m int, eps float64, r, adv [][NumComponents]float64) {
	xs := make([]float64, len(members))
	for k, j := range members {
		xs[k] = r[j][m]
	}
	mean, std := meanStd(xs)
	for _, j := range members {
		adv[j][m] = (r[j][m] - mean) / (std + eps)
	}
}

// varianceWeight is τᵢ = clip(σᵢ/σ̄, τ_min, τ_max) (paper eq. "τᵢ"), with
// σᵢ the population std of group i's scalar rewards and σ̄ their mean over the
// batch's groups; when σ̄ < ε (every group nearly constant) τᵢ = 1.
func varianceWeight(sigma, sigmaBar float64, cfg Config) float64 {
	if sigmaBar < cfg.Epsilon {
		return 1
	}
	return clip(sigma/sigmaBar, cfg.TauMin, cfg.TauMax)
}

// groupBatch checks the batch and splits it into groups in order of first
// appearance.
func groupBatch(batch []Response) ([]group, error) {
	if len(batch) == 0 {
		return nil, ErrEmptyBatch
	}
	var groups []group
	index := map[int]int{}
	for j, r := range batch {
		for m, x := range r.Raw {
			if math.IsNaN(x) || math.IsInf(x, 0) {
				return nil, fmt.Errorf("%w: response %d (group %d): %s = %g", ErrNonFinite, j, r.Group, Components[m], x)
			}
		}
		gi, ok := index[r.Group]
		if !ok {
			gi = len(groups)
			index[r.Group] = gi
			groups = append(groups, group{id: r.Group, dataset: r.Dataset})
		}
		if groups[gi].dataset != r.Dataset {
			return nil, fmt.Errorf("%w: group %d has %q and %q (response %d)", ErrMixedGroup, r.Group, groups[gi].dataset, r.Dataset, j)
		}
		groups[gi].members = append(groups[gi].members, j)
	}
	return groups, nil
}

// datasets splits the batch by dataset in order of first appearance (the
// group id is unused).
func datasets(batch []Response) []group {
	var ds []group
	index := map[string]int{}
	for j, r := range batch {
		di, ok := index[r.Dataset]
		if !ok {
			di = len(ds)
			index[r.Dataset] = di
			ds = append(ds, group{dataset: r.Dataset})
		}
		ds[di].members = append(ds[di].members, j)
	}
	return ds
}
