package ablate

import (
	"bytes"
	"encoding/csv"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/recal-project/recal/calibration"
	"github.com/recal-project/recal/eval"
	"github.com/recal-project/recal/internal/rollout"
)

// The study's rows are exactly the registered ablations: a variant missing
// here would never be trained, one unknown to calibration could not be.
func TestVariantsAreTheAblations(t *testing.T) {
	var names []string
	for _, v := range Variants {
		names = append(names, v.Name)
	}
	slices.Sort(names)
	if want := calibration.AblationNames(); !slices.Equal(names, want) {
		t.Fatalf("Variants name %v, want the registered ablations %v", names, want)
	}
}

// The table's mean ± std are computed from the per-seed results, each
// average taken within a seed first. The expected numbers are worked out by
// hand below, not by the code under test.
func TestSummarizeByHand(t *testing.T) {
	seeds := []int64{0, 1, 2}
	datasets := []string{"nq", "triviaqa", "hotpotqa"}
	em := func(nq, tqa, hqa float64) map[string]float64 {
		return map[string]float64{"nq": nq, "triviaqa": tqa, "hotpotqa": hqa}
	}
	results := []Result{
		{Variant: "recal", Seed: 0, EM: em(0.4, 0.2, 0.1), CostPerQuestion: 1e-5},
		{Variant: "recal", Seed: 1, EM: em(0.5, 0.2, 0.3), CostPerQuestion: 2e-5},
		{Variant: "recal", Seed: 2, EM: em(0.6, 0.5, 0.2), CostPerQuestion: 3e-5},
		{Variant: "wo_both", Seed: 2, EM: em(0.3, 0.3, 0.3)},
		{Variant: "wo_both", Seed: 0, EM: em(0.1, 0.1, 0.1)},
		{Variant: "wo_both", Seed: 1, EM: em(0.2, 0.2, 0.2)},
	}
	vs := []Variant{{"wo_both", "w/o both"}, {"recal", "ReCal (full)"}}
	tab, err := Summarize(results, datasets, []string{"nq", "hotpotqa"}, seeds, vs)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"nq", "triviaqa", "hotpotqa", ColInDomain, ColOutOfDomain, ColAverage, ColCost}; !slices.Equal(tab.Columns, want) {
		t.Fatalf("columns %v, want %v", tab.Columns, want)
	}
	// recal by hand:
	//   nq        0.4 0.5 0.6: mean 0.5, Σd² = 0.02, std = √(0.02/2) = 0.1
	//   triviaqa  0.2 0.2 0.5: mean 0.3, Σd² = 0.06, std = √0.03 = 0.173205
	//   hotpotqa  0.1 0.3 0.2: mean 0.2, std 0.1
	//   id avg per seed (nq+hotpotqa)/2: 0.25 0.40 0.40: mean 0.35, Σd² = 0.015, std = √0.0075 = 0.086603
	//   ood avg = triviaqa
	//   avg per seed: 0.7/3 1.0/3 1.3/3: mean 1/3, std 0.1
	// wo_both: every column 0.1 0.2 0.3 (rows given out of seed order): mean 0.2, std 0.1.
	want := map[string]map[string][2]float64{
		"recal": {"nq": {0.5, 0.1}, "triviaqa": {0.3, math.Sqrt(0.03)}, "hotpotqa": {0.2, 0.1}, ColCost: {2e-5, 1e-5},
			ColInDomain: {0.35, math.Sqrt(0.0075)}, ColOutOfDomain: {0.3, math.Sqrt(0.03)}, ColAverage: {1.0 / 3, 0.1}},
		"wo_both": {"nq": {0.2, 0.1}, "triviaqa": {0.2, 0.1}, "hotpotqa": {0.2, 0.1},
			ColInDomain: {0.2, 0.1}, ColOutOfDomain: {0.2, 0.1}, ColAverage: {0.2, 0.1}},
	}
	if len(tab.Rows) != 2 || tab.Rows[0].Name != "wo_both" || tab.Rows[1].Name != "recal" {
		t.Fatalf("rows %+v, want wo_both then recal (the order asked for)", tab.Rows)
	}
	for _, r := range tab.Rows {
		for col, w := range want[r.Name] {
			got := r.Cells[col]
			if math.Abs(got.Mean-w[0]) > 1e-12 || math.Abs(got.Std-w[1]) > 1e-12 || got.N != 3 {
				t.Errorf("%s %s = %.6f ± %.6f (n %d), want %.6f ± %.6f (n 3) as computed by hand", r.Name, col, got.Mean, got.Std, got.N, w[0], w[1])
			}
		}
		if len(r.PerSeed) != 3 || r.PerSeed[0].Seed != 0 || r.PerSeed[2].Seed != 2 {
			t.Errorf("%s per seed %+v, want seeds 0, 1, 2 in order", r.Name, r.PerSeed)
		}
	}
	if got := tab.Rows[1].PerSeed[0].Values[ColInDomain]; math.Abs(got-0.25) > 1e-12 {
		t.Errorf("recal seed 0 id avg = %v, want (0.4+0.1)/2 = 0.25", got)
	}

	// The renderings carry the same numbers.
	var md, txt, cs bytes.Buffer
	tab.Markdown(&md)
	tab.Text(&txt)
	if err := tab.CSV(&cs); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"| ReCal (full) | 0.500 ± 0.100 | 0.300 ± 0.173 | 0.200 ± 0.100 | 0.350 ± 0.087 | 0.300 ± 0.173 | 0.333 ± 0.100 | 0.000020 ± 0.000010 |", "nq† |", "n−1"} {
		if !strings.Contains(md.String(), s) {
			t.Errorf("markdown lacks %q:\n%s", s, md.String())
		}
	}
	if !strings.Contains(txt.String(), "0.350 ± 0.087") {
		t.Errorf("text lacks the recal id avg 0.350 ± 0.087:\n%s", txt.String())
	}
	lines, err := csv.NewReader(&cs).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"recal", "ReCal (full)", ColInDomain, "0.350000", "0.086603", "3", "0.250000", "0.400000", "0.400000"}; !slices.ContainsFunc(lines, func(l []string) bool { return slices.Equal(l, want) }) {
		t.Errorf("csv lacks the line %v:\n%s", want, cs.String())
	}
}

