// Package engine is the workload that measures the policy engine, shared by
// bench (the engine against PyTorch eager on CPU, `make bench`) and
// bench/gpu/speed (one device and dtype, several model sizes): prefill of one
// prompt, greedy decode at batch 1 and 64, and the train step (clipped loss,
// backward, AdamW), each in tokens per second. The caller chooses how to time
// (a Timer); the work timed is the same for both.
package engine

import (
	"context"
	"math"
	"math/rand"
	"strconv"

	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/torchbridge"
)

// The workload's shapes, shared with bench/torch_eager.py.
const (
	PrefillLen   = 256 // tokens of the prefill's one prompt
	DecodePrompt = 32  // prompt tokens per row before decoding
	DecodeSteps  = 64  // greedy decode steps per row
	TrainBatch   = 8   // sequences per train step
	TrainLen     = 256 // tokens per sequence in the train step
)

// Rates are the workload's tokens per second; the JSON names are those of
// bench/torch_eager.py's output and bench/gpu/speed's lines.
type Rates struct {
	Prefill   float64 `json:"prefill_tok_s"`    // prompt tokens of the 1×PrefillLen prefill
	DecodeB1  float64 `json:"decode_b1_tok_s"`  // generated tokens, batch 1
	DecodeB64 float64 `json:"decode_b64_tok_s"` // generated tokens, batch 64
	Train     float64 `json:"train_tok_s"`      // TrainBatch×TrainLen tokens per step
	// Decode holds every decode batch measured (Options.Batches), by batch
	// size as a decimal string; DecodeB1 and DecodeB64 repeat 1 and 64.
	Decode map[string]float64 `json:"decode_tok_s,omitempty"`
}

// A Timer runs op repeatedly and returns tokensPerOp × runs / seconds. setup,
// when not nil, must run before every op (it resets what op consumed); the
// timer decides whether setup's time counts. The first error ends the timing
// and is returned.
type Timer func(tokensPerOp int, setup, op func() error) (float64, error)

// Options are the workload's settings that differ between callers.
type Options struct {
	// HeadChunk is the tokens per output-head chunk in the train step
	// (0: the engine's default).
	HeadChunk int
	// Batches are the decode batch sizes (nil: 1 and 64).
	Batches []int
	// NoTrain skips the train step (Rates.Train stays 0).
	NoTrain bool
}

// NewRandomPolicy makes the policy the workload runs on: cfg with opts,
// weights drawn from N(0, 0.02²) with seed 1. The caller closes it.
func NewRandomPolicy(cfg *hfmodel.Config, opts torchbridge.Options) (*torchbridge.Policy, error) {
	p, err := torchbridge.NewPolicy(cfg, opts)
	if err != nil {
		return nil, err
	}
	if err := p.InitRandom(1, 0.02); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// Measure times the workload on p with timer: prefill, decode at each of
// o.Batches (1 and 64 by default), then, unless o.NoTrain, the train step
// (which updates p's weights). Tokens are drawn from p's vocabulary with
// seed 1, so every run feeds the same tokens.
func Measure(ctx context.Context, p *torchbridge.Policy, timer Timer, o Options) (Rates, error) {
	vocab := p.Config().VocabSize
	r := rand.New(rand.NewSource(1))
	var res Rates
	var err error

	// Prefill: one prompt of PrefillLen tokens into an empty cache.
	cache, err := p.NewCache(1, PrefillLen+1)
	if err != nil {
		return Rates{}, err
	}
	prompt := tokens(r, PrefillLen, vocab)
	res.Prefill, err = timer(PrefillLen, nil, func() error {
		if err := cache.Reset(ctx); err != nil {
			return err
		}
		_, err := cache.Extend(ctx, torchbridge.Step{Rows: []int{0}, Tokens: [][]int32{prompt}})
		return err
	})
	cache.Close()
	if err != nil {
		return Rates{}, err
	}

	// Decode: setup prefills DecodePrompt tokens per row, then the op runs
	// DecodeSteps greedy steps feeding back the chosen token.
	decode := func(batch int) (float64, error) {
		c, err := p.NewCache(batch, DecodePrompt+DecodeSteps+1)
		if err != nil {
			return 0, err
		}
		defer c.Close()
		rows := make([]int, batch)
		prompts := make([][]int32, batch)
		for i := range rows {
			rows[i] = i
			prompts[i] = tokens(r, DecodePrompt, vocab)
		}
		var out torchbridge.Result
		setup := func() error {
			if err := c.Reset(ctx); err != nil {
				return err
			}
			var err error
			out, err = c.Extend(ctx, torchbridge.Step{Rows: rows, Tokens: prompts})
			return err
		}
		return timer(batch*DecodeSteps, setup, func() error {
			for s := 0; s < DecodeSteps; s++ {
				feed := make([][]int32, batch)
				for j := range feed {
					feed[j] = []int32{out.Next[j]}
				}
				var err error
				if out, err = c.Extend(ctx, torchbridge.Step{Rows: rows, Tokens: feed}); err != nil {
					return err
				}
			}
			return nil
		})
	}
	batches := o.Batches
	if len(batches) == 0 {
		batches = []int{1, 64}
	}
	res.Decode = map[string]float64{}
	for _, b := range batches {
		v, err := decode(b)
		if err != nil {
			return Rates{}, err
		}
		res.Decode[strconv.Itoa(b)] = v
		switch b {
		case 1:
			res.DecodeB1 = v
		case 64:
			res.DecodeB64 = v
		}
	}
	if o.NoTrain {
		return res, nil
	}

	// Train step: the clipped policy-gradient loss on TrainBatch sequences
	// of TrainLen tokens, backward, AdamW with clipping. The old
	// log-probabilities are -ln(vocab) rounded, about what the random
	// policy gives every token, so the ratios start near 1.
	oldLogp := float32(-math.Round(math.Log(float64(vocab))))
	seqs := make([]torchbridge.Sequence, TrainBatch)
	for i := range seqs {
		s := torchbridge.Sequence{Tokens: tokens(r, TrainLen, vocab), Advantage: float32(r.NormFloat64())}
		s.Mask = make([]float32, TrainLen)
		s.OldLogp = make([]float32, TrainLen)
		for t := range s.Mask {
			s.Mask[t] = 1
			s.OldLogp[t] = oldLogp
		}
		seqs[i] = s
	}
	loss := torchbridge.LossOptions{ClipEps: 0.2, Scale: 1.0 / float64(TrainBatch*TrainLen), HeadChunk: o.HeadChunk}
	adam := torchbridge.AdamW{LR: 1e-5, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, MaxGradNorm: 1}
	res.Train, err = timer(TrainBatch*TrainLen, nil, func() error {
		if _, err := p.Backward(ctx, seqs, loss); err != nil {
			return err
		}
		_, err := p.Step(ctx, adam)
		return err
	})
	if err != nil {
		return Rates{}, err
	}
	return res, nil
}

// tokens draws n token ids below vocab.
func tokens(r *rand.Rand, n int, vocab int64) []int32 {
	s := make([]int32, n)
	for i := range s {
		s[i] = int32(r.Int63n(vocab))
	}
	return s
}
