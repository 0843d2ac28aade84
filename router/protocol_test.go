package router

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

func TestParseAction(t *testing.T) {
	long := strings.Repeat("é", 30000) // 60,000 bytes
	cases := []struct {
		name string
		text string
		want Action
	}{
		{"search", "<think>x</think><search>GPT-4o: who wrote Hamlet?</search>", Action{Kind: Search, Model: "GPT-4o", Query: "who wrote Hamlet?"}},
		{"query keeps later colons", "<search> m : a: b </search>", Action{Kind: Search, Model: "m", Query: "a: b"}},
		{"answer", "<think>t</think><answer> Paris </answer>", Action{Kind: Answer, Answer: "Paris"}},
		{"first of the two wins", "<answer>A</answer><search>m: q</search>", Action{Kind: Answer, Answer: "A"}},
		{"search before answer", "<search>m: q</search><answer>A</answer>", Action{Kind: Search, Model: "m", Query: "q"}},
		{"unclosed search", "<think>x</think><search>m: q", Action{Kind: NoAction}},
		{"unclosed search, closed answer", "<search>m: q <answer>A</answer>", Action{Kind: Answer, Answer: "A"}},
		{"nested opens take the innermost", "<search>a<search>m: q</search>", Action{Kind: Search, Model: "m", Query: "q"}},
		{"no colon", "<search>just text</search>", Action{Kind: Search, Model: "just text"}},
		{"nothing", "hello", Action{Kind: NoAction}},
		{"invalid utf-8", "<answer>\xff\xfeok</answer>", Action{Kind: Answer, Answer: "\uFFFDok"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := ParseAction(c.text); got != c.want {
				t.Errorf("ParseAction(%q) = %+v, want %+v", c.text, got, c.want)
			}
		})
	}
	a := ParseAction("<search>m: " + long + "</search>")
	if len(a.Query) > MaxQueryBytes || !strings.HasPrefix(long, a.Query) || len(a.Query) < MaxQueryBytes-4 {
		t.Errorf("a 60,000-byte query came back with %d bytes; want it cut to at most %d at a rune boundary", len(a.Query), MaxQueryBytes)
	}
}

func TestWellFormed(t *testing.T) {
	known := func(m string) bool { return strings.EqualFold(m, "llama") || strings.EqualFold(m, "qwen") }
	cases := []struct {
		text string
		want bool
	}{
		{"<think>a</think><answer>b</answer>", true},
		{"  <think>a</think>\n<search>Llama: q</search>\n\n<information>r</information>\n\n<think>b</think><answer>c</answer>\n", true},
		{"<think>a</think><search>llama: q</search><information>r</information><search>qwen: q2</search><information>s</information><answer>c</answer>", true},
		{"<answer>b</answer>", false},                                                                      // no think first
		{"<think>a</think><answer>b</answer> trailing", false},                                             // answer not at the end
		{"<think>a</think><answer>b</answer><answer>c</answer>", false},                                    // two answers
		{"<think>a<think>b</think></think><answer>c</answer>", false},                                      // nested
		{"<think>a</search><answer>c</answer>", false},                                                     // unbalanced
		{"<think>a</think><search>llama: q</search><answer>c</answer>", false},                             // search without information
		{"<think>a</think><search>gpt: q</search><information>r</information><answer>c</answer>", false},   // unknown model
		{"<think>a</think><search>llama:  </search><information>r</information><answer>c</answer>", false}, // empty query
		{"<think>a</think><search>llama q</search><information>r</information><answer>c</answer>", false},  // no colon
		{"<think>a</think><information>self-written</information><answer>c</answer>", false},               // info without search
		{"<think>a", false},
		{"", false},
	}
	for _, c := range cases {
		if got := WellFormed(c.text, known); got != c.want {
			t.Errorf("WellFormed(%q) = %v, want %v", c.text, got, c.want)
		}
	}
}

func TestRouteReward(t *testing.T) {
	cases := []struct {
		k, max int
		want   float64
	}{{0, 3, 0}, {1, 3, 1}, {2, 3, 2.0 / 3}, {3, 3, 1.0 / 3}, {1, 0, 0}}
	for _, c := range cases {
		if got := RouteReward(c.k, c.max); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("RouteReward(%d, %d) = %v, want %v", c.k, c.max, got, c.want)
		}
	}
}

