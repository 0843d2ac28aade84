package config

import (
	"math"
	"strings"
	"testing"
)

// The learning-rate factor of each step, against numbers worked out by hand
// from the formulas in Train.LRFactor's comment.
func TestLRFactor(t *testing.T) {
	cases := []struct {
		name     string
		schedule string
		steps    int
		warmup   int
		floor    float64
		want     []float64 // steps 1 … steps
	}{
		{"constant (the default: train.lr at every step)", "constant", 4, 0, 0, []float64{1, 1, 1, 1}},
		{"constant ignores min_lr_ratio", "constant", 3, 0, 0.5, []float64{1, 1, 1}},
		{"constant after a warm-up", "constant", 6, 4, 0, []float64{0.25, 0.5, 0.75, 1, 1, 1}},
		{"linear to zero, as sft.lr decays", "linear", 4, 0, 0, []float64{1, 0.75, 0.5, 0.25}},
		{"linear towards a floor", "linear", 5, 0, 0.5, []float64{1, 0.9, 0.8, 0.7, 0.6}},
		{"linear after a warm-up", "linear", 5, 1, 0, []float64{1, 1, 0.75, 0.5, 0.25}},
		// (1 + cos π/4)/2 = 0.8535534, (1 + cos 3π/4)/2 = 0.1464466.
		{"cosine to zero", "cosine", 4, 0, 0, []float64{1, 0.8535534, 0.5, 0.1464466}},
		// 0.2 + 0.8·0.8535534 = 0.8828427; 0.2 + 0.8·0.5 = 0.6; 0.2 + 0.8·0.1464466 = 0.3171573.
		{"cosine towards a floor", "cosine", 4, 0, 0.2, []float64{1, 0.8828427, 0.6, 0.3171573}},
		{"cosine after a warm-up", "cosine", 6, 2, 0, []float64{0.5, 1, 1, 0.8535534, 0.5, 0.1464466}},
		{"one step", "cosine", 1, 0, 0, []float64{1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := Default().Train
			tr.LRSchedule, tr.Steps, tr.WarmupSteps, tr.MinLRRatio = c.schedule, c.steps, c.warmup, c.floor
			for i, want := range c.want {
				if got := tr.LRFactor(i + 1); math.Abs(got-want) > 1e-6 {
					t.Errorf("step %d: factor %.7f, want %.7f (the schedule a run trains with must be the documented one)", i+1, got, want)
				}
			}
			// Every factor is in (0, 1]: no step is wasted on a zero learning rate.
			for s := 1; s <= c.steps; s++ {
				if f := tr.LRFactor(s); f <= 0 || f > 1 {
					t.Errorf("step %d: factor %g, want it in (0, 1]", s, f)
				}
			}
		})
	}
}

// The dry run's line names the schedule and its learning rates.
func TestDescribeLR(t *testing.T) {
	tr := Default().Train
	if got := tr.DescribeLR(); !strings.HasPrefix(got, "constant, no warm-up: 1e-06 at step 1") {
		t.Errorf("default schedule described as %q", got)
	}
	// Step 5: p = (5−2−1)/3, 0.1 + 0.9·(1 + cos 2π/3)/2 = 0.325.
	tr.LRSchedule, tr.Steps, tr.WarmupSteps, tr.MinLRRatio, tr.LR = "cosine", 5, 2, 0.1, 1e-3
	if got, want := tr.DescribeLR(), "cosine decay towards 0.0001, linear warm-up over 2 steps: 0.0005 at step 1, 0.001 at step 3, 0.000325 at step 5"; got != want {
		t.Errorf("described as %q, want %q", got, want)
	}
	// 0.1 × 3e-4 is 2.9999999999999997e-05 in float64: said as 3e-05.
	tr3 := Train{LR: 3e-4, LRSchedule: "cosine", MinLRRatio: 0.1, Steps: 300}
	if got := tr3.DescribeLR(); !strings.HasPrefix(got, "cosine decay towards 3e-05, ") {
		t.Errorf("described as %q, want the floor said as 3e-05", got)
	}
}
