package torchbridge_test

import (
	"context"
	"math"
	"math/rand"
	"path/filepath"
	"slices"
	"testing"

	"github.com/recal-project/recal/torchbridge"
)

// newTinyDType is newTiny in a given dtype.
func newTinyDType(t *testing.T, dtype string, vocab int64, tied bool, seed uint64) *torchbridge.Policy {
	t.Helper()
	p, err := torchbridge.NewPolicy(tinyConfig(vocab, tied), onDevice(torchbridge.Options{DType: dtype}))
	if err != nil {
		t.Fatalf("NewPolicy: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	if err := p.InitRandom(seed, 0.2); err != nil {
		t.Fatalf("InitRandom: %v", err)
	}
	return p
}

// grads reads every accumulated gradient as float32.
func grads(t *testing.T, p *torchbridge.Policy) map[string][]float32 {
	t.Helper()
	out := map[string][]float32{}
	for _, pr := range p.Params() {
		out[pr.Name] = getF32(t, p, "grad/"+pr.Name, pr.Numel())
	}
	return out
}

// With a bfloat16 policy, gradients of several micro-batches accumulate in
// float32: the accumulated gradient is the float32 sum of the micro-batches'
// own gradients. Accumulating in bfloat16 rounds every partial sum to 8 bits
// of mantissa (relative error ~2⁻⁹ per addition, and small late
// contributions vanish entirely), far outside this test's 1e-5.
func TestBF16GradientsAccumulateInFloat32(t *testing.T) {
	ctx := context.Background()
	const vocab = 61
	cases := []struct {
		name   string
		scales []float64 // one micro-batch per entry: its loss scale
	}{
		{"16 equal micro-batches", []float64{1. / 16, 1. / 16, 1. / 16, 1. / 16, 1. / 16, 1. / 16, 1. / 16, 1. / 16,
			1. / 16, 1. / 16, 1. / 16, 1. / 16, 1. / 16, 1. / 16, 1. / 16, 1. / 16}},
		{"one large then small micro-batches", []float64{1, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newTinyDType(t, "bfloat16", vocab, true, 5)
			r := rand.New(rand.NewSource(8))
			type micro struct {
				seqs  [][]int32
				masks [][]float32
			}
			mbs := make([]micro, len(c.scales))
			for k := range mbs {
				for i := 0; i < 2; i++ {
					n := 10 + r.Intn(8)
					m := make([]float32, n)
					for j := 2; j < n; j++ {
						m[j] = 1
					}
					mbs[k].seqs = append(mbs[k].seqs, randomSeq(r, n, vocab))
					mbs[k].masks = append(mbs[k].masks, m)
				}
			}
			// Reference: each micro-batch's gradient alone, summed in float64.
			want := map[string][]float64{}
			for k, mb := range mbs {
				if err := p.ZeroGrad(ctx); err != nil {
					t.Fatal(err)
				}
				if _, _, err := p.BackwardNLL(ctx, mb.seqs, mb.masks, c.scales[k], 0); err != nil {
					t.Fatal(err)
				}
				for name, g := range grads(t, p) {
					if want[name] == nil {
						want[name] = make([]float64, len(g))
					}
					for i, v := range g {
						want[name][i] += float64(v)
					}
				}
			}
			// The same micro-batches accumulated by the bridge.
			if err := p.ZeroGrad(ctx); err != nil {
				t.Fatal(err)
			}
			for k, mb := range mbs {
				if _, _, err := p.BackwardNLL(ctx, mb.seqs, mb.masks, c.scales[k], 0); err != nil {
					t.Fatal(err)
				}
			}
			got := grads(t, p)
			for _, pr := range p.Params() {
				var diff, norm float64
				for i, v := range got[pr.Name] {
					d := float64(v) - want[pr.Name][i]
					diff += d * d
					norm += want[pr.Name][i] * want[pr.Name][i]
				}
				if norm == 0 {
					t.Fatalf("%s: zero reference gradient; the test would prove nothing", pr.Name)
				}
				if rel := math.Sqrt(diff / norm); rel > 1e-5 {
					t.Errorf("%s: accumulated gradient differs from the float32 sum of the micro-batches' gradients by %.2e (relative L2), want ≤ 1e-5: micro-batches must accumulate in float32, not bfloat16",
						pr.Name, rel)
				}
			}
		})
	}
}

// nllBatch is a fixed supervised batch over vocab.
func nllBatch(seed int64, vocab int) ([][]int32, [][]float32) {
	r := rand.New(rand.NewSource(seed))
	var seqs [][]int32
	var masks [][]float32
	for _, n := range []int{14, 11} {
		seqs = append(seqs, randomSeq(r, n, vocab))
		m := make([]float32, n)
		for j := 2; j < n; j++ {
			m[j] = 1
		}
		masks = append(masks, m)
	}
	return seqs, masks
}

// nllUpdate takes one AdamW step on the NLL of a batch.
func nllUpdate(t *testing.T, p *torchbridge.Policy, seqs [][]int32, masks [][]float32, opt torchbridge.AdamW) {
	t.Helper()
	ctx := context.Background()
	if _, _, err := p.BackwardNLL(ctx, seqs, masks, 1.0/21, 0); err != nil {
		t.Fatal(err)
	}
	gn, err := p.Step(ctx, opt)
	if err != nil || torchbridge.Skipped(gn) {
		t.Fatalf("step: norm %v, %v", gn, err)
	}
}

// After a warm-up, ResetOptimizer leaves the state of a fresh optimizer:
// step 0, zero moments, and the next update is exactly the update a new
// policy loaded from the same weights takes on the same gradient. Without
// the reset the warm-up's moments change that update.
func TestResetOptimizer(t *testing.T) {
	ctx := context.Background()
	const vocab = 43
	opt := torchbridge.AdamW{LR: 1e-2, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, MaxGradNorm: 1}
	sftSeqs, sftMasks := nllBatch(1, vocab)
	rlSeqs, rlMasks := nllBatch(2, vocab)
	warm := func() *torchbridge.Policy { // the same warm-up, three updates
		p := newTiny(t, vocab, true, 13)
		for i := 0; i < 3; i++ {
			nllUpdate(t, p, sftSeqs, sftMasks, opt)
		}
		return p
	}
	reset, kept := warm(), warm()
	if err := reset.ResetOptimizer(ctx); err != nil {
		t.Fatal(err)
	}
	if s, err := reset.OptimizerStep(ctx); err != nil || s != 0 {
		t.Fatalf("optimizer step after reset %d (%v), want 0", s, err)
	}
	if s, err := kept.OptimizerStep(ctx); err != nil || s != 3 {
		t.Fatalf("optimizer step without reset %d (%v), want 3 (the warm-up's updates)", s, err)
	}
	for _, pr := range reset.Params() {
		for _, k := range []string{"exp_avg/", "exp_avg_sq/"} {
			for i, v := range getF32(t, reset, k+pr.Name, pr.Numel()) {
				if v != 0 {
					t.Fatalf("%s%s[%d] = %v after reset, want 0", k, pr.Name, i, v)
				}
			}
		}
	}
	// A fresh policy (a separate RL job) from the warmed-up weights.
	dir := filepath.Join(t.TempDir(), "sft")
	if err := reset.Save(dir); err != nil {
		t.Fatal(err)
	}
	fresh, err := torchbridge.LoadPolicy(dir, onDevice(torchbridge.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	for _, p := range []*torchbridge.Policy{reset, kept, fresh} {
		nllUpdate(t, p, rlSeqs, rlMasks, opt)
	}
	differs := false
	for _, pr := range fresh.Params() {
		want := getF32(t, fresh, pr.Name, pr.Numel())
		got := getF32(t, reset, pr.Name, pr.Numel())
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%s[%d] = %v after the first update from a reset optimizer, %v from a fresh one: the warm-up's state leaked into GRPO",
					pr.Name, i, got[i], want[i])
			}
		}
		k := getF32(t, kept, pr.Name, pr.Numel())
		for i := range want {
			differs = differs || k[i] != want[i]
		}
	}
	if !differs {
		t.Fatal("the update with the warm-up's moments equals the fresh one: the test cannot tell a reset from none")
	}
}

