package torchbridge_test

import (
	"context"
	"math"
	"math/rand"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/torchbridge"
)

// ppoBatch is a fixed batch for the value-head tests: sequences with a
// prompt and an observation span masked out, per-token advantages, value
// targets and old values on the policy tokens.
type ppoBatch struct {
	seqs  []torchbridge.Sequence
	toks  [][]int32
	masks [][]float32
}

func newPPOBatch(r *rand.Rand, vocab int) ppoBatch {
	var b ppoBatch
	for _, n := range []int{14, 9, 12} {
		s := torchbridge.Sequence{Tokens: randomSeq(r, n, vocab), Mask: make([]float32, n),
			TokenAdv: make([]float32, n), Returns: make([]float32, n), OldValues: make([]float32, n)}
		for t := 3; t < n; t++ {
			if t < 6 || t > 7 { // tokens 6 and 7: an inserted observation
				s.Mask[t] = 1
				s.TokenAdv[t] = float32(r.NormFloat64())
				s.Returns[t] = float32(2*r.Float64() - 1)
			}
		}
		b.seqs = append(b.seqs, s)
		b.toks = append(b.toks, s.Tokens)
		b.masks = append(b.masks, s.Mask)
	}
	return b
}

func (b ppoBatch) tokens() float64 {
	var n float64
	for _, m := range b.masks {
		for t, v := range m {
			if t > 0 && v > 0 {
				n++
			}
		}
	}
	return n
}

func withValueHead(t *testing.T, p *torchbridge.Policy, r *rand.Rand) {
	t.Helper()
	if err := p.AddValueHead(); err != nil {
		t.Fatal(err)
	}
	hs := p.Config().HiddenSize
	w := make([]float32, hs)
	for i := range w {
		w[i] = float32(0.3 * r.NormFloat64())
	}
	setF32(t, p, "value_head.weight", w)
	setF32(t, p, "value_head.bias", []float32{0.1})
}

// The value loss Backward reports and the value head's bias gradient equal
// ½·max((V−R)², (clip(V, V_old±ε_v)−R)²) and its derivative computed here
// from the values the policy's Values returns, with and without the clip
// (old values far enough from V that the clip bites on some tokens).
func TestValueLossAndGradient(t *testing.T) {
	ctx := context.Background()
	const vocab = 41
	cases := []struct {
		name      string
		clip      float64
		oldOffset float64 // old values = V + oldOffset·N(0, 1)
	}{
		{"no clip", 0, 0.2},
		{"clip 0.05", 0.05, 0.2},
		{"clip 0.5, old = V", 0.5, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := rand.New(rand.NewSource(4))
			p := newTiny(t, vocab, false, 3)
			withValueHead(t, p, r)
			b := newPPOBatch(r, vocab)
			vals, err := p.Values(ctx, b.toks, b.masks)
			if err != nil {
				t.Fatal(err)
			}
			const vf = 0.7
			scale := 1 / b.tokens()
			var wantLoss, wantGrad float64
			clipped := 0.0
			for i, s := range b.seqs {
				for tk := range s.Tokens {
					v := float64(vals[i][tk])
					if tk == 0 || s.Mask[tk] == 0 {
						if v != 0 {
							t.Fatalf("sequence %d token %d: value %v for a token that is not the policy's, want 0", i, tk, v)
						}
						continue
					}
					b.seqs[i].OldValues[tk] = float32(v + c.oldOffset*r.NormFloat64())
					vo, ret := float64(b.seqs[i].OldValues[tk]), float64(s.Returns[tk])
					l1, d := (v-ret)*(v-ret), v-ret
					if c.clip > 0 {
						vc := math.Max(math.Min(v, vo+c.clip), vo-c.clip)
						if l2 := (vc - ret) * (vc - ret); l2 > l1 {
							// The clipped term wins only where the clip moved
							// V, and a clipped V has no gradient.
							l1, clipped, d = l2, clipped+1, 0
						}
					}
					wantLoss += 0.5 * l1
					wantGrad += vf * scale * d
				}
			}
			if c.clip > 0 && c.oldOffset > 0 && clipped == 0 {
				t.Fatal("the clip never bites; the test would prove nothing")
			}
			st, err := p.Backward(ctx, b.seqs, torchbridge.LossOptions{ClipEps: 0.2, Scale: scale, VFCoef: vf, ValueClip: c.clip})
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(st.ValueLoss-wantLoss) > 1e-5*math.Max(1, wantLoss) {
				t.Errorf("value loss %v, want %v", st.ValueLoss, wantLoss)
			}
			if st.ValueClipped != clipped {
				t.Errorf("%v value-clipped tokens, want %v", st.ValueClipped, clipped)
			}
			g := getF32(t, p, "grad/value_head.bias", 1)[0]
			if math.Abs(float64(g)-wantGrad) > 1e-5 {
				t.Errorf("gradient of value_head.bias %v, want %v", g, wantGrad)
			}
			t.Logf("value loss %.6f (want %.6f), clipped %v, bias gradient %.6f (want %.6f)", st.ValueLoss, wantLoss, clipped, g, wantGrad)
		})
	}
}

