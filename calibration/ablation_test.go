package calibration

import (
	"strings"
	"testing"
)

func TestAblation(t *testing.T) {
	tests := []struct {
		name                                string
		gating, cae, reweight, datasetNorms bool
	}{
		{"recal", true, true, true, true},
		{"wo_lsc", false, false, true, true},
		{"wo_cae", true, false, true, true},
		{"wo_dao", true, true, false, false},
		{"wo_both", false, false, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			edit, err := Ablation(tt.name)
			if err != nil {
				t.Fatalf("Ablation(%q): %v", tt.name, err)
			}
			// Start from the opposite of the wanted switches: an ablation must
			// give the same pipeline whatever config it is applied to.
			c := DefaultConfig()
			c.Gating, c.ComponentAdvantages, c.VarianceReweighting, c.DatasetNormalization =
				!tt.gating, !tt.cae, !tt.reweight, !tt.datasetNorms
			c.Weights.Route = 3
			edit(&c)
			if c.Gating != tt.gating || c.ComponentAdvantages != tt.cae ||
				c.VarianceReweighting != tt.reweight || c.DatasetNormalization != tt.datasetNorms {
				t.Errorf("after %s: gating=%v cae=%v reweight=%v datanorm=%v, want %v %v %v %v (docs/method.md's ablations)",
					tt.name, c.Gating, c.ComponentAdvantages, c.VarianceReweighting, c.DatasetNormalization,
					tt.gating, tt.cae, tt.reweight, tt.datasetNorms)
			}
			if c.Weights.Route != 3 || c.TauMin != 0.8 {
				t.Errorf("ablation %s changed weights or τ bounds; it must only flip the switches", tt.name)
			}
		})
	}
	if got, want := strings.Join(AblationNames(), ","), "recal,wo_both,wo_cae,wo_dao,wo_lsc"; got != want {
		t.Errorf("AblationNames() = %s, want %s", got, want)
	}
	_, err := Ablation("wo_gating")
	if err == nil || !strings.Contains(err.Error(), "recal, wo_both, wo_cae, wo_dao, wo_lsc") {
		t.Errorf("Ablation(unknown) error = %v, want it to list the known names", err)
	}
}
