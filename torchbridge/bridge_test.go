package torchbridge_test

import (
	"context"
	"encoding/binary"
	"math"
	"math/rand"
	"testing"

	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/torchbridge"
)

// tinyConfig is a small Qwen2 with grouped-query attention.
func tinyConfig(vocab int64, tied bool) *hfmodel.Config {
	return &hfmodel.Config{
		Architectures: []string{"Qwen2ForCausalLM"}, ModelType: "qwen2",
		VocabSize: vocab, HiddenSize: 32, IntermediateSize: 64, NumHiddenLayers: 2,
		NumAttentionHeads: 4, NumKeyValueHeads: 2, MaxPositionEmbeddings: 256,
		RopeTheta: 10000, RMSNormEps: 1e-6, TieWordEmbeddings: tied, EOSTokenIDs: []int64{1},
	}
}

func newTiny(t *testing.T, vocab int64, tied bool, seed uint64) *torchbridge.Policy {
	t.Helper()
	return newTinyOn(t, "", vocab, tied, seed)
}

// newTinyOn is newTiny on a given device ("": the tests' device, onDevice).
func newTinyOn(t *testing.T, device string, vocab int64, tied bool, seed uint64) *torchbridge.Policy {
	t.Helper()
	p, err := torchbridge.NewPolicy(tinyConfig(vocab, tied), onDevice(torchbridge.Options{Device: device}))
	if err != nil {
		t.Fatalf("NewPolicy: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	if err := p.InitRandom(seed, 0.2); err != nil {
		t.Fatalf("InitRandom: %v", err)
	}
	return p
}

func randomSeq(r *rand.Rand, n int, vocab int) []int32 {
	s := make([]int32, n)
	for i := range s {
		s[i] = int32(r.Intn(vocab))
	}
	return s
}

func logSoftmaxAt(logits []float32, tok int32) float64 {
	m := math.Inf(-1)
	for _, v := range logits {
		m = math.Max(m, float64(v))
	}
	var z float64
	for _, v := range logits {
		z += math.Exp(float64(v) - m)
	}
	return float64(logits[tok]) - m - math.Log(z)
}

// The KV cache must give the same next-token distributions as a full forward
// pass, whatever mix of prefill chunks, single-token decodes and rows.
func TestCacheMatchesFullForward(t *testing.T) {
	ctx := context.Background()
	const vocab = 97
	for _, tied := range []bool{true, false} {
		p := newTiny(t, vocab, tied, 7)
		r := rand.New(rand.NewSource(1))
		seqs := [][]int32{randomSeq(r, 40, vocab), randomSeq(r, 23, vocab), randomSeq(r, 31, vocab)}
		want, _, err := p.Score(ctx, seqs)
		if err != nil {
			t.Fatal(err)
		}
		c, err := p.NewCache(5, 64)
		if err != nil {
			t.Fatal(err)
		}
		// Rows 4, 0, 2 (not contiguous) hold seqs 0, 1, 2. Feed them in
		// chunks of varying sizes: prompt-like prefills, then single tokens,
		// then a block, as a rollout does with <information>.
		rows := []int{4, 0, 2}
		pos := []int{0, 0, 0}
		chunks := []int{7, 1, 1, 5, 1, 3, 1, 1, 1, 8, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}
		for ci, k := range chunks {
			var st torchbridge.Step
			st.WantLogits, st.WantLogp = true, true
			var which []int
			for i := range seqs {
				kk := k + i%2 // rows advance by different amounts
				if ci%3 == 2 && i == 1 {
					continue // a row that sits out a step
				}
				if pos[i]+kk > len(seqs[i])-1 {
					kk = len(seqs[i]) - 1 - pos[i]
				}
				if kk <= 0 {
					continue
				}
				st.Rows = append(st.Rows, rows[i])
				st.Tokens = append(st.Tokens, seqs[i][pos[i]:pos[i]+kk])
				which = append(which, i)
			}
			if len(which) == 0 {
				break
			}
			res, err := c.Extend(ctx, st)
			if err != nil {
				t.Fatal(err)
			}
			for j, i := range which {
				if d := math.Abs(float64(res.Logp[j]) - logSoftmaxAt(res.Logits[j], res.Next[j])); d > 1e-4 {
					t.Fatalf("log-prob of the sampled token %.6f, from the logits %.6f", res.Logp[j], logSoftmaxAt(res.Logits[j], res.Next[j]))
				}
				pos[i] += len(st.Tokens[j])
				got := logSoftmaxAt(res.Logits[j], seqs[i][pos[i]])
				if d := math.Abs(got - float64(want[i][pos[i]])); d > 1e-4 {
					t.Fatalf("tied=%v seq %d token %d: cached log-prob %.6f, full forward %.6f: the KV cache diverges", tied, i, pos[i], got, want[i][pos[i]])
				}
			}
		}
		lens, err := c.Lengths(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for i, row := range rows {
			if lens[row] != pos[i] {
				t.Errorf("row %d holds %d tokens, want %d", row, lens[row], pos[i])
			}
		}
	}
}

func getF32(t *testing.T, p *torchbridge.Policy, name string, n int64) []float32 {
	t.Helper()
	buf := make([]byte, 4*n)
	if err := p.GetParam(name, "F32", buf); err != nil {
		t.Fatal(err)
	}
	out := make([]float32, n)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:]))
	}
	return out
}

