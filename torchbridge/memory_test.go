package torchbridge_test

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand"
	"strings"
	"testing"

	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/torchbridge"
)

// gradsAfter runs one Backward (or BackwardNLL when nll) of seqs on p and
// returns every parameter's gradient sum, then zeroes them.
func gradsAfter(t *testing.T, p *torchbridge.Policy, seqs []torchbridge.Sequence, opt torchbridge.LossOptions, nll bool) map[string][]float32 {
	t.Helper()
	ctx := context.Background()
	if nll {
		toks, masks := make([][]int32, len(seqs)), make([][]float32, len(seqs))
		for i, s := range seqs {
			toks[i], masks[i] = s.Tokens, s.Mask
		}
		if _, _, err := p.BackwardNLL(ctx, toks, masks, opt.Scale, opt.HeadChunk); err != nil {
			t.Fatal(err)
		}
	} else if _, err := p.Backward(ctx, seqs, opt); err != nil {
		t.Fatal(err)
	}
	out := map[string][]float32{}
	for _, pr := range p.Params() {
		out[pr.Name] = getF32(t, p, "grad/"+pr.Name, pr.Numel())
	}
	if err := p.ZeroGrad(ctx); err != nil {
		t.Fatal(err)
	}
	return out
}

// lossBatch is a batch of sequences of different lengths with advantages,
// rollout and reference log-probs: every term of the loss is exercised.
func lossBatch(t *testing.T, p *torchbridge.Policy, vocab int) []torchbridge.Sequence {
	t.Helper()
	r := rand.New(rand.NewSource(4))
	var seqs []torchbridge.Sequence
	for i, n := range []int{9, 14, 6, 11} {
		s := torchbridge.Sequence{Tokens: randomSeq(r, n, vocab), Mask: make([]float32, n), Advantage: float32(i) - 1.5}
		for j := 3; j < n; j++ {
			s.Mask[j] = 1
		}
		seqs = append(seqs, s)
	}
	toks := make([][]int32, len(seqs))
	for i := range seqs {
		toks[i] = seqs[i].Tokens
	}
	lp, _, err := p.Score(context.Background(), toks)
	if err != nil {
		t.Fatal(err)
	}
	for i := range seqs {
		seqs[i].OldLogp, seqs[i].RefLogp = make([]float32, len(lp[i])), make([]float32, len(lp[i]))
		for j := range lp[i] {
			seqs[i].OldLogp[j] = lp[i][j] + float32(r.NormFloat64()*0.2)
			seqs[i].RefLogp[j] = lp[i][j] + float32(r.NormFloat64()*0.3)
		}
	}
	return seqs
}

// maxDiff is the largest |a − b| over every parameter's gradient, and the
// largest |a|, for a relative reading.
func maxDiff(a, b map[string][]float32) (d, scale float64) {
	for k, av := range a {
		for i, x := range av {
			d = math.Max(d, math.Abs(float64(x-b[k][i])))
			scale = math.Max(scale, math.Abs(float64(x)))
		}
	}
	return d, scale
}

// Activation checkpointing recomputes each layer in the backward: the
// gradients must be the plain backward's (the recomputation repeats the
// forward's arithmetic), for the policy-gradient loss and the supervised
// one, float32 and bfloat16.
func TestCheckpointingGradients(t *testing.T) {
	for _, dtype := range []string{"float32", "bfloat16"} {
		for _, nll := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/nll=%v", dtype, nll), func(t *testing.T) {
				cfg := tinyConfig(97, false)
				p, err := torchbridge.NewPolicy(cfg, onDevice(torchbridge.Options{DType: dtype}))
				if err != nil {
					t.Fatal(err)
				}
				defer p.Close()
				if err := p.InitRandom(5, 0.3); err != nil {
					t.Fatal(err)
				}
				seqs := lossBatch(t, p, 97)
				opt := torchbridge.LossOptions{ClipEps: 0.2, KLCoef: 0.3, EntropyCoef: 0.05, Scale: 1.0 / 30, HeadChunk: 7}
				plain := gradsAfter(t, p, seqs, opt, nll)
				if err := p.SetCheckpointing(true); err != nil {
					t.Fatal(err)
				}
				ckpt := gradsAfter(t, p, seqs, opt, nll)
				if err := p.SetCheckpointing(false); err != nil {
					t.Fatal(err)
				}
				d, scale := maxDiff(plain, ckpt)
				if scale == 0 {
					t.Fatal("every gradient is zero: the test exercises nothing")
				}
				if d > 1e-6*scale {
					t.Errorf("checkpointed gradients differ from the plain backward's by up to %g (largest gradient %g); want float32 rounding at most", d, scale)
				}
				t.Logf("max |checkpointed − plain| = %g (largest gradient %g)", d, scale)
			})
		}
	}
}