// The reference rows carry eval's numbers: exact match per dataset, the
// in-domain, out-of-domain and overall averages taken as the variants'
// are, and the cost per question; every format shows them.
func TestAddReferences(t *testing.T) {
	tab, err := Summarize([]Result{{Variant: "recal", Seed: 0, EM: map[string]float64{"nq": 0.5, "triviaqa": 0.25}}},
		[]string{"nq", "triviaqa"}, []string{"nq"}, []int64{0}, []Variant{{Full, "ReCal (full)"}})
	if err != nil {
		t.Fatal(err)
	}
	tab.AddReferences([]eval.Row{
		{Reference: eval.RefOracle, Datasets: map[string]rollout.Score{"nq": {EM: 1}, "triviaqa": {EM: 0.5}}, CostPerQuestion: 0.00025},
		{Reference: eval.RefBest, Model: "big", Datasets: map[string]rollout.Score{"nq": {EM: 0.75}, "triviaqa": {EM: 0.5}}, CostPerQuestion: 0.001},
		{Reference: eval.RefCheapest, Model: "small", Datasets: map[string]rollout.Score{"nq": {EM: 0.25}, "triviaqa": {EM: 0}}, CostPerQuestion: 0.00001},
	})
	want := map[string]map[string]float64{
		eval.RefOracle:   {"nq": 1, "triviaqa": 0.5, ColInDomain: 1, ColOutOfDomain: 0.5, ColAverage: 0.75, ColCost: 0.00025},
		eval.RefBest:     {"nq": 0.75, "triviaqa": 0.5, ColInDomain: 0.75, ColOutOfDomain: 0.5, ColAverage: 0.625, ColCost: 0.001},
		eval.RefCheapest: {"nq": 0.25, "triviaqa": 0, ColInDomain: 0.25, ColOutOfDomain: 0, ColAverage: 0.125, ColCost: 0.00001},
	}
	if len(tab.References) != 3 {
		t.Fatalf("%d reference rows, want 3", len(tab.References))
	}
	for _, r := range tab.References {
		for c, w := range want[r.Name] {
			if got := r.Cells[c]; got.Mean != w || got.N != 1 {
				t.Errorf("%s %s = %v (n %d), want %v (n 1)", r.Name, c, got.Mean, got.N, w)
			}
		}
	}
	var md, txt, cs bytes.Buffer
	tab.Markdown(&md)
	tab.Text(&txt)
	if err := tab.CSV(&cs); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"| *oracle* (reference) | 1.000 | 0.500 | 1.000 | 0.500 | 0.750 | 0.000250 |",
		"| *best (big)* (reference) |", "| *cheapest (small)* (reference) | 0.250 | 0.000 | 0.250 | 0.000 | 0.125 | 0.000010 |", "not routers"} {
		if !strings.Contains(md.String(), s) {
			t.Errorf("markdown lacks %q:\n%s", s, md.String())
		}
	}
	for _, s := range []string{"-- reference", "cheapest (small)", "0.000250", "not routers"} {
		if !strings.Contains(txt.String(), s) {
			t.Errorf("text lacks %q:\n%s", s, txt.String())
		}
	}
	lines, err := csv.NewReader(&cs).ReadAll() // every line as wide as the header
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{eval.RefOracle, "oracle", ColCost, "0.00025000", "0.00000000", "1", ""}; !slices.ContainsFunc(lines, func(l []string) bool { return slices.Equal(l, want) }) {
		t.Errorf("csv lacks the line %v:\n%s", want, cs.String())
	}
}

