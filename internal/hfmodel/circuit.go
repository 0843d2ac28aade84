package hfmodel

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// CopyCircuit writes a copy (induction) circuit into the first two layers of
// randomly initialised Qwen2 weights, so that a policy trained from scratch
// can continue a token span it has seen before: at a token that occurred
// earlier, it predicts the token that followed it there. Answering from
// <information> is such copying; a pretrained model has the circuit, but a
// small one trained from scratch does not learn it from a few thousand
// steps of demonstrations (nor of random-span copying). Everything else stays
// as initialised, and training may change the circuit like any weight.
//
// w maps Hugging Face tensor names to row-major float32 values and is
// changed in place. The residual stream is split in two: the embedding lives
// in its first A = hidden − kv_heads·head_dim dimensions, the rest holds the
// previous token.
//
//   - Layer 0: the first head of each key/value group attends to the
//     previous position (q and k biases whose rotary phases peak at distance
//     1; q and k weights zero) and moves head_dim dimensions of that token's
//     embedding into the previous-token part. The other heads (q zero) take
//     the mean of the context, through their random output weights.
//   - Layer 1: the first head of each group matches the current token's
//     embedding against each position's previous token, on the rotary pairs
//     that turn slowest (so the match hardly depends on distance), and adds
//     the embedding of the matched position to the stream, which the tied
//     output head reads as that token's logit. The other heads stay random.
//
// For the tiny preset (random MLPs left in), its most likely next token
// continues the repeat of a random 24-token span 97% of the time (the small
// preset: 57%, its two further random layers adding noise); at random init,
// at chance. Where the context holds a token twice, the match alone cannot
// tell the occurrences apart: "," in a reply's "Madison, Wisconsin" also
// follows words of the prompt, and the copy could jump there. Layer 1
// therefore also prefers nearer positions (a rotary recency bias): the
// reply's answer is the most recent occurrence of what the answer turn
// copies, and the question (in the prompt) is nearer to the sub-query than
// the prompt's instructions are. On 800 answer turns of a trained policy's
// eval responses (each followed by the reply's answer), the freshly
// initialised policy continues the answer with p > 1/2 for 90% of its
// tokens (69% of whole answers) with the bias and 73% (36%) without; for
// the question copied into a sub-query, 82% (20%) against 74% (5%). A
// stronger bias copies answers better still but loops in the sub-query
// (its own copied words are then nearer than the question's). Where a span
// holds a token twice, the copy may still jump to the wrong occurrence and
// loop ("name was long name was long …"). (Matching the two previous tokens
// instead, with a second previous-token head, made the warm-up learn worse.)
func CopyCircuit(c *Config, w map[string][]float32, seed uint64) error {
	H := int(c.HiddenSize)
	nh, nkv := int(c.NumAttentionHeads), int(c.NumKeyValueHeads)
	if nh <= 0 || nkv <= 0 || H%nh != 0 || nh%nkv != 0 {
		return fmt.Errorf("hfmodel: copy circuit: bad head counts (hidden %d, heads %d, kv heads %d)", H, nh, nkv)
	}
	hd := H / nh
	A := H - nkv*hd
	switch {
	case c.NumHiddenLayers < 2:
		return fmt.Errorf("hfmodel: copy circuit: needs 2 layers, the model has %d", c.NumHiddenLayers)
	case hd < 32:
		return fmt.Errorf("hfmodel: copy circuit: needs a head size of at least 32, the model has %d", hd)
	case A < nkv*hd:
		return fmt.Errorf("hfmodel: copy circuit: the key/value heads (%d×%d) need at most half the hidden size %d", nkv, hd, H)
	}
	get := func(name string, n int) ([]float32, error) {
		t, ok := w[name]
		if !ok {
			return nil, fmt.Errorf("hfmodel: copy circuit: no tensor %q", name)
		}
		if len(t) != n {
			return nil, fmt.Errorf("hfmodel: copy circuit: tensor %q has %d values, want %d", name, len(t), n)
		}
		return t, nil
	}
	V := int(c.VocabSize)
	emb, err := get("model.embed_tokens.weight", V*H)
	if err != nil {
		return err
	}
	const (
		sigE  = 0.2 // embedding scale: sharp copies through the tied head, above the random layers' outputs
		bias  = 4.0 // layer 0's positional q/k bias per rotary pair
		match = 3.0 // layer 1's q and k weights
		// Layer 1's recency bias: a q and k bias on the rotary pair of
		// frequency nearest recencyFreq (period about 470 tokens): the bias
		// falls monotonically with distance up to π/recencyFreq ≈ 236
		// tokens, then rises again (a position that far back gains little
		// over one further still).
		recency     = 6.0
		recencyFreq = 1.0 / 75
	)
	rmsE := sigE * math.Sqrt(float64(A)/float64(H)) // rms of an embedding row over the stream
	rng := rand.New(rand.NewPCG(seed, 0x636f7079))
	for v := range V {
		row := emb[v*H : (v+1)*H]
		for i := range row {
			row[i] = 0
			if i < A {
				row[i] = float32(rng.NormFloat64() * sigE)
			}
		}
	}
	if !c.TieWordEmbeddings {
		head, err := get("lm_head.weight", V*H)
		if err != nil {
			return err
		}
		copy(head, emb)
	}
	freq := make([]float64, hd/2) // rotary frequency of pair j (dimensions j and j+hd/2)
	for j := range freq {
		freq[j] = math.Pow(c.RopeTheta, -2*float64(j)/float64(hd))
	}
	attn := func(l int) (q, qb, k, kb, v, o []float32, err error) {
		p := fmt.Sprintf("model.layers.%d.self_attn.", l)
		for _, t := range []struct {
			dst *[]float32
			n   string
			len int
		}{{&q, "q_proj.weight", nh * hd * H}, {&qb, "q_proj.bias", nh * hd}, {&k, "k_proj.weight", nkv * hd * H},
			{&kb, "k_proj.bias", nkv * hd}, {&v, "v_proj.weight", nkv * hd * H}, {&o, "o_proj.weight", H * nh * hd}} {
			if *t.dst, err = get(p+t.n, t.len); err != nil {
				return
			}
		}
		return
	}
	zeroRows := func(m []float32, from, to, cols int) {
		clear(m[from*cols : to*cols])
	}
	rep := nh / nkv
	// clearHeads zeroes the output projection of the circuit's heads (the
	// first of each group); the others keep their random weights, so the
	// stream sees the question (GRPO's routing depends on it).
	clearHeads := func(o []float32) {
		for r := range H {
			for h := 0; h < nh; h += rep {
				clear(o[r*nh*hd+h*hd : r*nh*hd+(h+1)*hd])
			}
		}
	}

	// Layer 0: previous-token heads.
	q, qb, k, kb, v, o, err := attn(0)
	if err != nil {
		return err
	}
	for h := range nh { // q zero: the other heads attend uniformly, a running mean of the context
		zeroRows(q, h*hd, (h+1)*hd, H)
		clear(qb[h*hd : (h+1)*hd])
		if h%rep == 0 {
			for j := 0; j < 6; j++ {
				qb[h*hd+j] = bias
			}
		}
	}
	clearHeads(o)
	for g := range nkv {
		zeroRows(k, g*hd, (g+1)*hd, H)
		zeroRows(v, g*hd, (g+1)*hd, H)
		clear(kb[g*hd : (g+1)*hd])
		for j := 0; j < 6; j++ { // q·k = bias² cos(freq_j (1 − distance)): largest at distance 1
			kb[g*hd+j] = float32(bias * math.Cos(freq[j]))
			kb[g*hd+j+hd/2] = float32(bias * math.Sin(freq[j]))
		}
		h := g * rep
		for i := range hd {
			v[(g*hd+i)*H+g*hd+i] = 1 // embedding dimension g·hd+i (normalised: rms 1)
			o[(A+g*hd+i)*(nh*hd)+h*hd+i] = float32(rmsE)
		}
	}

	// Layer 1: induction heads.
	if q, qb, k, kb, v, o, err = attn(1); err != nil {
		return err
	}
	clearHeads(o)
	var slow []int // head dimensions of the slowest half of the rotary pairs
	for j := hd / 4; j < hd/2; j++ {
		slow = append(slow, j)
	}
	for j := hd / 4; j < hd/2; j++ {
		slow = append(slow, j+hd/2)
	}
	r := 0 // the fast rotary pair (not in slow) whose frequency is nearest recencyFreq
	for j := range hd / 4 {
		if math.Abs(math.Log(freq[j]/recencyFreq)) < math.Abs(math.Log(freq[r]/recencyFreq)) {
			r = j
		}
	}
	for g := range nkv {
		h := g * rep
		zeroRows(q, h*hd, (h+1)*hd, H)
		clear(qb[h*hd : (h+1)*hd])
		zeroRows(k, g*hd, (g+1)*hd, H)
		clear(kb[g*hd : (g+1)*hd])
		zeroRows(v, g*hd, (g+1)*hd, H)
		for m, d := range slow {
			q[(h*hd+d)*H+g*hd+m] = match   // the current token's embedding dimension g·hd+m …
			k[(g*hd+d)*H+A+g*hd+m] = match // … against the previous token's, which layer 0 put at A+g·hd+m
		}
		for i := range hd {
			v[(g*hd+i)*H+g*hd+i] = 1
			o[(g*hd+i)*(nh*hd)+h*hd+i] = float32(4 * rmsE)
		}
		// Recency: q·k gains recency² cos(freq_r · distance) on a rotary
		// pair the match leaves free, so of two matching positions the
		// nearer one wins.
		qb[h*hd+r] = recency
		kb[g*hd+r] = recency
	}
	return nil
}