func setF32(t *testing.T, p *torchbridge.Policy, name string, v []float32) {
	t.Helper()
	buf := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(x))
	}
	if err := p.SetParam(name, "F32", buf); err != nil {
		t.Fatal(err)
	}
}

// Gradients of the summed log-probability match central finite differences.
func TestGradientFiniteDifferences(t *testing.T) {
	ctx := context.Background()
	const vocab = 41
	p := newTiny(t, vocab, false, 3)
	r := rand.New(rand.NewSource(2))
	seqs := [][]int32{randomSeq(r, 12, vocab), randomSeq(r, 9, vocab)}
	masks := make([][]float32, len(seqs))
	for i, s := range seqs {
		masks[i] = make([]float32, len(s))
		for j := 3; j < len(s); j++ {
			masks[i][j] = 1
		}
	}
	objective := func() float64 { // Σ masked log p
		lp, _, err := p.Score(ctx, seqs)
		if err != nil {
			t.Fatal(err)
		}
		var s float64
		for i := range lp {
			for j := range lp[i] {
				s += float64(lp[i][j] * masks[i][j])
			}
		}
		return s
	}
	// BackwardNLL accumulates d(−Σ log p)/dθ.
	if _, _, err := p.BackwardNLL(ctx, seqs, masks, 1, 0); err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, pr := range p.Params() {
		n := pr.Numel()
		grad := getF32(t, p, "grad/"+pr.Name, n)
		w := getF32(t, p, pr.Name, n)
		for k := 0; k < 3; k++ {
			i := r.Int63n(n)
			const h = 1e-2
			orig := w[i]
			w[i] = orig + h
			setF32(t, p, pr.Name, w)
			up := objective()
			w[i] = orig - h
			setF32(t, p, pr.Name, w)
			down := objective()
			w[i] = orig
			setF32(t, p, pr.Name, w)
			fd := -(up - down) / (2 * h)
			g := float64(grad[i])
			if math.Abs(fd-g) > 2e-3+0.03*math.Abs(fd) {
				t.Errorf("%s[%d]: gradient %.6f, finite difference %.6f", pr.Name, i, g, fd)
			}
			checked++
		}
	}
	if checked < 3*len(p.Params()) {
		t.Fatalf("checked %d elements", checked)
	}
}

