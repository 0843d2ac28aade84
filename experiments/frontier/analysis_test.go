package frontier

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestUpperHull(t *testing.T) {
	cases := []struct {
		name string
		in   []Vertex
		want Hull
	}{
		{"concave, a point under the chord, a dominated dearer one",
			[]Vertex{{3, 0.9}, {0, 0.5}, {2, 0.72}, {1, 0.7}, {4, 0.85}}, Hull{{0, 0.5}, {1, 0.7}, {3, 0.9}}},
		{"one point", []Vertex{{2, 0.4}}, Hull{{2, 0.4}}},
		{"equal cost: the better", []Vertex{{1, 0.3}, {1, 0.6}}, Hull{{1, 0.6}}},
		{"a cheaper better point dominates", []Vertex{{1, 0.8}, {2, 0.7}}, Hull{{1, 0.8}}},
		{"collinear middle dropped", []Vertex{{0, 0}, {1, 0.5}, {2, 1}}, Hull{{0, 0}, {2, 1}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := UpperHull(c.in)
			if len(got) != len(c.want) {
				t.Fatalf("hull %v, want %v", got, c.want)
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Fatalf("hull %v, want %v", got, c.want)
				}
			}
		})
	}
}

func TestHullMeasures(t *testing.T) {
	h := Hull{{0, 0.5}, {1, 0.7}, {3, 0.9}}
	for _, c := range []struct{ at, want float64 }{{0, 0.5}, {0.5, 0.6}, {2, 0.8}, {3, 0.9}, {10, 0.9}} {
		if got := h.At(c.at); !near(got, c.want) {
			t.Errorf("At(%v) = %v, want %v", c.at, got, c.want)
		}
	}
	if got := (Hull{{1, 0.5}}).At(0.5); !math.IsNaN(got) {
		t.Errorf("At below the first vertex = %v, want NaN (the family cannot operate there)", got)
	}
	if got := h.FirstReach(0.8); !near(got, 2) {
		t.Errorf("FirstReach(0.8) = %v, want 2", got)
	}
	if got := h.FirstReach(0.4); !near(got, 0) {
		t.Errorf("FirstReach(0.4) = %v, want 0: the first vertex already reaches it", got)
	}
	if got := h.FirstReach(0.95); !math.IsNaN(got) {
		t.Errorf("FirstReach(0.95) = %v, want NaN", got)
	}
	// (0.6 + 0.8·2 + 0.9) / 4
	if got := h.Area(0, 4); !near(got, 3.1/4) {
		t.Errorf("Area(0, 4) = %v, want %v", got, 3.1/4)
	}
	// a hull starting at cost 2 counts 0 over [0, 2): (0.8+0.9)/2·1 + 0.9·1 over 4
	if got := (Hull{{2, 0.8}, {3, 0.9}}).Area(0, 4); !near(got, (0.85+0.9)/4) {
		t.Errorf("Area of a hull starting at 2 = %v, want %v", got, (0.85+0.9)/4)
	}
	if got := h.Area(1, 1); !math.IsNaN(got) {
		t.Errorf("Area over an empty range = %v, want NaN", got)
	}
}

func pt(family, label string, cost, em float64) Point {
	return Point{Family: family, Label: label, Cost: cost, EM: em}
}

// A free model is a point; a one-point router is a family; a family below
// the hull everywhere is reported with no point above.
func TestAnalyze(t *testing.T) {
	ps := []Point{
		pt(FamilySingle, "free", 0, 0.5),
		pt(FamilySingle, "mid", 1, 0.7),
		pt(FamilySingle, "dear", 3, 0.9),
		pt("mlp", "mlp λ=0", 2, 0.75), // below the hull's 0.8 at 2
		pt("mlp", "mlp λ=1", 0.5, 0.55),
		pt(FamilyCascade, "cascade t=0.7", 1.5, 0.88), // above 0.75
		pt(FamilyOracle, "oracle", 0.2, 0.97),
	}
	rep, err := Analyze(ps)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Best != "dear" || rep.BestEM != 0.9 || rep.BestCost != 3 || rep.CostRange != [2]float64{0, 3} {
		t.Errorf("best %s %v at %v, range %v; want dear 0.9 at 3 over [0, 3]", rep.Best, rep.BestEM, rep.BestCost, rep.CostRange)
	}
	marks := map[string]string{}
	for _, p := range rep.Points {
		marks[p.Label] = p.Mark
	}
	want := map[string]string{"free": "on", "mid": "on", "dear": "on", "mlp λ=0": "below", "mlp λ=1": "below", "cascade t=0.7": "above", "oracle": "above"}
	for l, m := range want {
		if marks[l] != m {
			t.Errorf("%s marked %q, want %q", l, marks[l], m)
		}
	}
	fam := map[string]Family{}
	for _, f := range rep.Families {
		fam[f.Name] = f
	}
	if f := fam["mlp"]; f.Above != 0 || f.Points != 2 || f.ReachCost != nil || f.EMAtHalf == nil || !near(*f.EMAtHalf, 0.55+0.2*(1.0/1.5)) {
		t.Errorf("mlp: %+v; want 2 points, none above, never reaching 0.9, EM at cost 1.5 on its hull (0.5,0.55)-(2,0.75)", f)
	}
	if f := fam[FamilyCascade]; f.Points != 1 || f.Above != 1 || f.AIQ == nil || !near(*f.AIQ, 0.88*1.5/3) || f.EMAtHalf == nil || *f.EMAtHalf != 0.88 {
		t.Errorf("cascade: %+v; want one point above, AIQ 0.88 over [1.5, 3] of [0, 3], EM 0.88 at 1.5", f)
	}
	if f := fam[FamilySingle]; f.ReachCost == nil || *f.ReachCost != 3 || f.AIQ == nil || !near(*f.AIQ, (0.6+0.8*2)/3) {
		t.Errorf("single: %+v; want reaching its best at 3 and AIQ %v", f, (0.6+0.8*2)/3)
	}
}

