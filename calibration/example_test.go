package calibration_test

import (
	"fmt"

	"github.com/recal-project/recal/calibration"
)

// Full ReCal on three questions from two datasets, three responses each. Raw
// rewards are in calibration.Components order: ans, info, format, route,
// balance, cost (here 0, and its weight is 0 by default). Response 1 has no correct answer, so gating zeroes its auxiliary
// rewards before anything else; group 1's responses barely differ, so
// reweighting damps them (τ = 0.8) and boosts the others (τ = 1.25).
// (testdata/reference.py calibrate gives the same Â.)
func ExampleCalibrate() {
	batch := []calibration.Response{
		{Group: 0, Dataset: "nq", Raw: [calibration.NumComponents]float64{1, 0.5, 1, 1, 0.4}},
		{Group: 0, Dataset: "nq", Raw: [calibration.NumComponents]float64{0, 0.8, 1, 1, 0.6}},
		{Group: 0, Dataset: "nq", Raw: [calibration.NumComponents]float64{1, 0.9, 1, 0.5, 0.7}},
		{Group: 1, Dataset: "nq", Raw: [calibration.NumComponents]float64{0.5, 0.2, 1, 1, 0.5}},
		{Group: 1, Dataset: "nq", Raw: [calibration.NumComponents]float64{0.5, 0.6, 0, 1, 0.5}},
		{Group: 1, Dataset: "nq", Raw: [calibration.NumComponents]float64{0.4, 0.6, 1, 1, 0.5}},
		{Group: 2, Dataset: "hotpotqa", Raw: [calibration.NumComponents]float64{0, 0.3, 1, 0, 0}},
		{Group: 2, Dataset: "hotpotqa", Raw: [calibration.NumComponents]float64{1, 1, 1, 1, 0.2}},
		{Group: 2, Dataset: "hotpotqa", Raw: [calibration.NumComponents]float64{0, 0, 0, 0, 0}},
	}
	res, err := calibration.Calibrate(calibration.DefaultConfig(), batch)
	if err != nil {
		fmt.Println(err)
		return
	}
	for j, r := range batch {
		fmt.Printf("%-8s group %d  gated %-22v r %.4f  τ %.4f  Â %.4f\n",
			r.Dataset, r.Group, fmt.Sprint(res.Gated[j]), res.Scalar[j], res.Tau[j], res.Advantages[j])
	}
	// Output:
	// nq       group 0  gated [1 0.5 1 1 0.4 0]      r 2.1000  τ 1.2500  Â 0.8420
	// nq       group 0  gated [0 0 0 0 0 0]          r 0.0000  τ 1.2500  Â -1.9753
	// nq       group 0  gated [1 0.9 1 0.5 0.7 0]    r 2.2500  τ 1.2500  Â 1.1333
	// nq       group 1  gated [0.5 0.2 1 1 0.5 0]    r 1.4750  τ 0.8000  Â 0.1322
	// nq       group 1  gated [0.5 0.6 0 1 0.5 0]    r 1.1750  τ 0.8000  Â 0.1322
	// nq       group 1  gated [0.4 0.6 1 1 0.5 0]    r 1.5750  τ 0.8000  Â -0.2644
	// hotpotqa group 2  gated [0 0 0 0 0 0]          r 0.0000  τ 1.2500  Â -0.7071
	// hotpotqa group 2  gated [1 1 1 1 0.2 0]        r 2.3000  τ 1.2500  Â 1.4142
	// hotpotqa group 2  gated [0 0 0 0 0 0]          r 0.0000  τ 1.2500  Â -0.7071
}

// The paper's ablations are one config edit each.
func ExampleAblation() {
	for _, name := range calibration.AblationNames() {
		cfg := calibration.DefaultConfig()
		edit, err := calibration.Ablation(name)
		if err != nil {
			fmt.Println(err)
			return
		}
		edit(&cfg)
		fmt.Printf("%-8s gating=%-5v cae=%-5v reweight=%-5v datanorm=%v\n",
			name, cfg.Gating, cfg.ComponentAdvantages, cfg.VarianceReweighting, cfg.DatasetNormalization)
	}
	_, err := calibration.Ablation("wo_gating")
	fmt.Println(err)
	// Output:
	// recal    gating=true  cae=true  reweight=true  datanorm=true
	// wo_both  gating=false cae=false reweight=false datanorm=false
	// wo_cae   gating=true  cae=false reweight=true  datanorm=true
	// wo_dao   gating=true  cae=true  reweight=false datanorm=false
	// wo_lsc   gating=false cae=false reweight=true  datanorm=true
	// calibration: unknown ablation "wo_gating" (known: recal, wo_both, wo_cae, wo_dao, wo_lsc)
}

// Validate names the key of every bad field.
func ExampleConfig_Validate() {
	cfg := calibration.DefaultConfig()
	cfg.TauMin = 1.5
	cfg.Gated = append(cfg.Gated, "ans")
	fmt.Println(cfg.Validate())
	// Output:
	// calibration: calibration.gated: "ans" is never gated (gating is conditioned on it)
	// calibration: calibration.tau_min (1.5) > calibration.tau_max (1.25)
}