// The output head runs over chunks of train.head_chunk tokens, so that no
// [tokens × vocabulary] logits (or their gradient) exist for a whole
// micro-batch. Every chunk size, one token to more than the batch holds
// (one chunk: today's unchunked head), gives the same log-probs, entropies
// and gradients within float32 rounding (the head's weight gradient sums
// the chunks in another grouping), and 0 takes the default.
func TestHeadChunks(t *testing.T) {
	cfg := tinyConfig(97, true)
	p, err := torchbridge.NewPolicy(cfg, onDevice(torchbridge.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.InitRandom(8, 0.3); err != nil {
		t.Fatal(err)
	}
	seqs := lossBatch(t, p, 97)
	tokens := 0
	for _, s := range seqs {
		tokens += len(s.Tokens)
	}
	ref := gradsAfter(t, p, seqs, torchbridge.LossOptions{ClipEps: 0.2, KLCoef: 0.3, EntropyCoef: 0.05, Scale: 1.0 / 30, HeadChunk: tokens + 100}, false)
	refNLL := gradsAfter(t, p, seqs, torchbridge.LossOptions{Scale: 1.0 / 30, HeadChunk: tokens + 100}, true)
	for _, chunk := range []int{1, 3, 7, tokens - 1, tokens, 0} {
		t.Run(fmt.Sprintf("chunk=%d", chunk), func(t *testing.T) {
			got := gradsAfter(t, p, seqs, torchbridge.LossOptions{ClipEps: 0.2, KLCoef: 0.3, EntropyCoef: 0.05, Scale: 1.0 / 30, HeadChunk: chunk}, false)
			if d, scale := maxDiff(ref, got); scale == 0 || d > 1e-5*scale {
				t.Errorf("policy-gradient loss, head chunk %d: gradients differ from one chunk's by up to %g (largest %g); want float32 rounding", chunk, d, scale)
			}
			got = gradsAfter(t, p, seqs, torchbridge.LossOptions{Scale: 1.0 / 30, HeadChunk: chunk}, true)
			if d, scale := maxDiff(refNLL, got); scale == 0 || d > 1e-5*scale {
				t.Errorf("supervised loss, head chunk %d: gradients differ from one chunk's by up to %g (largest %g); want float32 rounding", chunk, d, scale)
			}
		})
	}
}

// Sharding over one rank is no sharding; a rank or world outside range is
// refused, naming both.
func TestShardOptimizerSettings(t *testing.T) {
	ctx := context.Background()
	p, err := torchbridge.NewPolicy(tinyConfig(97, true), torchbridge.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, c := range [][2]int{{0, 0}, {-1, 2}, {2, 2}} {
		if err := p.ShardOptimizer(c[0], c[1]); err == nil {
			t.Errorf("ShardOptimizer(%d, %d) succeeded; want an error naming the rank and world", c[0], c[1])
		}
	}
	q, err := torchbridge.NewPolicy(tinyConfig(97, true), torchbridge.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	for _, x := range []*torchbridge.Policy{p, q} {
		if err := x.InitRandom(3, 0.2); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.ShardOptimizer(0, 1); err != nil {
		t.Fatal(err)
	}
	seqs := lossBatch(t, p, 97)
	for step := 0; step < 2; step++ {
		for _, x := range []*torchbridge.Policy{p, q} {
			if _, err := x.Backward(ctx, seqs, torchbridge.LossOptions{ClipEps: 0.2, Scale: 0.05}); err != nil {
				t.Fatal(err)
			}
			if _, err := x.Step(ctx, zeroAdam); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !bytesEqual(weights(t, p), weights(t, q)) {
		t.Error("a policy sharded over one rank trained other weights than an unsharded one")
	}
	dir := t.TempDir()
	if err := q.SaveOptimizer(dir + "/opt.safetensors"); err != nil {
		t.Errorf("saving the optimizer of a policy sharded over one rank: %v; want it whole, as unsharded", err)
	}
}

func bytesEqual(a, b []byte) bool { return string(a) == string(b) }

// PrepareUpdate makes the optimizer state before the first backward: the
// updates that follow are the unprepared policy's bit for bit (float32, and
// bfloat16 with its float32 master copy), over two micro-batches per step;
// a frozen policy is refused.
func TestPrepareUpdate(t *testing.T) {
	ctx := context.Background()
	for _, dtype := range []string{"float32", "bfloat16"} {
		t.Run(dtype, func(t *testing.T) {
			pols := make([]*torchbridge.Policy, 2)
			for i := range pols {
				p, err := torchbridge.NewPolicy(tinyConfig(97, true), onDevice(torchbridge.Options{DType: dtype}))
				if err != nil {
					t.Fatal(err)
				}
				defer p.Close()
				if err := p.InitRandom(5, 0.3); err != nil {
					t.Fatal(err)
				}
				pols[i] = p
			}
			if err := pols[1].PrepareUpdate(ctx); err != nil {
				t.Fatal(err)
			}
			adam := torchbridge.AdamW{LR: 3e-3, Beta1: 0.9, Beta2: 0.99, Eps: 1e-8, WeightDecay: 0.05, MaxGradNorm: 0.5}
			for step := 0; step < 3; step++ {
				seqs := lossBatch(t, pols[0], 97) // both policies hold the same weights here
				for _, p := range pols {
					for _, half := range [][]torchbridge.Sequence{seqs[:2], seqs[2:]} {
						if _, err := p.Backward(ctx, half, torchbridge.LossOptions{ClipEps: 0.2, KLCoef: 0.1, Scale: 1.0 / 30, HeadChunk: 5}); err != nil {
							t.Fatal(err)
						}
					}
					if _, err := p.Step(ctx, adam); err != nil {
						t.Fatal(err)
					}
				}
				if !bytes.Equal(weights(t, pols[0]), weights(t, pols[1])) {
					t.Fatalf("step %d: the prepared policy's weights differ from the unprepared one's", step)
				}
			}
			if err := pols[0].SetTrainable(false); err != nil {
				t.Fatal(err)
			}
			if err := pols[0].PrepareUpdate(ctx); err == nil || !strings.Contains(err.Error(), "frozen") {
				t.Fatalf("PrepareUpdate on a frozen policy: %v, want an error saying it is frozen", err)
			}
		})
	}
}

// A parameter above hfmodel.StepSlice elements (here a tied embedding of
// 140,000 × 32) is updated slice by slice: every parameter ends where
// AdamW's formula, computed here in float64 from the gradients and the
// weights before the step, puts it (clipped, with weight decay), to float32
// rounding, over two steps.
func TestStepSlices(t *testing.T) {
	const vocab = 140000
	if tinyConfig(vocab, true).HiddenSize*vocab <= hfmodel.StepSlice {
		t.Fatal("the embedding is not above StepSlice: the test would not slice")
	}
	ctx := context.Background()
	p, err := torchbridge.NewPolicy(tinyConfig(vocab, true), onDevice(torchbridge.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.InitRandom(3, 0.2); err != nil {
		t.Fatal(err)
	}
	adam := torchbridge.AdamW{LR: 1e-2, Beta1: 0.9, Beta2: 0.99, Eps: 1e-8, WeightDecay: 0.1, MaxGradNorm: 1e-3}
	r := rand.New(rand.NewSource(9))
	m, v := map[string][]float64{}, map[string][]float64{}
	for step := 1; step <= 2; step++ {
		seqs := []torchbridge.Sequence{{Tokens: randomSeq(r, 12, vocab), Mask: make([]float32, 12), Advantage: 1}}
		for j := 4; j < 12; j++ {
			seqs[0].Mask[j] = 1
		}
		if _, err := p.Backward(ctx, seqs, torchbridge.LossOptions{ClipEps: 0.2, Scale: 1}); err != nil {
			t.Fatal(err)
		}
		grads, before := map[string][]float32{}, map[string][]float32{}
		var norm float64
		for _, pr := range p.Params() {
			grads[pr.Name] = getF32(t, p, "grad/"+pr.Name, pr.Numel())
			before[pr.Name] = getF32(t, p, pr.Name, pr.Numel())
			for _, g := range grads[pr.Name] {
				norm += float64(g) * float64(g)
			}
		}
		norm = math.Sqrt(norm)
		if _, err := p.Step(ctx, adam); err != nil {
			t.Fatal(err)
		}
		coef := math.Min(1, adam.MaxGradNorm/(norm+1e-6))
		bc1, bc2 := 1-math.Pow(adam.Beta1, float64(step)), 1-math.Pow(adam.Beta2, float64(step))
		var worst float64
		for _, pr := range p.Params() {
			after := getF32(t, p, pr.Name, pr.Numel())
			if m[pr.Name] == nil {
				m[pr.Name], v[pr.Name] = make([]float64, pr.Numel()), make([]float64, pr.Numel())
			}
			for k, g32 := range grads[pr.Name] {
				g := float64(g32) * coef
				m[pr.Name][k] = adam.Beta1*m[pr.Name][k] + (1-adam.Beta1)*g
				v[pr.Name][k] = adam.Beta2*v[pr.Name][k] + (1-adam.Beta2)*g*g
				w := float64(before[pr.Name][k])*(1-adam.LR*adam.WeightDecay) - adam.LR/bc1*m[pr.Name][k]/(math.Sqrt(v[pr.Name][k])/math.Sqrt(bc2)+adam.Eps)
				worst = math.Max(worst, math.Abs(w-float64(after[k]))/(math.Abs(w)+1e-3))
			}
		}
		if worst > 1e-5 {
			t.Fatalf("step %d: a weight differs from AdamW's by %g (relative); want float32 rounding", step, worst)
		}
		t.Logf("step %d: largest relative difference to AdamW in float64: %g", step, worst)
	}
}
