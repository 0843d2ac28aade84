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
func TestCopyCircuit(t *testing.T) {
	rates := map[bool]float64{}
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
		var seqs [][]int32
		var masks [][]float32
		for range 16 {
			span := make([]int32, 24)
			for i := range span {
				span[i] = int32(300 + rng.IntN(vocab-400)) // ordinary tokens: above the single bytes, below the added ones
			}
			seq := make([]int32, 40)
			for i := range seq {
				seq[i] = int32(300 + rng.IntN(vocab-400))
			}
			seq = append(append(seq, span...), span...)
			mask := make([]float32, len(seq))
			for k := len(seq) - len(span) + 1; k < len(seq); k++ {
				mask[k] = 1 // every token of the repeat but its first, which nothing predicts
			}
			seqs, masks = append(seqs, seq), append(masks, mask)
		}
		logp, _, err := p.ScoreMasked(context.Background(), seqs, masks)
		p.Close()
		if err != nil {
			t.Fatal(err)
		}
		hit, n := 0, 0
		for i := range logp {
			for k, m := range masks[i] {
				if m > 0 {
					n++
					if logp[i][k] > float32(math.Log(0.5)) {
						hit++
					}
				}
			}
		}
		rates[circuit] = float64(hit) / float64(n)
	}
	t.Logf("repeat tokens predicted with p > 1/2: %.3f with the circuit, %.3f without", rates[true], rates[false])
	if rates[true] < 0.9 || rates[false] > 0.05 {
		t.Errorf("copy rate %.3f with the circuit (want ≥ 0.9), %.3f without (want ≤ 0.05)", rates[true], rates[false])
	}
}
