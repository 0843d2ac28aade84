package plot

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The frontier figure draws on a log cost axis, a free model included, and
// names the single models on it.
func TestFrontier(t *testing.T) {
	dir := t.TempDir()
	series := []FrontierSeries{
		{Name: "single", Points: [][2]float64{{0, 0.5}, {0.001, 0.7}, {0.003, 0.9}}, Labels: []string{"free", "mid", "dear"},
			Hull: [][2]float64{{0, 0.5}, {0.001, 0.7}, {0.003, 0.9}}},
		{Name: "cascade", Points: [][2]float64{{0.002, 0.88}}},
		{Name: "oracle", Points: [][2]float64{{0.0002, 0.97}}, Reference: true},
	}
	paths, err := Frontier("EM against cost", series, dir, "frontier")
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != 2 || filepath.Base(paths[0]) != "frontier.png" || filepath.Base(paths[1]) != "frontier.svg" {
		t.Fatalf("wrote %v, want frontier.png and frontier.svg", paths)
	}
	svg, err := os.ReadFile(paths[1])
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"free (free)", "dear", "cascade", "log scale"} {
		if !strings.Contains(string(svg), want) {
			t.Errorf("the SVG lacks %q", want)
		}
	}
	if st, err := os.Stat(paths[0]); err != nil || st.Size() < 1000 {
		t.Errorf("PNG: %v, %v", st, err)
	}
	if _, err := Frontier("t", []FrontierSeries{{Name: "single", Points: [][2]float64{{0, 0.5}}}}, dir, "free"); err == nil || !strings.Contains(err.Error(), "no point costs more than 0") {
		t.Errorf("every point free: error %v, want one saying there is no log axis", err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "free*")); len(left) != 0 {
		t.Errorf("a failed figure left %v", left)
	}
}
