package torchbridge

/*
#include "recal.h"
*/
import "C"

import (
	"context"
	"fmt"
	"math"
	"runtime"
)

// padded lays out ragged sequences as a right-padded [batch, width] matrix.
type padded struct {
	batch, width int
	tokens       []int32
	lengths      []int64
}

func pad(seqs [][]int32) (padded, error) {
	var pd padded
	pd.batch = len(seqs)
	for _, s := range seqs {
		pd.width = max(pd.width, len(s))
	}
	if pd.batch == 0 || pd.width == 0 {
		return pd, fmt.Errorf("torchbridge: empty batch")
	}
	pd.tokens = make([]int32, pd.batch*pd.width)
	pd.lengths = make([]int64, pd.batch)
	for b, s := range seqs {
		copy(pd.tokens[b*pd.width:], s)
		pd.lengths[b] = int64(len(s))
	}
	return pd, nil
}

// shift turns per-token values v[t] (the value for token t, t ≥ 1) into the
// C layout, where position t holds the value for predicting token t+1.
func (pd padded) shift(b int, v []float32, out []float32) {
	for t := 1; t < len(v) && t <= int(pd.lengths[b])-1; t++ {
		out[b*pd.width+t-1] = v[t]
	}
}

// Score returns, for each sequence, the log-probability of every token given
// its prefix and the entropy of the distribution it was drawn from, indexed by
// token (index 0, which has no prefix, is 0). No gradients are kept.
func (p *Policy) Score(ctx context.Context, seqs [][]int32) (logp, entropy [][]float32, err error) {
	return p.ScoreMasked(ctx, seqs, nil)
}

// ScoreMasked is Score computed only for tokens whose mask is > 0 (masks is
// indexed like seqs; nil scores every token); the others are 0.
func (p *Policy) ScoreMasked(ctx context.Context, seqs [][]int32, masks [][]float32) (logp, entropy [][]float32, err error) {
	pd, err := pad(seqs)
	if err != nil {
		return nil, nil, err
	}
	var cmask []float32
	if masks != nil {
		cmask = make([]float32, pd.batch*pd.width)
		for b := range seqs {
			if len(masks[b]) != len(seqs[b]) {
				return nil, nil, fmt.Errorf("torchbridge: sequence %d: mask has %d entries for %d tokens", b, len(masks[b]), len(seqs[b]))
			}
			pd.shift(b, masks[b], cmask)
		}
	}
	lp := make([]float32, pd.batch*pd.width)
	en := make([]float32, pd.batch*pd.width)
	err = p.call(ctx, func(h *C.rc_policy) error {
		var msg *C.char
		rc := C.rc_policy_score(h, C.int64_t(pd.batch), C.int64_t(pd.width), ptrI32(pd.tokens), ptrI64(pd.lengths),
			ptrF32(cmask), ptrF32(lp), ptrF32(en), &msg)
		return status(rc, msg)
	})
	if err != nil {
		return nil, nil, err
	}
	logp = make([][]float32, pd.batch)
	entropy = make([][]float32, pd.batch)
	for b, s := range seqs {
		logp[b] = make([]float32, len(s))
		entropy[b] = make([]float32, len(s))
		for t := 1; t < len(s); t++ {
			logp[b][t] = lp[b*pd.width+t-1]
			entropy[b][t] = en[b*pd.width+t-1]
		}
	}
	return logp, entropy, nil
}

// Sequence is one response in a policy-gradient batch. Per-token slices are
// indexed like Tokens.
type Sequence struct {
	Tokens    []int32
	Mask      []float32 // 1 for tokens the policy wrote (they train), 0 for prompt and observations
	Advantage float32
	OldLogp   []float32 // log-probs under the rollout policy; nil = on-policy (ρ = 1)
	RefLogp   []float32 // log-probs under the reference policy; nil = no KL term

	// PPO (a policy with a value head): per-token advantages, which replace
	// Advantage, the value targets R and the values V_old the batch was
	// scored with (the centre of the value clip; nil = no clip). Given for
	// every sequence of a Backward call or for none; nil Returns = GRPO.
	TokenAdv  []float32
	Returns   []float32
	OldValues []float32
}

