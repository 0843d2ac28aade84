package main

import (
	"context"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/recal-project/recal/torchbridge"
)

// TestCopyCircuit initialises the tiny preset with and without
// --copy-circuit and measures, with libtorch's forward pass, how often the
// policy's most likely next token continues the repeat of a random span
// (probability above 1/2 makes it the argmax). The circuit is what lets the
// tiny policy copy a reply's answer; plain random weights copy nothing.
//
// The ambiguous case puts a decoy before the span: the span with every
// other token replaced, so half of the repeat's tokens follow a token that
// occurs twice, once followed by a different token. Only the circuit's
// recency bias makes the nearer occurrence (the span's) win; without it the
// match splits between the two and the probability stays near 1/2.
func TestCopyCircuit(t *testing.T) {
	type rate struct{ plain, ambiguous float64 }
	rates := map[bool]rate{}
	for _, circuit := range []bool{false, true} {
		dir := filepath.Join(t.TempDir(), "ck")
		args := []string{"--threads", "2", "policy", "init", "--preset", "tiny", "--tokenizer", "../../tokenizer/qwen2.5",
			"--out", dir, "--trim-corpus", "../../router", "--trim-corpus", "../../data/qa/bamboogle"}
		if circuit {
			args = append(args, "--copy-circuit")
		}
		if code, _, stderr := runCLI(t, args...); code != 0 {
			t.Fatalf("policy init: exit %d: %s", code, stderr)
		}
		p, err := torchbridge.LoadPolicy(dir, torchbridge.Options{})
		if err != nil {
			t.Fatal(err)
		}
		vocab := int(p.Config().VocabSize)
		rng := rand.New(rand.NewPCG(1, 2))
		token := func() int32 { return int32(300 + rng.IntN(vocab-400)) } // ordinary tokens: above the single bytes, below the added ones
		random := func(n int) []int32 {
			s := make([]int32, n)
			for i := range s {
				s[i] = token()
			}
			return s
		}
		var seqs [][]int32
		var masks [][]float32
		for c := range 32 {
			span := random(24)
			seq := random(40)
			if c%2 == 1 { // ambiguous: decoy, 20 random tokens, span, repeat
				decoy := append([]int32(nil), span...)
				for i := 1; i < len(decoy); i += 2 {
					decoy[i] = token()
				}
				seq = append(append(random(20), decoy...), random(20)...)
			}
			seq = append(append(seq, span...), span...)
			mask := make([]float32, len(seq))
			for k := len(seq) - len(span) + 1; k < len(seq); k++ {
				// plain: every token of the repeat but its first, which nothing
				// predicts; ambiguous: the ones the decoy continues differently
				if c%2 == 0 || (k-(len(seq)-len(span)))%2 == 1 {
					mask[k] = 1
				}
			}
			seqs, masks = append(seqs, seq), append(masks, mask)
		}
		logp, _, err := p.ScoreMasked(context.Background(), seqs, masks)
		p.Close()
		if err != nil {
			t.Fatal(err)
		}
		var hit, n [2]int
		for i := range logp {
			for k, m := range masks[i] {
				if m > 0 {
					n[i%2]++
					if logp[i][k] > float32(math.Log(0.5)) {
						hit[i%2]++
					}
				}
			}
		}
		rates[circuit] = rate{float64(hit[0]) / float64(n[0]), float64(hit[1]) / float64(n[1])}
	}
	t.Logf("repeat tokens predicted with p > 1/2: %.3f with the circuit, %.3f without; after a decoy: %.3f with the circuit",
		rates[true].plain, rates[false].plain, rates[true].ambiguous)
	if rates[true].plain < 0.9 || rates[false].plain > 0.05 {
		t.Errorf("copy rate %.3f with the circuit (want ≥ 0.9), %.3f without (want ≤ 0.05)", rates[true].plain, rates[false].plain)
	}
	if rates[true].ambiguous < 0.65 { // 0.73 with the recency bias, 0.47 without
		t.Errorf("copy rate after a decoy %.3f with the circuit, want ≥ 0.65 (the nearer occurrence wins)", rates[true].ambiguous)
	}
}