// PPO's extensions leave the policy-gradient part alone: a policy with a
// value head computes GRPO's loss and gradients exactly as one without, and
// per-token advantages equal to the row's advantage with vf_coef 0 give
// GRPO's loss and gradients too.
func TestPPOLossReducesToGRPO(t *testing.T) {
	ctx := context.Background()
	const vocab = 41
	cases := []struct {
		name string
		ppo  bool // per-token advantages (the row's), returns and vf_coef 0
	}{
		{"value head, GRPO loss", false},
		{"per-token advantages, vf_coef 0", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := rand.New(rand.NewSource(6))
			b := newPPOBatch(r, vocab)
			grpo := make([]torchbridge.Sequence, len(b.seqs))
			for i, s := range b.seqs {
				grpo[i] = torchbridge.Sequence{Tokens: s.Tokens, Mask: s.Mask, Advantage: float32(r.NormFloat64()),
					OldLogp: make([]float32, len(s.Tokens))}
				for tk := range s.Tokens {
					grpo[i].OldLogp[tk] = float32(-3 + 0.3*r.NormFloat64())
				}
			}
			lo := torchbridge.LossOptions{ClipEps: 0.2, EntropyCoef: 0.05, Scale: 1 / b.tokens()}
			base := newTiny(t, vocab, false, 3)
			want, err := base.Backward(ctx, grpo, lo)
			if err != nil {
				t.Fatal(err)
			}
			p := newTiny(t, vocab, false, 3)
			withValueHead(t, p, r)
			seqs := grpo
			if c.ppo {
				seqs = slices.Clone(grpo)
				for i := range seqs {
					s := &seqs[i]
					s.TokenAdv, s.Returns = make([]float32, len(s.Tokens)), b.seqs[i].Returns
					for tk := range s.TokenAdv {
						s.TokenAdv[tk] = s.Advantage
					}
					s.Advantage = 0
				}
			}
			got, err := p.Backward(ctx, seqs, lo)
			if err != nil {
				t.Fatal(err)
			}
			got.ValueLoss, got.ValueClipped = 0, 0
			if got != want {
				t.Errorf("loss stats %+v, want GRPO's %+v", got, want)
			}
			for _, pr := range base.Params() {
				if a, b := getF32(t, p, "grad/"+pr.Name, pr.Numel()), getF32(t, base, "grad/"+pr.Name, pr.Numel()); !slices.Equal(a, b) {
					t.Errorf("gradient of %s differs from GRPO's", pr.Name)
				}
			}
		})
	}
}

// The value head's loss falls over AdamW updates on a fixed batch, both
// with one learning rate for everything and with the trunk nearly frozen
// and the head on its own learning rate (AdamW.ValueLR), which then leaves
// the other weights unchanged.
func TestValueLossFalls(t *testing.T) {
	ctx := context.Background()
	const vocab = 41
	cases := []struct {
		name      string
		lr, valLR float64
	}{
		{"shared trunk, one learning rate", 1e-2, 0},
		{"value head's own learning rate", 1e-12, 3e-2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := rand.New(rand.NewSource(9))
			p := newTiny(t, vocab, false, 3)
			withValueHead(t, p, r)
			b := newPPOBatch(r, vocab)
			for i := range b.seqs {
				b.seqs[i].OldValues = nil
				for tk := range b.seqs[i].TokenAdv {
					b.seqs[i].TokenAdv[tk] *= 0.1
				}
			}
			before := map[string][]float32{}
			for _, pr := range p.Params() {
				before[pr.Name] = getF32(t, p, pr.Name, pr.Numel())
			}
			lo := torchbridge.LossOptions{ClipEps: 0.2, Scale: 1 / b.tokens(), VFCoef: 0.5}
			adam := torchbridge.AdamW{LR: c.lr, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, MaxGradNorm: 1, ValueLR: c.valLR}
			var losses []float64
			for k := 0; k < 30; k++ {
				st, err := p.Backward(ctx, b.seqs, lo)
				if err != nil {
					t.Fatal(err)
				}
				losses = append(losses, st.ValueLoss/st.Tokens)
				if _, err := p.Step(ctx, adam); err != nil {
					t.Fatal(err)
				}
			}
			first, last := losses[0], losses[len(losses)-1]
			t.Logf("value loss (token mean) %.4f → %.4f over %d updates", first, last, len(losses)-1)
			if !(last < 0.5*first) {
				t.Errorf("value loss %.4f → %.4f: want it at least halved; all: %.4f", first, last, losses)
			}
			for _, pr := range p.Params() {
				moved := !slices.Equal(before[pr.Name], getF32(t, p, pr.Name, pr.Numel()))
				if strings.HasPrefix(pr.Name, "value_head.") && !moved {
					t.Errorf("%s did not change", pr.Name)
				}
				if c.valLR > 0 && !strings.HasPrefix(pr.Name, "value_head.") {
					var d float64
					for i, v := range getF32(t, p, pr.Name, pr.Numel()) {
						d = math.Max(d, math.Abs(float64(v-before[pr.Name][i])))
					}
					if d > 1e-9 {
						t.Errorf("%s moved by %g at learning rate %g: the value head's learning rate leaked", pr.Name, d, c.lr)
					}
				}
			}
		})
	}
}

