package calibration

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// TestCostWeightZeroIsFiveComponents holds the cost component to its
// promise of changing nothing while its weight is 0 (the paper's
// configuration): testdata/golden-five.json holds reference.py's advantages
// from before the cost component existed (five components; never
// regenerated), and Calibrate, given any cost values at weight 0, must give
// exactly those bits in each of its cases (ReCal, each ablation, custom
// configs).
func TestCostWeightZeroIsFiveComponents(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "golden-five.json"))
	if err != nil {
		t.Fatal(err)
	}
	var golden goldenFile
	if err := json.Unmarshal(b, &golden); err != nil {
		t.Fatal(err)
	}
	if len(golden.Cases) != 8 {
		t.Fatalf("golden-five.json has %d cases, want its 8 (a frozen file)", len(golden.Cases))
	}
	rng := rand.New(rand.NewPCG(39, 6))
	for _, c := range golden.Cases {
		t.Run(c.Name, func(t *testing.T) {
			cfg, err := configFromJSON(c.Config)
			if err != nil {
				t.Fatalf("config %s: %v", c.Config, err)
			}
			if cfg.Weights.Cost != 0 {
				t.Fatalf("case %s resolves calibration.weights.cost = %g, want the default 0", c.Name, cfg.Weights.Cost)
			}
			for _, costs := range []string{"zero", "random", "one"} {
				batch := make([]Response, len(c.Batch))
				for j, r := range c.Batch {
					if _, ok := r.Raw["cost"]; ok {
						t.Fatalf("batch[%d] has a cost: golden-five.json predates the component", j)
					}
					m := map[string]float64{"cost": map[string]float64{"zero": 0, "one": 1, "random": rng.Float64()}[costs]}
					for k, v := range r.Raw {
						m[k] = v
					}
					raw, err := rawFromMap(m)
					if err != nil {
						t.Fatalf("batch[%d]: %v", j, err)
					}
					batch[j] = Response{Group: r.Group, Dataset: r.Dataset, Raw: raw}
				}
				res, err := Calibrate(cfg, batch)
				if err != nil {
					t.Fatal(err)
				}
				for j := range c.Advantages {
					if math.Float64bits(res.Advantages[j]) != math.Float64bits(c.Advantages[j]) || math.Float64bits(res.Tau[j]) != math.Float64bits(c.Tau[j]) {
						t.Errorf("%s costs, response %d: Â %v τ %v, want the five-component %v τ %v bit for bit (a weight-0 cost must change nothing)",
							costs, j, res.Advantages[j], res.Tau[j], c.Advantages[j], c.Tau[j])
					}
				}
			}
		})
	}
}

// TestCostWeightMovesAdvantages changes λ_cost by Δ and checks each
// quantity moves as docs/method.md §5 says: the scalar reward by
// Δ·r⁽ᶜᵒˢᵗ⁾ (after gating), the CAE advantage by Δ·A⁽ᶜᵒˢᵗ⁾ (the cost
// component's own group advantage, which does not depend on any weight),
// and, with reweighting and dataset normalisation off, the final Â by
// exactly that. Every setting of the four switches is run.
func TestCostWeightMovesAdvantages(t *testing.T) {
	const tol = 1e-12
	rng := rand.New(rand.NewPCG(39, 39))
	batch := randomBatch(rng, 6, 5)
	batch[0].Raw[Ans] = 0 // at least one gated cost
	for _, base := range []float64{0, 0.25} {
		for _, delta := range []float64{0.5, 1, 3} {
			for bits := range 16 {
				cfg := DefaultConfig()
				cfg.Gating, cfg.ComponentAdvantages, cfg.VarianceReweighting, cfg.DatasetNormalization = bits&8 != 0, bits&4 != 0, bits&2 != 0, bits&1 != 0
				name := fmt.Sprintf("λ=%g,Δ=%g,gating=%v,cae=%v,reweight=%v,datanorm=%v", base, delta, cfg.Gating, cfg.ComponentAdvantages, cfg.VarianceReweighting, cfg.DatasetNormalization)
				t.Run(name, func(t *testing.T) {
					cfg.Weights.Cost = base
					before, err := Calibrate(cfg, batch)
					if err != nil {
						t.Fatal(err)
					}
					cfg.Weights.Cost = base + delta
					after, err := Calibrate(cfg, batch)
					if err != nil {
						t.Fatal(err)
					}
					gatedCosts := 0
					for j := range batch {
						if after.ComponentAdvantages[j] != before.ComponentAdvantages[j] || after.Gated[j] != before.Gated[j] {
							t.Fatalf("response %d: gated rewards or A⁽ᵐ⁾ changed with λ_cost; they are weight-free", j)
						}
						rc := after.Gated[j][Cost]
						if cfg.Gating && batch[j].Raw[Ans] <= cfg.GateThreshold {
							gatedCosts++
							if rc != 0 {
								t.Errorf("response %d: gated r_cost = %g with r_ans %g ≤ δ, want 0", j, rc, batch[j].Raw[Ans])
							}
						} else if rc != batch[j].Raw[Cost] {
							t.Errorf("response %d: r_cost after gating %g, want the raw %g", j, rc, batch[j].Raw[Cost])
						}
						if got, want := after.Scalar[j]-before.Scalar[j], delta*rc; math.Abs(got-want) > tol {
							t.Errorf("response %d: scalar reward moved by %.17g, want Δ·r_cost = %.17g", j, got, want)
						}
						if !cfg.ComponentAdvantages {
							continue
						}
						want := delta * after.ComponentAdvantages[j][Cost]
						if got := after.Clarity[j] - before.Clarity[j]; math.Abs(got-want) > tol {
							t.Errorf("response %d: CAE advantage moved by %.17g, want Δ·A⁽ᶜᵒˢᵗ⁾ = %.17g", j, got, want)
						}
						if !cfg.VarianceReweighting && !cfg.DatasetNormalization {
							if got := after.Advantages[j] - before.Advantages[j]; math.Abs(got-want) > tol {
								t.Errorf("response %d: Â moved by %.17g, want Δ·A⁽ᶜᵒˢᵗ⁾ = %.17g", j, got, want)
							}
						}
					}
					if cfg.Gating && gatedCosts == 0 {
						t.Fatal("no response had its cost gated: the batch does not test gating")
					}
					moved := false
					for j := range batch {
						moved = moved || after.Advantages[j] != before.Advantages[j]
					}
					if !moved {
						t.Error("no advantage moved when λ_cost changed: the component does not reach Â")
					}
				})
			}
		}
	}
}
