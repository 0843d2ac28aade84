package calibration

import (
	"fmt"
	"sort"
	"strings"
)

// ablations are the paper's ablation settings (the "Results of Ablation" table), each
// setting all four switches so that it gives the same pipeline whatever
// config it is applied to. Weights, δ, τ bounds and ε are left alone.
//
//	recal    full ReCal: gating, CAE, reweighting, dataset normalisation
//	wo_lsc   w/o learning-signal clarity calibration: gating and CAE off
//	wo_cae   w/o component-wise advantages: CAE off
//	wo_dao   w/o distribution-aware optimisation: reweighting and dataset normalisation off
//	wo_both  w/o both: all off, plain GRPO on the scalar reward
var ablations = map[string][4]bool{
	//           gating, CAE,  reweight, datanorm
	"recal":   {true, true, true, true},
	"wo_lsc":  {false, false, true, true},
	"wo_cae":  {true, false, true, true},
	"wo_dao":  {true, true, false, false},
	"wo_both": {false, false, false, false},
}

// AblationNames lists the known ablation names, sorted.
func AblationNames() []string {
	names := make([]string, 0, len(ablations))
	for n := range ablations {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Ablation returns the config edit for a named ablation ("recal", "wo_lsc",
// "wo_cae", "wo_dao", "wo_both"); an unknown name is an error listing the
// known ones.
func Ablation(name string) (func(*Config), error) {
	s, ok := ablations[name]
	if !ok {
		return nil, fmt.Errorf("calibration: unknown ablation %q (known: %s)", name, strings.Join(AblationNames(), ", "))
	}
	return func(c *Config) {
		c.Gating, c.ComponentAdvantages, c.VarianceReweighting, c.DatasetNormalization = s[0], s[1], s[2], s[3]
	}, nil
}