// The value head and its AdamW state survive Save, SaveOptimizer and a load;
// model.safetensors keeps only the Hugging Face model's tensors, so the
// folder stays loadable without the head.
func TestValueHeadCheckpoint(t *testing.T) {
	ctx := context.Background()
	const vocab = 41
	r := rand.New(rand.NewSource(2))
	p := newTiny(t, vocab, false, 3)
	if _, err := p.Values(ctx, [][]int32{{1, 2, 3}}, nil); err == nil || !strings.Contains(err.Error(), "no value head") {
		t.Errorf("Values without a value head: %v, want an error saying so", err)
	}
	withValueHead(t, p, r)
	if err := p.AddValueHead(); err == nil {
		t.Error("a second AddValueHead succeeded")
	}
	b := newPPOBatch(r, vocab)
	if _, err := p.Backward(ctx, b.seqs, torchbridge.LossOptions{ClipEps: 0.2, Scale: 1 / b.tokens(), VFCoef: 0.5, ValueClip: 0.2}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Step(ctx, torchbridge.AdamW{LR: 1e-2, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "ck")
	if err := p.Save(dir); err != nil {
		t.Fatal(err)
	}
	opt := filepath.Join(dir, "optimizer.safetensors")
	if err := p.SaveOptimizer(opt); err != nil {
		t.Fatal(err)
	}
	w, err := hfmodel.OpenWeights(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range w.Names() {
		if strings.HasPrefix(n, "value_head.") {
			t.Errorf("model.safetensors holds %s", n)
		}
	}
	w.Close()

	q, err := torchbridge.LoadPolicy(dir, onDevice(torchbridge.Options{})) // a plain Hugging Face load
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if q.HasValueHead() {
		t.Fatal("LoadPolicy gave the policy a value head")
	}
	if err := q.LoadValueHead(filepath.Join(dir, torchbridge.ValueHeadFile)); err == nil {
		t.Error("LoadValueHead without AddValueHead succeeded")
	}
	if err := q.AddValueHead(); err != nil {
		t.Fatal(err)
	}
	if err := q.LoadValueHead(filepath.Join(dir, torchbridge.ValueHeadFile)); err != nil {
		t.Fatal(err)
	}
	if err := q.LoadOptimizer(opt); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"value_head.weight", "value_head.bias", "exp_avg/value_head.weight", "exp_avg_sq/value_head.bias"} {
		n := int64(p.Config().HiddenSize)
		if strings.HasSuffix(name, "bias") {
			n = 1
		}
		a, b := getF32(t, p, name, n), getF32(t, q, name, n)
		if !slices.Equal(a, b) {
			t.Errorf("%s: %v saved, %v loaded", name, a, b)
		}
		if strings.HasPrefix(name, "exp_avg") && slices.Equal(a, make([]float32, n)) {
			t.Errorf("%s is zero after an update; the test would prove nothing", name)
		}
	}
	va, err := p.Values(ctx, b.toks, b.masks)
	if err != nil {
		t.Fatal(err)
	}
	vb, err := q.Values(ctx, b.toks, b.masks)
	if err != nil {
		t.Fatal(err)
	}
	for i := range va {
		if !slices.Equal(va[i], vb[i]) {
			t.Errorf("sequence %d: values differ after the round trip", i)
		}
	}
}