// A non-finite gradient skips the update: Step reports it through a
// non-finite norm (Skipped), weights and optimizer state stay as they were,
// and the gradients are dropped so the next update starts clean.
func TestStepSkipsNonFiniteGradient(t *testing.T) {
	ctx := context.Background()
	const vocab = 43
	p := newTiny(t, vocab, true, 17)
	opt := torchbridge.AdamW{LR: 1e-2, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, MaxGradNorm: 1}
	seqs, masks := nllBatch(3, vocab)
	nllUpdate(t, p, seqs, masks, opt)
	before := map[string][]float32{}
	for _, pr := range p.Params() {
		before[pr.Name] = getF32(t, p, pr.Name, pr.Numel())
	}
	const norm = "model.norm.weight"
	w := slices.Clone(before[norm])
	w[3] = float32(math.Inf(1))
	setF32(t, p, norm, w)
	if _, _, err := p.BackwardNLL(ctx, seqs, masks, 1.0/21, 0); err != nil {
		t.Fatal(err)
	}
	gn, err := p.Step(ctx, opt)
	if err != nil {
		t.Fatal(err)
	}
	if !torchbridge.Skipped(gn) {
		t.Fatalf("grad norm %v with an infinite weight, want a non-finite norm reporting the skipped update", gn)
	}
	if s, _ := p.OptimizerStep(ctx); s != 1 {
		t.Errorf("optimizer step %d after a skipped update, want 1 (unchanged)", s)
	}
	for _, pr := range p.Params() {
		if pr.Name == norm {
			continue
		}
		for i, v := range getF32(t, p, pr.Name, pr.Numel()) {
			if v != before[pr.Name][i] {
				t.Fatalf("%s[%d] changed by a skipped update", pr.Name, i)
			}
		}
		for i, v := range getF32(t, p, "grad/"+pr.Name, pr.Numel()) {
			if v != 0 {
				t.Fatalf("grad/%s[%d] = %v after a skipped update, want the gradients dropped", pr.Name, i, v)
			}
		}
	}
	setF32(t, p, norm, before[norm])
	nllUpdate(t, p, seqs, masks, opt)
	if s, _ := p.OptimizerStep(ctx); s != 2 {
		t.Errorf("optimizer step %d after a finite update, want 2", s)
	}
}
