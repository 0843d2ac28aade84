package torchbridge_test

import (
	"context"
	"math"
	"math/rand"
	"testing"

	"github.com/recal-project/recal/torchbridge"
)

// The fused layout (KernelFusedProj) keeps training exactly as it was: the
// loss's forward and backward run on the parameters (views of the fused
// tensors) with the same arithmetic, so gradients and an optimizer step are
// the same bits as a policy without it; what a checkpoint writes and reads
// is each parameter alone. Inference passes run the fused products: their
// log-probs agree with the separate products' within each dtype's rounding,
// and turning the choice off gives the separate products' bits again.
func TestFusedLayout(t *testing.T) {
	ctx := context.Background()
	unfused := torchbridge.KernelsDefault &^ torchbridge.KernelFusedProj
	for _, tc := range []struct {
		dtype string
		// inference log-probs, fused against separate products: the BLAS
		// blocks one wide product otherwise than three narrow ones, so the
		// rounding differs by kernel (float32: 1.05e-5 under OpenBLAS's
		// Haswell kernel, log-probs of magnitude ~10); a wrongly laid-out
		// fusion moves them by whole units
		tol float64
	}{{"float32", 1e-4}, {"bfloat16", 0.1}} {
		t.Run(tc.dtype, func(t *testing.T) {
			cfg := deviceConfig()
			vocab := int(cfg.VocabSize)
			plain, err := torchbridge.NewPolicy(cfg, onDevice(torchbridge.Options{DType: tc.dtype}))
			if err != nil {
				t.Fatal(err)
			}
			defer plain.Close()
			fused, err := torchbridge.NewPolicy(cfg, onDevice(torchbridge.Options{DType: tc.dtype}))
			if err != nil {
				t.Fatal(err)
			}
			defer fused.Close()
			if err := plain.SetKernels(unfused); err != nil {
				t.Fatal(err)
			}
			if err := fused.SetKernels(torchbridge.KernelsDefault); err != nil { // makes the layout on the CPU
				t.Fatal(err)
			}
			if err := fused.SetKernels(torchbridge.Kernels(64)); err == nil {
				t.Error("SetKernels(64): no error for an unknown flag")
			}
			for _, p := range []*torchbridge.Policy{plain, fused} {
				if err := p.InitRandom(9, 0.2); err != nil { // written into the views
					t.Fatal(err)
				}
			}
			seqs := lossBatch(t, plain, vocab)
			opt := torchbridge.LossOptions{ClipEps: 0.2, KLCoef: 0.3, EntropyCoef: 0.05, Scale: 1.0 / 30, HeadChunk: 7}
			for _, ckpt := range []bool{false, true} {
				for _, p := range []*torchbridge.Policy{plain, fused} {
					if err := p.SetCheckpointing(ckpt); err != nil {
						t.Fatal(err)
					}
				}
				a, b := gradsAfter(t, plain, seqs, opt, false), gradsAfter(t, fused, seqs, opt, false)
				if d, scale := maxDiff(a, b); scale == 0 || d != 0 {
					t.Errorf("checkpointing %v: gradients with the fused layout differ by %g (largest %g); want the same bits", ckpt, d, scale)
				}
			}
			// One optimizer step, updating the views in place.
			adam := torchbridge.AdamW{LR: 1e-2, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, MaxGradNorm: 1}
			for _, p := range []*torchbridge.Policy{plain, fused} {
				if _, err := p.Backward(ctx, seqs, opt); err != nil {
					t.Fatal(err)
				}
				if _, err := p.Step(ctx, adam); err != nil {
					t.Fatal(err)
				}
			}
			for _, pr := range plain.Params() {
				a, b := getF32(t, plain, pr.Name, pr.Numel()), getF32(t, fused, pr.Name, pr.Numel())
				for i := range a {
					if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
						t.Fatalf("%s[%d] after a step: %g with the fused layout, %g without", pr.Name, i, b[i], a[i])
					}
				}
			}
			// Inference: scoring, fused products against separate ones.
			r := rand.New(rand.NewSource(2))
			toks := [][]int32{randomSeq(r, 23, vocab), randomSeq(r, 40, vocab), randomSeq(r, 7, vocab)}
			want, _, err := plain.Score(ctx, toks)
			if err != nil {
				t.Fatal(err)
			}
			got, _, err := fused.Score(ctx, toks)
			if err != nil {
				t.Fatal(err)
			}
			var worst float64
			for i := range want {
				for j := range want[i] {
					worst = math.Max(worst, math.Abs(float64(got[i][j]-want[i][j])))
				}
			}
			t.Logf("scoring: fused products within %.3g of separate ones", worst)
			if worst > tc.tol {
				t.Errorf("scoring: fused products differ from separate ones by %.3g, tolerance %g", worst, tc.tol)
			}
			if err := fused.SetKernels(unfused); err != nil {
				t.Fatal(err)
			}
			again, _, err := fused.Score(ctx, toks)
			if err != nil {
				t.Fatal(err)
			}
			for i := range want {
				for j := range want[i] {
					if math.Float32bits(again[i][j]) != math.Float32bits(want[i][j]) {
						t.Fatalf("scoring with fused products off: row %d token %d: %g, want %g (the separate products' bits)", i, j, again[i][j], want[i][j])
					}
				}
			}
			// Decoding (the libtorch path: bfloat16, or a GPU), greedy, fused
			// against separate products.
			if err := fused.SetKernels(torchbridge.KernelsDefault); err != nil {
				t.Fatal(err)
			}
			decode := func(p *torchbridge.Policy) ([]int32, []float32) {
				c, err := p.NewCache(2, 128)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				st := torchbridge.Step{Rows: []int{0, 1}, WantLogp: true, Tokens: [][]int32{toks[0], toks[2]}}
				var out []int32
				var lps []float32
				for k := 0; k < 20; k++ {
					res, err := c.Extend(ctx, st)
					if err != nil {
						t.Fatal(err)
					}
					out = append(out, res.Next...)
					lps = append(lps, res.Logp...)
					st.Tokens = [][]int32{{res.Next[0]}, {res.Next[1]}}
				}
				return out, lps
			}
			at, al := decode(plain)
			bt, bl := decode(fused)
			worst = 0
			same := 0
			for i := range at {
				if at[i] != bt[i] {
					break
				}
				same++
				worst = math.Max(worst, math.Abs(float64(al[i]-bl[i])))
			}
			t.Logf("decoding: %d of %d tokens agree before the first difference; log-probs within %.3g", same, len(at), worst)
			if same < 2 { // the prefill's choice of both rows, at least
				t.Errorf("decoding: the fused products chose other tokens from the first step: %v, want %v", bt, at)
			}
			if worst > tc.tol {
				t.Errorf("decoding: fused products' log-probs differ by %.3g, tolerance %g", worst, tc.tol)
			}
			if tc.dtype == "float32" {
				for i := range at {
					if at[i] != bt[i] {
						t.Fatalf("decoding float32: token %d is %d with fused products, %d without", i, bt[i], at[i])
					}
				}
			}
		})
	}
}