// LossOptions configure the clipped policy-gradient loss.
type LossOptions struct {
	ClipEps     float64 // ratio clip ε
	KLCoef      float64 // k3 KL coefficient
	EntropyCoef float64 // entropy bonus coefficient
	Scale       float64 // multiplies the token sum; 1/(policy tokens of the mini-batch) gives a token mean
	HeadChunk   int     // tokens per lm_head chunk (0 = 1024)
	VFCoef      float64 // PPO: weight of the value loss
	ValueClip   float64 // PPO: value clip ε_v around OldValues (≤ 0: no clip)
}

// LossStats are sums over the masked tokens of one Backward call.
type LossStats struct {
	Loss, Tokens, Clipped, KL, Entropy, Ratio float64
	// PPO: the sum of ½·max((V−R)², (clip(V)−R)²) (before VFCoef and Scale)
	// and the tokens whose clipped value term was the larger.
	ValueLoss, ValueClipped float64
}

// Add accumulates s2 into s.
func (s *LossStats) Add(s2 LossStats) {
	s.Loss += s2.Loss
	s.Tokens += s2.Tokens
	s.Clipped += s2.Clipped
	s.KL += s2.KL
	s.Entropy += s2.Entropy
	s.Ratio += s2.Ratio
	s.ValueLoss += s2.ValueLoss
	s.ValueClipped += s2.ValueClipped
}

// Backward computes the GRPO loss of seqs and accumulates its gradients:
// per masked token, −min(ρA, clip(ρ, 1−ε, 1+ε)A) + kl_coef·k3 − entropy_coef·H,
// summed and multiplied by opt.Scale. Gradients of successive calls add up in
// float32 whatever the policy's dtype. Call Step after the last micro-batch.
//
// With Returns (PPO; the policy needs a value head, AddValueHead) A is the
// token's TokenAdv and the clipped value loss
// VFCoef·½·max((V−R)², (clip(V, V_old±ValueClip)−R)²) of each masked token is
// added to the sum (docs/method.md, "PPO").
func (p *Policy) Backward(ctx context.Context, seqs []Sequence, opt LossOptions) (LossStats, error) {
	toks := make([][]int32, len(seqs))
	for i, s := range seqs {
		toks[i] = s.Tokens
	}
	pd, err := pad(toks)
	if err != nil {
		return LossStats{}, err
	}
	n := pd.batch * pd.width
	mask := make([]float32, n)
	adv := make([]float32, pd.batch)
	var old, ref []float32
	if seqs[0].OldLogp != nil {
		old = make([]float32, n)
	}
	if seqs[0].RefLogp != nil {
		ref = make([]float32, n)
	}
	var tadv, ret, oldv []float32 // PPO
	if seqs[0].Returns != nil {
		tadv, ret = make([]float32, n), make([]float32, n)
		if seqs[0].OldValues != nil {
			oldv = make([]float32, n)
		}
	}
	for b, s := range seqs {
		if len(s.Mask) != len(s.Tokens) {
			return LossStats{}, fmt.Errorf("torchbridge: sequence %d: mask has %d entries for %d tokens", b, len(s.Mask), len(s.Tokens))
		}
		if (s.OldLogp != nil) != (old != nil) || (s.RefLogp != nil) != (ref != nil) {
			return LossStats{}, fmt.Errorf("torchbridge: sequence %d: OldLogp/RefLogp must be given for all sequences or none", b)
		}
		for _, v := range [][]float32{s.OldLogp, s.RefLogp} {
			if v != nil && len(v) != len(s.Tokens) {
				return LossStats{}, fmt.Errorf("torchbridge: sequence %d: log-probs have %d entries for %d tokens", b, len(v), len(s.Tokens))
			}
		}
		pd.shift(b, s.Mask, mask)
		if old != nil {
			pd.shift(b, s.OldLogp, old)
		}
		if ref != nil {
			pd.shift(b, s.RefLogp, ref)
		}
		adv[b] = s.Advantage
		if (s.Returns != nil) != (ret != nil) || (s.OldValues != nil) != (oldv != nil) {
			return LossStats{}, fmt.Errorf("torchbridge: sequence %d: Returns/OldValues must be given for all sequences or none", b)
		}
		if ret != nil {
			if s.TokenAdv == nil {
				return LossStats{}, fmt.Errorf("torchbridge: sequence %d: PPO needs TokenAdv beside Returns", b)
			}
			for _, v := range [][]float32{s.TokenAdv, s.Returns, s.OldValues} {
				if v != nil && len(v) != len(s.Tokens) {
					return LossStats{}, fmt.Errorf("torchbridge: sequence %d: PPO inputs have %d entries for %d tokens", b, len(v), len(s.Tokens))
				}
			}
			pd.shift(b, s.TokenAdv, tadv)
			pd.shift(b, s.Returns, ret)
			if oldv != nil {
				pd.shift(b, s.OldValues, oldv)
			}
		}
	}
	co := C.rc_loss_opts{clip_eps: C.double(opt.ClipEps), kl_coef: C.double(opt.KLCoef),
		entropy_coef: C.double(opt.EntropyCoef), scale: C.double(opt.Scale), head_chunk: C.int64_t(opt.HeadChunk),
		vf_coef: C.double(opt.VFCoef), value_clip: C.double(opt.ValueClip)}
	var st C.rc_loss_stats
	err = p.call(ctx, func(h *C.rc_policy) error {
		var msg *C.char
		var ppo *C.rc_ppo_inputs
		if ret != nil {
			// The struct is Go memory holding Go pointers: they must be pinned.
			var pin runtime.Pinner
			defer pin.Unpin()
			for _, v := range [][]float32{tadv, ret, oldv} {
				if len(v) > 0 {
					pin.Pin(&v[0])
				}
			}
			ppo = &C.rc_ppo_inputs{adv: ptrF32(tadv), returns: ptrF32(ret), old_values: ptrF32(oldv)}
		}
		rc := C.rc_policy_backward(h, C.int64_t(pd.batch), C.int64_t(pd.width), ptrI32(pd.tokens), ptrI64(pd.lengths),
			ptrF32(mask), ptrF32(adv), ptrF32(old), ptrF32(ref), ppo, &co, &st, &msg)
		return status(rc, msg)
	})
	return LossStats{Loss: float64(st.loss), Tokens: float64(st.tokens), Clipped: float64(st.clipped),
		KL: float64(st.kl), Entropy: float64(st.entropy), Ratio: float64(st.ratio),
		ValueLoss: float64(st.value_loss), ValueClipped: float64(st.value_clipped)}, err
}