func TestBalance(t *testing.T) {
	b := NewBalance(0.9, []string{"A", "B"})
	// No counts yet: uniform shares, so each call earns 1 − 1/2.
	if got := b.Reward([]string{"a"}); got != 0.5 {
		t.Errorf("first reward %v, want 0.5 from uniform shares", got)
	}
	b.Update([]string{"a", "a", "b"}) // counts: a 2, b 1
	b.Update([]string{"a"})           // a 0.9·2+1 = 2.8, b 0.9
	if math.Abs(b.Counts["a"]-2.8) > 1e-12 || math.Abs(b.Counts["b"]-0.9) > 1e-12 {
		t.Fatalf("counts %v, want a 2.8 b 0.9", b.Counts)
	}
	pa := 2.8 / 3.7
	want := ((1 - pa) + (1 - (1 - pa))) / 2 // one call to a, one to b
	if got := b.Reward([]string{"A", "b"}); math.Abs(got-want) > 1e-12 {
		t.Errorf("reward %v, want %v", got, want)
	}
	if b.Reward(nil) != 0 {
		t.Error("no calls must earn 0")
	}
}

func TestScore(t *testing.T) {
	known := func(m string) bool { return m == "m" }
	bal := NewBalance(0.9, []string{"m", "n"})
	golden := []string{"William Shakespeare"}
	text := "<think>t</think><search>m: q</search>\n\n<information>It was William Shakespeare.</information>\n\n<answer>Shakespeare</answer>"
	s := &Sample{Text: text, End: "answer", Calls: []Call{{Model: "m", Query: "q", Reply: "It was William Shakespeare.", Cost: 0.001}}}
	r := Score(s, golden, 3, 0.002, known, bal)
	// ans: F1 of "shakespeare" vs "william shakespeare" = 2·(1·0.5)/(1.5) = 2/3.
	// info: "it was william shakespeare" vs golden: p = 2/4, r = 1 → 2/3.
	// cost: 1 − 0.001/(3 · 0.002) = 5/6.
	want := Rewards{Ans: 2.0 / 3, Info: 2.0 / 3, Format: 1, Route: 1, Balance: 0.5, Cost: 5.0 / 6, EM: 0}
	for _, m := range Components {
		if math.Abs(r.Get(m)-want.Get(m)) > 1e-9 {
			t.Errorf("%s = %v, want %v", m, r.Get(m), want.Get(m))
		}
	}
	if r.EM != 0 {
		t.Errorf("EM %v, want 0", r.EM)
	}
	none := Score(&Sample{Text: "<think>t</think>no answer", End: "length"}, []string{"x"}, 3, 0.002, known, bal)
	if none != (Rewards{Cost: 1}) {
		t.Errorf("a response without answer or calls scored %+v, want all zero but cost 1 (it spent nothing; gating zeroes it)", none)
	}
}

// CostReward is 1 − spend/(T · dearest) clipped to [0, 1], and 1 when
// T · dearest is 0 (docs/method.md §4.6); Score sums the calls' costs
// (a failed or unknown call costs 0) into spend.
func TestCostReward(t *testing.T) {
	cases := []struct {
		name           string
		spend, dearest float64
		turns          int
		want           float64
	}{
		{"no call", 0, 0.004, 3, 1},
		{"one dearest call of three", 0.004, 0.004, 3, 1 - 1.0/3},
		{"three dearest calls", 0.012, 0.004, 3, 0},
		{"a cheap call", 0.0003, 0.004, 3, 1 - 0.0003/0.012},
		{"more than T dearest calls: clipped", 0.02, 0.004, 3, 0},
		{"every price 0", 0, 0, 3, 1},
		{"a spend though the pool quotes 0", 0.001, 0, 3, 1},
		{"no call allowed", 0, 0.004, 0, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := CostReward(c.spend, c.turns, c.dearest); math.Abs(got-c.want) > 1e-15 {
				t.Errorf("CostReward(%v, %d, %v) = %v, want %v", c.spend, c.turns, c.dearest, got, c.want)
			}
		})
	}
	known := func(m string) bool { return m == "m" }
	s := &Sample{Text: "<think>t</think><answer>x</answer>", End: "answer", Calls: []Call{
		{Model: "m", Cost: 0.001}, {Model: "m", Failed: true}, {Model: "z", Unknown: true, Failed: true}, {Model: "m", Cost: 0.002}}}
	if got, want := Score(s, []string{"x"}, 3, 0.004, known, NewBalance(0.9, []string{"m"})).Cost, 1-0.003/0.012; math.Abs(got-want) > 1e-15 {
		t.Errorf("Score's cost = %v, want %v: the spend is the sum of the calls' costs", got, want)
	}
}

