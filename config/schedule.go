package config

import (
	"fmt"
	"math"
	"slices"
)

// lrDecays are the learning-rate schedules train.lr_schedule names: the
// factor of train.lr at progress p ∈ [0, 1) through the steps after the
// warm-up, decaying towards floor (train.min_lr_ratio).
var lrDecays = map[string]func(p, floor float64) float64{
	// constant: train.lr at every step (the paper's setting).
	"constant": func(p, floor float64) float64 { return 1 },
	// linear: 1 at p = 0, floor at p = 1.
	"linear": func(p, floor float64) float64 { return 1 - (1-floor)*p },
	// cosine: a half cosine, 1 at p = 0, floor at p = 1 (Loshchilov and
	// Hutter's SGDR without restarts).
	"cosine": func(p, floor float64) float64 { return floor + (1-floor)*(1+math.Cos(math.Pi*p))/2 },
}

// LRSchedules lists the known values of train.lr_schedule, sorted.
func LRSchedules() []string {
	var out []string
	for k := range lrDecays {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// LRFactor is the factor of train.lr that GRPO step s (1-based, 1 … Steps)
// trains with; a pure function of s and the [train] keys, so a resumed run
// continues the schedule from the step its checkpoint holds. With W =
// WarmupSteps:
//
//	s ≤ W:  s/W                                  (linear warm-up, reaching 1 at step W)
//	s > W:  decay(p), p = (s − W − 1)/(Steps − W)  (p = 0 at the first step after the warm-up)
//
// decay is LRSchedule's: 1 (constant), 1 − (1 − m)·p (linear) or
// m + (1 − m)·(1 + cos πp)/2 (cosine), m = MinLRRatio. As in the supervised
// warm-up's linear decay, the last step trains with a small learning rate,
// not with m·lr: p reaches 1 at the step after the last.
func (t Train) LRFactor(s int) float64 {
	s = max(s, 1)
	if s <= t.WarmupSteps {
		return float64(s) / float64(t.WarmupSteps)
	}
	decay := lrDecays[t.LRSchedule]
	if decay == nil {
		decay = lrDecays["constant"] // Validate refuses unknown names
	}
	n := t.Steps - t.WarmupSteps
	if n <= 0 {
		return 1
	}
	p := min(float64(s-t.WarmupSteps-1)/float64(n), 1)
	return decay(p, t.MinLRRatio)
}

// DescribeLR says in one line how the learning rate moves over the GRPO
// steps, for recal train --dry-run.
func (t Train) DescribeLR() string {
	warm := "no warm-up"
	if t.WarmupSteps > 0 {
		warm = fmt.Sprintf("linear warm-up over %d steps", t.WarmupSteps)
	}
	what := "constant"
	if t.LRSchedule != "constant" {
		what = fmt.Sprintf("%s decay towards %.3g", t.LRSchedule, t.MinLRRatio*t.LR)
	}
	if t.Steps < 1 {
		return fmt.Sprintf("%s, %s", what, warm)
	}
	mid := (t.Steps + 1) / 2
	return fmt.Sprintf("%s, %s: %.3g at step 1, %.3g at step %d, %.3g at step %d", what, warm,
		t.LR*t.LRFactor(1), t.LR*t.LRFactor(mid), mid, t.LR*t.LRFactor(t.Steps), t.Steps)
}
