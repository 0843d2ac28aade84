package torchbridge_test

import (
	"context"
	"math/rand"
	"slices"
	"strings"
	"testing"

	"github.com/recal-project/recal/torchbridge"
)

// A banned token is never chosen, greedy or sampled, and the reported
// log-probability stays the unbanned distribution's.
func TestExtendBan(t *testing.T) {
	ctx := context.Background()
	const vocab = 61
	p := newTiny(t, vocab, true, 9)
	r := rand.New(rand.NewSource(3))
	prompt := randomSeq(r, 6, vocab)
	var other int32 // row 1's choice in the last run
	run := func(s torchbridge.Sampling, ban []int32, seed uint64) (int32, float32, []float32) {
		c, err := p.NewCache(2, 32)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		st := torchbridge.Step{Rows: []int{0, 1}, Tokens: [][]int32{prompt, prompt}, Sampling: s, Seed: seed, WantLogp: true, WantLogits: true}
		if ban != nil {
			st.Ban = [][]int32{ban, nil} // row 1 is never banned: it shows the batch is per row
		}
		res, err := c.Extend(ctx, st)
		if err != nil {
			t.Fatal(err)
		}
		other = res.Next[1]
		return res.Next[0], res.Logp[0], res.Logits[0]
	}
	greedy := torchbridge.Sampling{}
	top, _, logits := run(greedy, nil, 1)
	second, lp, _ := run(greedy, []int32{top}, 1)
	if second == top {
		t.Fatalf("greedy chose the banned token %d", top)
	}
	if other != top {
		t.Fatalf("row 1, not banned, chose %d beside a banned row 0; want %d", other, top)
	}
	best := int32(-1)
	for i, v := range logits {
		if int32(i) != top && (best < 0 || v > logits[best]) {
			best = int32(i)
		}
	}
	if second != best {
		t.Fatalf("greedy with %d banned chose %d, want the runner-up %d", top, second, best)
	}
	if want := logSoftmaxAt(logits, second); abs(float64(lp)-want) > 1e-5 {
		t.Fatalf("logp %g, want the unbanned log-softmax %g", lp, want)
	}
	// Sampled: over many seeds the banned tokens never appear, and without
	// the ban they do.
	hot := []int32{top, second}
	seen := 0
	for seed := uint64(0); seed < 200; seed++ {
		s := torchbridge.Sampling{Temperature: 2}
		if tok, _, _ := run(s, hot, seed); slices.Contains(hot, tok) {
			t.Fatalf("seed %d: sampled banned token %d", seed, tok)
		}
		if tok, _, _ := run(s, nil, seed); slices.Contains(hot, tok) {
			seen++
		}
	}
	if seen == 0 {
		t.Fatal("the two likeliest tokens never came up unbanned: the test cannot tell a ban from chance")
	}
	// Bad input is an error, not a crash.
	c, err := p.NewCache(1, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, ban := range [][][]int32{{{vocab}}, {{-1}}, {{1}, {2}}} {
		_, err := c.Extend(ctx, torchbridge.Step{Rows: []int{0}, Tokens: [][]int32{{1}}, Ban: ban})
		if err == nil || !strings.Contains(err.Error(), "ban") {
			t.Errorf("ban %v: error %v, want one about the ban", ban, err)
		}
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}
