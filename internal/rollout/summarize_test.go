package rollout

import (
	"math"
	"testing"
)

// Summarize's per-dataset means and their mean over datasets, by hand: the
// well-formed F1 scores each ill-formed response 0, whatever its answer;
// closed is the share of responses with any tag closed by the repeat rule.
func TestSummarize(t *testing.T) {
	res := []QuestionResult{
		{Dataset: "nq", EM: 1, F1: 1, WellFormed: true},
		{Dataset: "nq", EM: 0, F1: 0.5, WellFormed: false, Closed: 2},
		{Dataset: "hotpotqa", EM: 1, F1: 1, WellFormed: false},
		{Dataset: "hotpotqa", EM: 0, F1: 0.25, WellFormed: true},
		{Dataset: "hotpotqa", EM: 0, F1: 0, WellFormed: true, Closed: 1},
		{Dataset: "hotpotqa", EM: 1, F1: 1, WellFormed: true},
	}
	per, avg := Summarize(res)
	for _, c := range []struct {
		name             string
		got              Score
		f1, em, wf, f1wf float64
		closed           float64
		n                int
	}{
		{"nq", per["nq"], 0.75, 0.5, 0.5, 0.5, 0.5, 2},
		{"hotpotqa", per["hotpotqa"], 2.25 / 4, 0.5, 0.75, 1.25 / 4, 0.25, 4},
		{"mean over datasets", avg, (0.75 + 2.25/4) / 2, 0.5, (0.5 + 0.75) / 2, (0.5 + 1.25/4) / 2, (0.5 + 0.25) / 2, 6},
	} {
		g := c.got
		for _, v := range []struct {
			what      string
			got, want float64
		}{{"f1", g.F1, c.f1}, {"em", g.EM, c.em}, {"well_formed", g.WellFormed, c.wf}, {"f1_well_formed", g.F1WellFormed, c.f1wf}, {"closed", g.Closed, c.closed}} {
			if math.Abs(v.got-v.want) > 1e-12 {
				t.Errorf("%s: %s = %g, want %g", c.name, v.what, v.got, v.want)
			}
		}
		if g.N != c.n {
			t.Errorf("%s: n = %d, want %d", c.name, g.N, c.n)
		}
	}
}
