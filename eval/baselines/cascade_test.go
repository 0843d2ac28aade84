package baselines

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
)

// cascadeMatrix: four questions, three models. "cheap" costs least and is
// right on q1 and q2; "dear" costs most and is right on all but q4; "waste"
// costs more than cheap and is right on none, so the chain skips it.
func cascadeMatrix() *Matrix {
	m := &Matrix{
		Models:    []string{"dear", "waste", "cheap"},
		Questions: []Question{{ID: "q1"}, {ID: "q2"}, {ID: "q3"}, {ID: "q4"}},
		Digest:    "sha256:test",
	}
	type cell struct {
		answer string
		em     float64
	}
	rows := [][3]cell{
		{{"Paris", 1}, {"Rome", 0}, {"Paris", 1}},
		{{"Jupiter", 1}, {"Mars", 0}, {"Jupiter", 1}},
		{{"Au", 1}, {"Ag", 0}, {"Fe", 0}},
		{{"Oslo", 0}, {"Bern", 0}, {"Bergen", 0}},
	}
	for _, r := range rows {
		var em, cost, f1 []float64
		var rep []string
		for j, c := range r {
			em, f1 = append(em, c.em), append(f1, c.em)
			cost = append(cost, []float64{10, 2, 1}[j])
			rep = append(rep, "The answer is "+c.answer+".")
		}
		m.EM, m.F1, m.Cost, m.Replies = append(m.EM, em), append(m.F1, f1), append(m.Cost, cost), append(m.Replies, rep)
		m.Failed = append(m.Failed, make([]bool, 3))
	}
	return m
}

func TestFitCascade(t *testing.T) {
	r, err := FitCascade(cascadeMatrix())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.Chain, []string{"cheap", "dear"}) {
		t.Fatalf("chain %v, want [cheap dear]: cheapest first, and waste (dearer than cheap, never right) left out", r.Chain)
	}
	// Stage 0: cheap right on 2 of 4, no earlier reply: (2+1)/(4+2).
	// Stage 1: dear's answer stated by cheap's reply on q1, q2 (both right):
	// (2+1)/(2+2); not stated on q3 (right), q4 (wrong): (1+1)/(2+2).
	want := [][]float64{{0.5}, {0.5, 0.75}}
	for k := range want {
		for s := range want[k] {
			if math.Abs(r.Score[k][s]-want[k][s]) > 1e-12 {
				t.Errorf("score[%d][%d] = %v, want %v (add-one smoothed rate of exact matches)", k, s, r.Score[k][s], want[k][s])
			}
		}
	}
	if !slices.Equal(r.N[1], []int{2, 2}) {
		t.Errorf("support counts %v, want [2 2]", r.N[1])
	}
	cases := []struct {
		k, support int
		t          float64
		want       bool
	}{
		{0, 0, 0, true},   // threshold 0: the cheapest model alone
		{0, 0, 0.5, true}, // its score reaches 0.5
		{0, 0, 0.51, false},
		{1, 0, 1, true}, // the last model always answers
		{0, 5, 0.4, true},
	}
	for _, c := range cases {
		if got := r.Stop(c.k, c.support, c.t); got != c.want {
			t.Errorf("Stop(%d, %d, %v) = %v, want %v", c.k, c.support, c.t, got, c.want)
		}
	}
	if th := r.Thresholds(); !slices.Equal(th, []float64{0, 0.5, 1}) {
		t.Errorf("thresholds %v, want [0 0.5 1]: 0, the scores of every stage but the last, then 1", th)
	}
	again, _ := FitCascade(cascadeMatrix())
	if again.Digest() != r.Digest() {
		t.Error("two fits of one matrix differ")
	}
}

func TestSupport(t *testing.T) {
	cases := []struct {
		reply   string
		earlier []string
		want    int
	}{
		{"The answer is Paris.", []string{"The answer is Paris.", "It is paris, France", "Parisian"}, 2},
		{"The answer is the Beatles.", []string{"Beatles!"}, 1},
		{"Paris", []string{"Most say the capital is Paris, in prose."}, 1},                         // a short reply is its own answer
		{"Most say the capital is Paris, in prose.", []string{"Paris", "The answer is Paris."}, 2}, // either way round
		{"Most say the capital is Paris, in prose.", []string{"It is Paris, as everyone agrees there."}, 0},
		{"", []string{"anything"}, 0},
		{"Ford", []string{"Affordable"}, 0},
		{"x", nil, 0},
	}
	for _, c := range cases {
		if got := Support(c.reply, c.earlier); got != c.want {
			t.Errorf("Support(%q, %q) = %d, want %d", c.reply, c.earlier, got, c.want)
		}
	}
}

func TestCascadeErrors(t *testing.T) {
	for _, th := range []float64{math.NaN(), -0.1, 1.5, math.Inf(1)} {
		err := CheckThreshold("--cascade-threshold", th)
		if !errors.Is(err, ErrThreshold) || !strings.Contains(err.Error(), "--cascade-threshold") {
			t.Errorf("threshold %v: error %v, want ErrThreshold naming the flag", th, err)
		}
	}
	for _, th := range []float64{0, 0.5, 1} {
		if err := CheckThreshold("k", th); err != nil {
			t.Errorf("threshold %v: %v", th, err)
		}
	}
	m := cascadeMatrix()
	m.Replies = nil
	if _, err := FitCascade(m); err == nil || !strings.Contains(err.Error(), "no replies") {
		t.Errorf("a matrix without replies: error %v", err)
	}
	if _, err := FitCascade(&Matrix{}); !errors.Is(err, ErrNoOutcomes) {
		t.Errorf("an empty matrix: error %v, want ErrNoOutcomes", err)
	}
}