func TestSummarizeErrors(t *testing.T) {
	one := []Result{{Variant: "recal", Seed: 0, EM: map[string]float64{"nq": 0.5}}}
	cases := []struct {
		name     string
		datasets []string
		seeds    []int64
		want     string
	}{
		{"missing seed", []string{"nq"}, []int64{0, 1}, "no result for variant recal, seed 1"},
		{"missing dataset", []string{"nq", "popqa"}, []int64{0}, "no exact match on popqa"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Summarize(one, c.datasets, []string{"nq"}, c.seeds, []Variant{{Full, "ReCal"}})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one saying %q: a table must not average over what is missing", err, c.want)
			}
		})
	}
}

// One seed gives no ± (a deviation of one value is not 0, it is unknown);
// the columns without datasets (no in-domain one on --split ood) are left out.
func TestSummarizeOneSeed(t *testing.T) {
	tab, err := Summarize([]Result{{Variant: "recal", Seed: 7, EM: map[string]float64{"popqa": 0.25, "musique": 0.75}}},
		[]string{"popqa", "musique"}, []string{"nq", "hotpotqa"}, []int64{7}, []Variant{{Full, "ReCal"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"popqa", "musique", ColOutOfDomain, ColAverage, ColCost}; !slices.Equal(tab.Columns, want) {
		t.Fatalf("columns %v, want %v", tab.Columns, want)
	}
	if s := tab.Rows[0].Cells[ColAverage].String(); s != "0.500" {
		t.Errorf("one seed's cell %q, want \"0.500\" without ±", s)
	}
}

func ExampleMeanStd() {
	s := MeanStd([]float64{0.40, 0.44, 0.42})
	fmt.Println(s)
	fmt.Printf("%.4f %.4f %d\n", s.Mean, s.Std, s.N)
	fmt.Println(MeanStd([]float64{0.4}))
	// Output:
	// 0.420 ± 0.020
	// 0.4200 0.0200 3
	// 0.400
}