// Values returns, for each sequence, the value head's estimate of the state
// from which each token was drawn, indexed by token like ScoreMasked:
// values[b][t] is V(tokens[b][:t]), computed only for tokens whose mask is
// > 0 (masks nil: every token); index 0 and the others are 0. No gradients
// are kept. The policy needs a value head (AddValueHead).
func (p *Policy) Values(ctx context.Context, seqs [][]int32, masks [][]float32) ([][]float32, error) {
	pd, err := pad(seqs)
	if err != nil {
		return nil, err
	}
	var cmask []float32
	if masks != nil {
		cmask = make([]float32, pd.batch*pd.width)
		for b := range seqs {
			if len(masks[b]) != len(seqs[b]) {
				return nil, fmt.Errorf("torchbridge: sequence %d: mask has %d entries for %d tokens", b, len(masks[b]), len(seqs[b]))
			}
			pd.shift(b, masks[b], cmask)
		}
	}
	vals := make([]float32, pd.batch*pd.width)
	err = p.call(ctx, func(h *C.rc_policy) error {
		var msg *C.char
		rc := C.rc_policy_values(h, C.int64_t(pd.batch), C.int64_t(pd.width), ptrI32(pd.tokens), ptrI64(pd.lengths),
			ptrF32(cmask), ptrF32(vals), &msg)
		return status(rc, msg)
	})
	if err != nil {
		return nil, err
	}
	out := make([][]float32, pd.batch)
	for b, s := range seqs {
		out[b] = make([]float32, len(s))
		for t := 1; t < len(s); t++ {
			out[b][t] = vals[b*pd.width+t-1]
		}
	}
	return out, nil
}