func TestAnalyzeErrors(t *testing.T) {
	cases := []struct {
		name string
		ps   []Point
		want string
	}{
		{"no single model", []Point{pt("mlp", "m", 1, 0.5)}, "no single-model point"},
		{"costs all missing", []Point{pt(FamilySingle, "a", 0, 0.5), pt(FamilySingle, "b", 0, 0.6)}, "every single model costs 0"},
		{"NaN cost", []Point{pt(FamilySingle, "a", 1, 0.5), pt("mlp", "m", math.NaN(), 0.5)}, "m (mlp): cost per question NaN"},
		{"negative cost", []Point{pt(FamilySingle, "a", -1, 0.5)}, "a (single): cost per question -1"},
		{"EM above 1", []Point{pt(FamilySingle, "a", 1, 1.5)}, "EM 1.5"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Analyze(c.ps)
			if !errors.Is(err, ErrPoints) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want ErrPoints naming %q", err, c.want)
			}
		})
	}
}

// Seeds of one policy are summarised by their mean and sample standard
// deviation, and placed above the single models' hull only when the mean
// EM beats the hull's EM at the mean cost by more than the EMs' spread.
func TestSeedSummaries(t *testing.T) {
	singles := []Point{
		{Family: FamilySingle, Label: "cheap", EM: 0.6, Cost: 1},
		{Family: FamilySingle, Label: "dear", EM: 0.8, Cost: 3},
	} // the hull at cost 2: 0.7
	seed := func(group string, em, cost float64, shares map[string]float64) Point {
		return Point{Family: FamilyPolicy, Label: group, Group: group, EM: em, Cost: cost, Calls: 1, Shares: shares}
	}
	cases := []struct {
		name     string
		seeds    []Point
		em, std  float64
		cost     float64
		margin   float64
		above    bool
		maxShare float64
		maxModel string
	}{
		{"above by more than the spread", []Point{seed("a", 0.74, 1.9, map[string]float64{"dear": 0.5, "cheap": 0.5}), seed("a", 0.76, 2, map[string]float64{"dear": 0.7, "cheap": 0.3}), seed("a", 0.75, 2.1, map[string]float64{"dear": 0.6, "cheap": 0.4})},
			0.75, 0.01, 2, 0.05, true, 0.6, "dear"},
		{"above on average, within the spread", []Point{seed("b", 0.6, 2, nil), seed("b", 0.9, 2, nil)},
			0.75, math.Sqrt(0.045), 2, 0.05, false, 0, ""},
		{"one seed is never enough", []Point{seed("c", 0.79, 2, nil)}, 0.79, 0, 2, 0.09, false, 0, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rep, err := Analyze(append(slices.Clone(singles), c.seeds...))
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Seeds) != 1 {
				t.Fatalf("%d seed summaries, want 1", len(rep.Seeds))
			}
			s := rep.Seeds[0]
			if s.Seeds != len(c.seeds) || !near(s.EM, c.em) || !near(s.EMStd, c.std) || !near(s.Cost, c.cost) || s.Margin == nil || !near(*s.Margin, c.margin) || s.Above != c.above {
				t.Errorf("summary %+v (margin %v), want EM %v ± %v at cost %v, margin %v, above %v", s, s.Margin, c.em, c.std, c.cost, c.margin, c.above)
			}
			if !near(s.MaxShare, c.maxShare) || s.MaxModel != c.maxModel {
				t.Errorf("largest call share %v (%q), want %v (%q)", s.MaxShare, s.MaxModel, c.maxShare, c.maxModel)
			}
		})
	}
}

func TestSplitEntry(t *testing.T) {
	cases := []struct {
		entry string
		name  string
		paths []string
	}{
		{"runs/a", "", []string{"runs/a"}},
		{"runs/a+runs/b", "", []string{"runs/a", "runs/b"}},
		{"recal=runs/a+runs/b+runs/c", "recal", []string{"runs/a", "runs/b", "runs/c"}},
		{"router-r1_ppo=runs/p", "router-r1_ppo", []string{"runs/p"}},
		{"runs/x=y", "", []string{"runs/x=y"}}, // no name before the "=": a path
		{"1st=runs/a", "", []string{"1st=runs/a"}},
	}
	for _, c := range cases {
		name, paths := splitEntry(c.entry)
		if name != c.name || !slices.Equal(paths, c.paths) {
			t.Errorf("splitEntry(%q) = %q, %q; want %q, %q", c.entry, name, paths, c.name, c.paths)
		}
	}
	for _, b := range []float64{0, -1, math.Inf(1), math.NaN()} {
		if err := (Options{Work: t.TempDir(), Budgets: []float64{b}}).Validate(); !errors.Is(err, ErrOptions) || !strings.Contains(err.Error(), "--budgets") {
			t.Errorf("Validate(--budgets %v) = %v, want a bad budget", b, err)
		}
	}
	for _, bad := range []string{"single=" + t.TempDir(), "cascade=" + t.TempDir(), "mlp=" + t.TempDir()} {
		if err := (Options{Work: t.TempDir(), Checkpoints: []string{bad}}).Validate(); !errors.Is(err, ErrOptions) || !strings.Contains(err.Error(), "names another family") {
			t.Errorf("Validate(--checkpoints %s) = %v, want a name clash", bad, err)
		}
	}
}