// The information reward pays only for replies the pool returned; text the
// policy wrote, failure messages and unknown-model messages earn nothing.
func TestScoreInfoFromCalls(t *testing.T) {
	known := func(m string) bool { return m == "m" }
	golden := []string{"Paris"}
	cases := []struct {
		name       string
		s          Sample
		info, form float64
	}{
		{"a real reply holding the answer earns it",
			Sample{Text: "<think>t</think><search>m: q</search><information>Paris</information><answer>Paris</answer>", End: "answer",
				Calls: []Call{{Model: "m", Query: "q", Reply: "Paris"}}},
			1, 1},
		{"a block written by the policy, no call",
			Sample{Text: "<think>t</think><information>Paris</information><answer>Paris</answer>", End: "answer"},
			0, 0},
		{"a faked block beside a real reply that lacks the answer",
			Sample{Text: "<think>t</think><search>m: q</search><information>no idea</information><information>Paris</information><answer>Paris</answer>", End: "answer",
				Calls: []Call{{Model: "m", Query: "q", Reply: "no idea"}}},
			0, 0},
		{"a failed call's text",
			Sample{Text: "<think>t</think><search>m: Paris</search><information>Paris</information><answer>Paris</answer>", End: "answer",
				Calls: []Call{{Model: "m", Query: "Paris", Reply: "Paris", Failed: true}}},
			0, 1},
		{"an unknown model's message, which quotes the name the policy wrote",
			Sample{Text: "<think>t</think><search>Paris: q</search><information>[router: unknown model \"Paris\"]</information><answer>Paris</answer>", End: "answer",
				Calls: []Call{{Model: "Paris", Query: "q", Reply: `[router: unknown model "Paris"]`, Failed: true, Unknown: true}}},
			0, 0},
		{"a response the rollout ended at a policy-written <information>",
			Sample{Text: "<think>t</think><search>m: q</search><information>Paris</information><answer>Paris</answer>", End: "information",
				Calls: []Call{{Model: "m", Query: "q", Reply: "Paris"}}},
			1, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := Score(&c.s, golden, 3, 0, known, NewBalance(0.9, []string{"m"}))
			if r.Info != c.info || r.Format != c.form {
				t.Errorf("info %v, format %v; want info %v (only the pool's replies pay) and format %v", r.Info, r.Format, c.info, c.form)
			}
		})
	}
}

// TestBalanceShareRepeats checks that a share is the same number every time:
// summing the counts in Go's random map order changed its last bit between
// runs, and with it a whole training run.
func TestBalanceShareRepeats(t *testing.T) {
	b := NewBalance(0.9, nil)
	for i := range 12 {
		b.Counts[fmt.Sprintf("m%d", i)] = 0.1 * float64(i+1) / 3
	}
	want := b.Share("m3")
	for range 200 {
		if got := b.Share("m3"); got != want {
			t.Fatalf("share %v, then %v", want, got)
		}
	}
}

func TestLastAnswer(t *testing.T) {
	for _, c := range []struct {
		text, want string
		ok         bool
	}{
		{"<think>t</think><answer> Paris </answer>", "Paris", true},
		{"<answer>A</answer> then <answer>B</answer>", "B", true},
		{"<answer>A</answer></answer>", "A", true}, // a repeated close is not part of the answer
		{"<answer></answer></answer>", "", true},
		{"<answer><answer>A</answer>", "A", true},
		{"<answer>A</answer><answer>B", "A", true}, // the last complete element
		{"<answer>A", "", false},
		{"A</answer>", "", false},
	} {
		got, ok := LastAnswer(c.text)
		if got != c.want || ok != c.ok {
			t.Errorf("LastAnswer(%q) = %q, %v; want %q, %v (the inside of the last complete <answer> element)", c.text, got, ok, c.want, c.ok)
		}
	}
}