// BackwardNLL accumulates the gradient of scale × (sum of −log p over masked
// tokens) and returns that NLL sum (unscaled) and the masked token count.
func (p *Policy) BackwardNLL(ctx context.Context, seqs [][]int32, masks [][]float32, scale float64, headChunk int) (nll, tokens float64, err error) {
	pd, err := pad(seqs)
	if err != nil {
		return 0, 0, err
	}
	mask := make([]float32, pd.batch*pd.width)
	for b := range seqs {
		if len(masks[b]) != len(seqs[b]) {
			return 0, 0, fmt.Errorf("torchbridge: sequence %d: mask has %d entries for %d tokens", b, len(masks[b]), len(seqs[b]))
		}
		pd.shift(b, masks[b], mask)
	}
	for _, m := range mask {
		if m > 0 {
			tokens++
		}
	}
	var out C.double
	err = p.call(ctx, func(h *C.rc_policy) error {
		var msg *C.char
		rc := C.rc_policy_backward_nll(h, C.int64_t(pd.batch), C.int64_t(pd.width), ptrI32(pd.tokens), ptrI64(pd.lengths),
			ptrF32(mask), C.double(scale), C.int64_t(headChunk), &out, &msg)
		return status(rc, msg)
	})
	return float64(out), tokens, err
}

// AdamW holds optimizer settings (PyTorch semantics, decoupled weight decay).
type AdamW struct {
	LR, Beta1, Beta2, Eps, WeightDecay float64
	MaxGradNorm                        float64 // ≤ 0: no clipping
	ValueLR                            float64 // learning rate of the value head (AddValueHead); ≤ 0: LR
}

// Step clips the accumulated gradient to MaxGradNorm, applies one AdamW
// update and clears the gradients. It returns the norm before clipping. A
// non-finite norm (see Skipped) means the update was skipped: weights and
// optimizer state are unchanged and the gradients are dropped; the caller
// must count and report it.
func (p *Policy) Step(ctx context.Context, o AdamW) (gradNorm float64, err error) {
	co := C.rc_adamw_opts{lr: C.double(o.LR), beta1: C.double(o.Beta1), beta2: C.double(o.Beta2), eps: C.double(o.Eps),
		weight_decay: C.double(o.WeightDecay), max_grad_norm: C.double(o.MaxGradNorm), value_lr: C.double(o.ValueLR)}
	var gn C.double
	err = p.call(ctx, func(h *C.rc_policy) error {
		var msg *C.char
		return status(C.rc_policy_step(h, &co, &gn, &msg), msg)
	})
	return float64(gn), err
}

// Skipped reports whether Step skipped its update: the gradient norm it
// returned is NaN or infinite.
func Skipped(gradNorm float64) bool { return math.IsNaN(gradNorm) || math.IsInf(gradNorm, 0) }

// ResetOptimizer gives the policy the AdamW state of a fresh optimizer:
// moments zero and step count 0, as a separate job starting from the current
// weights would have. Float32 master weights (bfloat16 policies) are kept.
func (p *Policy) ResetOptimizer(ctx context.Context) error {
	return p.call(ctx, func(h *C.rc_policy) error {
		var msg *C.char
		return status(C.rc_policy_reset_optimizer(h, &msg), msg)
	})
}

// PrepareUpdate allocates now the optimizer state the first update would
// allocate after its backward: zero moments and, for a bfloat16 policy,
// the float32 master weights (of this rank's share after ShardOptimizer).
// With several ranks, ProcessGroup.PrepareUpdate also makes the gradient
// buckets. It changes no value: the moments are a fresh optimizer's.
// Called before the first backward, these long-lived tensors are not
// placed after the backward's freed activations, which glibc keeps under
// UseTrainingMalloc: the peak is then the sum of what is live, as
// hfmodel.Config.PlanMemory plans it.
func (p *Policy) PrepareUpdate(ctx context.Context) error {
	return p.call(ctx, func(h *C.rc_policy) error {
		var msg *C.char
		return status(C.rc_policy_prepare_update(h, 0, &msg), msg)
	})
}

// OptimizerStep is the number of AdamW updates applied since the policy was
// created, its optimizer was loaded (LoadOptimizer) or reset.
func (p *Policy) OptimizerStep(ctx context.Context) (int64, error) {
	var st C.int64_t
	err := p.call(ctx, func(h *C.rc_policy) error {
		var msg *C.char
		return status(C.rc_policy_state_step(h, &st, &msg), msg)
	})
	return int64(st), err
}

// ZeroGrad drops accumulated gradients.
func (p *Policy) ZeroGrad(ctx context.Context) error {
	return p.call(ctx, func(h *C.rc_policy) error {
		var msg *C.char
		return status(C.rc_policy_zero_grad(h, &msg), msg)
	})
}
