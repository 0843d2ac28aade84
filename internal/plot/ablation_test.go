package plot

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The ablation figure's line is the mean over seeds of each seed's smoothed
// answer reward and its band their minimum and maximum, at the steps every
// seed logged.
func TestAblationBand(t *testing.T) {
	run := func(ans ...float64) string {
		t.Helper()
		dir := t.TempDir()
		var b strings.Builder
		for i, v := range ans {
			fmt.Fprintf(&b, `{"step": %d, "reward": {"ans": %g, "format": 1}}`+"\n", i+1, v)
		}
		if err := os.WriteFile(filepath.Join(dir, MetricsFile), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	a, b, short := run(0, 1, 0.5), run(1, 1, 0.5), run(0.5, 0.5)
	cases := []struct {
		name         string
		runs         []string
		window       int
		mean, lo, hi []float64
	}{
		// window 2: a → 0, 0.5, 0.75; b → 1, 1, 0.75
		{"two seeds, window 2", []string{a, b}, 2, []float64{0.5, 0.75, 0.75}, []float64{0, 0.5, 0.75}, []float64{1, 1, 0.75}},
		{"raw, a seed without step 3", []string{a, short}, 1, []float64{0.25, 0.75}, []float64{0, 0.5}, []float64{0.5, 1}},
		{"one seed: no band", []string{a}, 1, []float64{0, 1, 0.5}, nil, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := seedBand(Curves{Label: "v", Runs: c.runs}, c.window, nil)
			if err != nil {
				t.Fatal(err)
			}
			check := func(what string, got []float64, want []float64) {
				t.Helper()
				if len(got) != len(want) {
					t.Fatalf("%s %v, want %v", what, got, want)
				}
				for i := range want {
					if math.Abs(got[i]-want[i]) > 1e-12 {
						t.Fatalf("%s %v, want %v (computed by hand)", what, got, want)
					}
				}
			}
			var mean, lo, hi []float64
			for i := range s.xys {
				mean = append(mean, s.xys[i].Y)
			}
			for i := range s.lo {
				lo, hi = append(lo, s.lo[i].Y), append(hi, s.hi[i].Y)
			}
			check("mean", mean, c.mean)
			check("min", lo, c.lo)
			check("max", hi, c.hi)
		})
	}
	out := t.TempDir()
	paths, err := Options{Window: 2}.Ablation([]Curves{{Label: "w/o both", Runs: []string{a, b}}, {Label: "ReCal", Runs: []string{b, a}}}, out)
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != 2 || filepath.Base(paths[0]) != AblationFigure+".png" || filepath.Base(paths[1]) != AblationFigure+".svg" {
		t.Fatalf("wrote %v, want %s.png and .svg", paths, AblationFigure)
	}
	svg, err := os.ReadFile(paths[1])
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"w/o both", "ReCal", "min–max over seeds"} {
		if !strings.Contains(string(svg), want) {
			t.Errorf("the SVG lacks %q", want)
		}
	}
}
