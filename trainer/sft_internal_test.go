package trainer

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/recal-project/recal/router"
)

// demoAnswer: the golden answer a reply contains, else the answer it
// states, else nothing (a demonstration then ends after the reply).
func TestDemoAnswer(t *testing.T) {
	golden := []string{"beneath the liver", "under the liver"}
	for _, c := range []struct {
		reply           string
		answer          string
		correct, stated bool
	}{
		{"The answer is beneath the liver.", "beneath the liver", true, true},
		{"[simulated sim-a] The answer is Lyon.", "Lyon", false, true},
		{"I think the answer is: a small organ near the stomach, on the right side of it.", ": a small organ near the stomach, on", false, true},
		{"The gallbladder sits in a fossa of the visceral surface.", "", false, false},
		{"[pool error: model gpt4 unavailable]", "", false, false},
		{"", "", false, false},
	} {
		a, correct, stated := demoAnswer(c.reply, golden)
		if a != c.answer || correct != c.correct || stated != c.stated {
			t.Errorf("demoAnswer(%q) = %q, %v, %v; want %q, %v, %v", c.reply, a, correct, stated, c.answer, c.correct, c.stated)
		}
	}
}

// budgetCut: the share of questions asked, cut after the first reply or
// (with more than two calls) the second, the next call refused.
func TestBudgetCut(t *testing.T) {
	three := []router.Call{{Model: "a", Reply: "The answer is x."}, {Model: "b", Reply: "The answer is y."}, {Model: "c", Reply: "The answer is z."}}
	for _, share := range []float64{0, 0.3, 1} {
		cut, at := 0, map[int]int{}
		const n = 2000
		for q := range n {
			got := budgetCut(three, fmt.Sprintf("nq-%d", q), DemoOptions{Seed: 5, BudgetShare: share})
			if slices.Equal(got, three) {
				continue
			}
			cut++
			k := len(got) - 1
			last := got[k]
			if k < 1 || k > 2 || !slices.Equal(got[:k], three[:k]) || last.Model != three[k].Model || !last.Refused || !last.Failed || last.Reply != router.BudgetText || last.Cost != 0 {
				t.Fatalf("share %g, question %d: %+v, want the first 1 or 2 calls then %q's refused", share, q, got, "b or c")
			}
			at[k]++
		}
		if got := float64(cut) / n; math.Abs(got-share) > 0.04 {
			t.Errorf("share %g: %d of %d cut (%.3f)", share, cut, n, got)
		}
		if share > 0 && (at[1] < cut/3 || at[2] < cut/3) {
			t.Errorf("share %g: cut after the first reply %d times, after the second %d: want both about half", share, at[1], at[2])
		}
	}
	two := three[:2]
	if got := budgetCut(two, "nq-1", DemoOptions{BudgetShare: 1}); len(got) != 2 || !got[1].Refused || got[0] != two[0] {
		t.Errorf("two calls, share 1: %+v, want the first then the second refused", got)
	}
	if got := budgetCut(three[:1], "nq-1", DemoOptions{BudgetShare: 1}); len(got) != 1 || got[0] != three[0] {
		t.Errorf("one call: %+v, want it unchanged (nothing to answer from after a refusal)", got)
	}
}
