package plot

import (
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestNiceTicks(t *testing.T) {
	tests := []struct {
		lo, hi float64
		want   int
		labels []string // the labelled ticks, in order
	}{
		{0, 1, 5, []string{"0.0", "0.2", "0.4", "0.6", "0.8", "1.0"}},
		{1, 60, 8, []string{"10", "20", "30", "40", "50", "60"}},
		{0.001, 0.06, 6, []string{"0.01", "0.02", "0.03", "0.04", "0.05", "0.06"}},
		{-1, 1, 4, []string{"-1.0", "-0.5", "0.0", "0.5", "1.0"}},
		{0.24, 0.5, 6, []string{"0.25", "0.30", "0.35", "0.40", "0.45", "0.50"}},
		{0, 10, 4, []string{"0.0", "2.5", "5.0", "7.5", "10.0"}},
		{-3, -1, 4, []string{"-3.0", "-2.5", "-2.0", "-1.5", "-1.0"}},
	}
	for _, tt := range tests {
		var labels []string
		for _, tk := range (niceTicks{want: tt.want}).Ticks(tt.lo, tt.hi) {
			if tk.Value < tt.lo-1e-9 || tk.Value > tt.hi+1e-9 {
				t.Errorf("Ticks(%g, %g) has %g outside the axis", tt.lo, tt.hi, tk.Value)
			}
			if tk.Label != "" {
				labels = append(labels, tk.Label)
			}
		}
		if diff := cmp.Diff(tt.labels, labels); diff != "" {
			t.Errorf("Ticks(%g, %g) with want %d: round labels at even steps (-want +got):\n%s", tt.lo, tt.hi, tt.want, diff)
		}
	}
}

// A constant series smoothed by the moving average spans a few ulps; the
// ticker once looped forever on such a range.
func TestNiceTicksNarrowRange(t *testing.T) {
	lo := 1.8
	hi := math.Nextafter(lo, 2)
	ticks := (niceTicks{want: 6}).Ticks(lo, hi)
	if len(ticks) > 1000 {
		t.Errorf("Ticks(%v, %v) gave %d ticks, want a bounded handful", lo, hi, len(ticks))
	}
}