// A few AdamW steps on a fixed batch lower the loss and change every parameter.
func TestAdamWLearns(t *testing.T) {
	ctx := context.Background()
	const vocab = 53
	p := newTiny(t, vocab, true, 11)
	r := rand.New(rand.NewSource(3))
	seqs := [][]int32{randomSeq(r, 20, vocab), randomSeq(r, 16, vocab)}
	masks := [][]float32{make([]float32, 20), make([]float32, 16)}
	for i := range masks {
		for j := range masks[i] {
			masks[i][j] = 1
		}
	}
	before := map[string][]float32{}
	for _, pr := range p.Params() {
		before[pr.Name] = getF32(t, p, pr.Name, pr.Numel())
	}
	opt := torchbridge.AdamW{LR: 1e-2, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, MaxGradNorm: 1}
	var first, last float64
	for step := 0; step < 6; step++ {
		nll, toks, err := p.BackwardNLL(ctx, seqs, masks, 1/34.0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if toks != 34 {
			t.Fatalf("masked tokens %v, want 34", toks)
		}
		gn, err := p.Step(ctx, opt)
		if err != nil {
			t.Fatal(err)
		}
		if math.IsNaN(gn) || gn <= 0 {
			t.Fatalf("step %d: grad norm %v", step, gn)
		}
		if step == 0 {
			first = nll
		}
		last = nll
	}
	if !(last < first*0.9) {
		t.Errorf("NLL went from %.3f to %.3f: AdamW steps should lower it", first, last)
	}
	for _, pr := range p.Params() {
		after := getF32(t, p, pr.Name, pr.Numel())
		changed := false
		for i := range after {
			if after[i] != before[pr.Name][i] {
				changed = true
				break
			}
		}
		if !changed {
			t.Errorf("parameter %s did not change after 6 AdamW steps", pr.Name)
		}
	}
}

// The GRPO loss's gradient (clipped ratio, k3 KL, entropy bonus) matches
// finite differences of the loss it reports.
func TestPolicyGradientFiniteDifferences(t *testing.T) {
	ctx := context.Background()
	const vocab = 37
	p := newTiny(t, vocab, true, 9)
	r := rand.New(rand.NewSource(4))
	var seqs []torchbridge.Sequence
	for i, n := range []int{11, 8} {
		s := torchbridge.Sequence{Tokens: randomSeq(r, n, vocab), Advantage: []float32{1.3, -0.7}[i]}
		s.Mask = make([]float32, n)
		for j := 2; j < n; j++ {
			s.Mask[j] = 1
		}
		seqs = append(seqs, s)
	}
	toks := [][]int32{seqs[0].Tokens, seqs[1].Tokens}
	lp, _, err := p.Score(ctx, toks)
	if err != nil {
		t.Fatal(err)
	}
	// Old and reference log-probs near the current ones: some ratios fall
	// outside [1−ε, 1+ε], so clipping is exercised on both sides.
	for i := range seqs {
		seqs[i].OldLogp = make([]float32, len(lp[i]))
		seqs[i].RefLogp = make([]float32, len(lp[i]))
		for j := range lp[i] {
			seqs[i].OldLogp[j] = lp[i][j] + float32(r.NormFloat64()*0.3)
			seqs[i].RefLogp[j] = lp[i][j] + float32(r.NormFloat64()*0.5)
		}
	}
	opt := torchbridge.LossOptions{ClipEps: 0.2, KLCoef: 0.3, EntropyCoef: 0.05, Scale: 1.0 / 15}
	lossAt := func() float64 {
		st, err := p.Backward(ctx, seqs, opt)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.ZeroGrad(ctx); err != nil {
			t.Fatal(err)
		}
		return st.Loss
	}
	st, err := p.Backward(ctx, seqs, opt)
	if err != nil {
		t.Fatal(err)
	}
	if st.Clipped == 0 || st.Clipped == st.Tokens {
		t.Fatalf("%v of %v tokens clipped: the test should exercise both branches", st.Clipped, st.Tokens)
	}
	grads := map[string][]float32{}
	for _, pr := range p.Params() {
		grads[pr.Name] = getF32(t, p, "grad/"+pr.Name, pr.Numel())
	}
	if err := p.ZeroGrad(ctx); err != nil {
		t.Fatal(err)
	}
	for _, pr := range p.Params() {
		w := getF32(t, p, pr.Name, pr.Numel())
		for k := 0; k < 3; k++ {
			i := r.Int63n(pr.Numel())
			const h = 5e-3
			orig := w[i]
			w[i] = orig + h
			setF32(t, p, pr.Name, w)
			up := lossAt()
			w[i] = orig - h
			setF32(t, p, pr.Name, w)
			down := lossAt()
			w[i] = orig
			setF32(t, p, pr.Name, w)
			fd := (up - down) / (2 * h)
			g := float64(grads[pr.Name][i])
			if math.Abs(fd-g) > 1e-3+0.05*math.Abs(fd) {
				t.Errorf("%s[%d]: gradient %.6f, finite difference %.6f", pr.Name, i, g, fd)
			}
		}
	}
}

// Sampling depends on (seed, row, position) only: rows decoded together or
// one by one draw the same tokens, so rollouts do not depend on batching.
func TestSamplingIndependentOfBatching(t *testing.T) {
	ctx := context.Background()
	const vocab = 89
	p := newTiny(t, vocab, true, 21)
	r := rand.New(rand.NewSource(5))
	prompts := [][]int32{randomSeq(r, 5, vocab), randomSeq(r, 9, vocab), randomSeq(r, 3, vocab)}
	s := torchbridge.Sampling{Temperature: 1, TopP: 0.95, TopK: 40}
	decode := func(together bool) [][]int32 {
		c, err := p.NewCache(3, 64)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		out := make([][]int32, 3)
		feed := append([][]int32{}, prompts...)
		for step := 0; step < 12; step++ {
			groups := [][]int{{0, 1, 2}}
			if !together {
				groups = [][]int{{2}, {0}, {1}}
			}
			for _, g := range groups {
				st := torchbridge.Step{Rows: g, Sampling: s, Seed: 77}
				for _, row := range g {
					st.Tokens = append(st.Tokens, feed[row])
				}
				res, err := c.Extend(ctx, st)
				if err != nil {
					t.Fatal(err)
				}
				for k, row := range g {
					out[row] = append(out[row], res.Next[k])
					feed[row] = []int32{res.Next[k]}
				}
			}
		}
		return out
	}
	a, b := decode(true), decode(false)
	distinct := map[int32]bool{}
	for i := range a {
		for k := range a[i] {
			distinct[a[i][k]] = true
			if a[i][k] != b[i][k] {
				t.Fatalf("row %d token %d: %d decoded together, %d alone", i, k, a[i][k], b[i][k])
			}
		}
	}
	if len(distinct) < 5 {
		t.Fatalf("only %d distinct tokens sampled: the test would not notice a broken sampler", len(distinct))
	}
}
