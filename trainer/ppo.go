package trainer

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/router"
	"github.com/recal-project/recal/torchbridge"
)

// ppo is Router-R1's method (Zhang et al., "Router-R1: Teaching LLMs
// Multi-Round Routing and Aggregation via Reinforcement Learning", 2025; its
// train.sh runs verl's PPO with algorithm.adv_estimator=gae): the clipped
// objective of the ReCal paper's Eq. 3 with A_t from generalised advantage
// estimation (Schulman et al., "High-Dimensional Continuous Control Using
// Generalized Advantage Estimation", 2016) over the response's policy
// tokens, a critic trained on verl's clipped value loss, and Router-R1's
// reward: −1 for a malformed response, else the answer's F1 (or EM), with
// its optional cost term, on the last policy token, and verl's in-reward KL
// penalty on every policy token, weighed by ppo.kl_coef. The critic is a
// value head on the policy's own trunk (Router-R1's is a separate model
// initialised from the policy).
// docs/method.md, "PPO", has the formulas.
type ppo struct {
	cfg   config.PPO
	kl    float64 // ppo.kl_coef: β of the in-reward KL penalty (not train.kl_coef, GRPO's)
	micro int     // train.micro_batch: responses per forward pass of the values
}

func newPPO(cfg config.Training) algorithm {
	return ppo{cfg: cfg.PPO, kl: cfg.PPO.KLCoef, micro: cfg.Train.MicroBatch}
}

// ppoRecord is PPO's part of a rollouts.jsonl line: the response's reward,
// and per policy token, in order (the inserted <information> tokens are not
// in these lists), what GAE read and what the loss trained with.
// trainer/testdata/gae_reference.py recomputes the advantages and returns
// from the rewards, the KL terms and the values.
type ppoRecord struct {
	Score      float64   `json:"score"`        // Router-R1's outcome reward, given at the last policy token
	Cost       float64   `json:"cost"`         // the response's pool cost (USD, the sum over its calls)
	Cheapness  float64   `json:"cheapness"`    // c of the cost term: 1 − √cost normalised over the window
	Values     []float32 `json:"values"`       // V(s_t) before the update: the value of the state each token was drawn from
	KL         []float32 `json:"kl,omitempty"` // log π_old − log π_ref, the in-reward KL (absent without a reference)
	Advantages []float32 `json:"advantages"`   // the advantage of each token as the loss used it (whitened)
	Returns    []float32 `json:"returns"`      // the value targets R_t = A_t + V(s_t), before whitening
}

// PPOMetrics are PPO's numbers in metrics.jsonl (absent for GRPO).
type PPOMetrics struct {
	ValueLoss         float64 `json:"value_loss"`         // ½·max((V−R)², (clip(V)−R)²), mean over the step's policy tokens and updates
	ValueClipFrac     float64 `json:"value_clip_frac"`    // share of those tokens whose clipped value term was the larger
	ExplainedVariance float64 `json:"explained_variance"` // 1 − Var(R − V)/Var(R) over the policy tokens, V before the update
	Value             float64 `json:"value_mean"`         // mean V over the policy tokens, before the update
	Return            float64 `json:"return_mean"`        // mean R over the policy tokens
	Score             float64 `json:"score"`              // mean outcome reward of the responses
}

func (a ppo) prepare(p *torchbridge.Policy, dir string, resumed bool) error {
	if err := p.AddValueHead(); err != nil {
		return err
	}
	path := filepath.Join(dir, torchbridge.ValueHeadFile)
	_, err := os.Stat(path)
	switch {
	case err == nil:
		return p.LoadValueHead(path)
	case resumed && errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("trainer: %s lacks %s: not a checkpoint of a train.algorithm = \"ppo\" run", dir, torchbridge.ValueHeadFile)
	case errors.Is(err, fs.ErrNotExist):
		return nil // a fresh value head: every value starts at 0
	}
	return fmt.Errorf("trainer: %w", err)
}

func (a ppo) advantages(ctx context.Context, p *torchbridge.Policy, b *stepBatch) error {
	if err := oldValues(ctx, p, b.seqs, a.micro); err != nil {
		return err
	}
	a.fill(b)
	return nil
}

// oldValues sets OldValues of seqs: V(s_t) of every policy token under the
// weights that sampled the batch, micro responses per forward pass.
func oldValues(ctx context.Context, p *torchbridge.Policy, seqs []torchbridge.Sequence, micro int) error {
	return perMicroBatch(seqs, micro, func(toks [][]int32, masks [][]float32) ([][]float32, error) {
		return p.Values(ctx, toks, masks)
	}, func(s *torchbridge.Sequence, row []float32) { s.OldValues = row })
}

// fill computes, for a batch whose OldValues are set, the rewards (the cost
// window moves on), GAE and the whitening over the batch's tokens, and
// fills the sequences' TokenAdv and Returns, b.logged and b.ppo.
func (a ppo) fill(b *stepBatch) {
	in := make([]gaeInput, len(b.seqs))
	b.ppo = make([]*ppoRecord, len(b.seqs))
	for i, s := range b.seqs {
		cost := 0.0
		for _, c := range b.samples[i].Calls {
			cost += c.Cost
		}
		var cheap float64
		b.st.PPOCostWindow, cheap = cheapness(b.st.PPOCostWindow, cost, a.cfg.CostWindow)
		rec := &ppoRecord{Score: routerR1Score(b.rewards[i], a.cfg.Outcome, a.cfg.CostCoef, cheap), Cost: cost, Cheapness: cheap,
			Values: []float32{}}
		// Tokens a decoding constraint chose (router.Sample.Constrained:
		// every token under router.answer_span or router.search_names,
		// those a router.call_first or router.match_close ban can have
		// moved by more than 0.1 nats) carry no KL penalty: their
		// log-probs are the unconstrained policy's, and the penalty
		// −β·(log π − log π_ref) would pay the policy for pushing a token
		// it cannot avoid ever further down (Router-R1 collapsed so on
		// the EVOUNA world).
		constrained := map[int]bool{}
		// The response follows the prompt; a gathered sample keeps its Mask
		// (one entry per response token), not its Tokens (record).
		off := len(s.Tokens) - len(b.samples[i].Mask)
		for _, j := range b.samples[i].Constrained {
			constrained[off+j] = true
		}
		for t := range s.Tokens {
			if t == 0 || s.Mask[t] <= 0 {
				continue
			}
			rec.Values = append(rec.Values, s.OldValues[t])
			if s.RefLogp != nil {
				kl := s.OldLogp[t] - s.RefLogp[t]
				if constrained[t] {
					kl = 0
				}
				rec.KL = append(rec.KL, kl)
			}
		}
		in[i] = gaeInput{score: rec.Score, values: rec.Values, kl: rec.KL}
		b.ppo[i] = rec
	}
	adv, ret := gae(in, a.kl, a.cfg.Gamma, a.cfg.Lam, a.cfg.WhitenAdvantages)
	b.logged.Advantages = make([]float64, len(b.seqs))
	for i := range b.seqs {
		s := &b.seqs[i]
		rec := b.ppo[i]
		s.TokenAdv, s.Returns = make([]float32, len(s.Tokens)), make([]float32, len(s.Tokens))
		rec.Advantages, rec.Returns = make([]float32, len(adv[i])), make([]float32, len(adv[i]))
		k := 0
		for t := range s.Tokens {
			if t == 0 || s.Mask[t] <= 0 {
				continue
			}
			s.TokenAdv[t], s.Returns[t] = float32(adv[i][k]), float32(ret[i][k])
			rec.Advantages[k], rec.Returns[k] = s.TokenAdv[t], s.Returns[t]
			k++
		}
		if k > 0 {
			b.logged.Advantages[i] = adv[i][0] // the response's advantage: that of its first token
		}
	}
}

// The KL is in the reward (verl's use_kl_in_reward, as Router-R1 trains),
// so the loss has none; the value loss joins the policy loss.
func (a ppo) loss(lo torchbridge.LossOptions) torchbridge.LossOptions {
	lo.KLCoef, lo.VFCoef, lo.ValueClip = 0, a.cfg.VFCoef, a.cfg.ValueClip
	return lo
}

func (a ppo) adamW(o torchbridge.AdamW) torchbridge.AdamW {
	o.ValueLR = a.cfg.ValueLR
	return o
}

func (a ppo) metrics(b *stepBatch, loss torchbridge.LossStats, m *Metrics) {
	pm := &PPOMetrics{}
	if loss.Tokens > 0 {
		pm.ValueLoss, pm.ValueClipFrac = finite(loss.ValueLoss/loss.Tokens), finite(loss.ValueClipped/loss.Tokens)
	}
	var vals, rets []float64
	for _, r := range b.ppo {
		pm.Score += r.Score / float64(len(b.ppo))
		for k := range r.Values {
			vals, rets = append(vals, float64(r.Values[k])), append(rets, float64(r.Returns[k]))
		}
	}
	pm.ExplainedVariance = explainedVariance(vals, rets)
	pm.Value, pm.Return = mean(vals), mean(rets)
	m.PPOMetrics = pm
}

// routerR1Score is Router-R1's outcome reward (its RewardManager with
// reward_metric f1 or em): −1 for a response that is not well formed (its
// format reward −1), 0 for a well-formed one whose answer scores 0, else
// (1−α)·outcome + α·cheap, α = ppo.cost_coef.
func routerR1Score(r router.Rewards, outcome string, alpha, cheap float64) float64 {
	if r.Format < 1 {
		return -1
	}
	o := r.Ans
	if outcome == "em" {
		o = r.EM
	}
	if o == 0 {
		return 0
	}
	return (1-alpha)*o + alpha*cheap
}

// cheapness is Router-R1's normalised cost reward (normalize_reward): √cost
// joins the window of the last size responses' √cost (oldest first), then
// c = 1 − clip((√cost − p5)/(p95 − p5), 0, 1) with p5 and p95 the window's
// 5th and 95th percentiles (linear interpolation, numpy's default), or 0.5
// when p95 − p5 < 1e-8. It returns the new window and c.
func cheapness(window []float64, cost float64, size int) ([]float64, float64) {
	r := math.Sqrt(math.Max(cost, 0))
	window = append(window, r)
	if len(window) > size {
		window = slices.Clone(window[len(window)-size:])
	}
	sorted := slices.Sorted(slices.Values(window))
	lo, hi := percentile(sorted, 5), percentile(sorted, 95)
	if hi-lo < 1e-8 {
		return window, 0.5
	}
	return window, 1 - math.Min(math.Max((r-lo)/(hi-lo), 0), 1)
}

// percentile is numpy.percentile's linear interpolation on sorted values.
func percentile(sorted []float64, q float64) float64 {
	pos := float64(len(sorted)-1) * q / 100
	i := int(math.Floor(pos))
	if i+1 >= len(sorted) {
		return sorted[len(sorted)-1]
	}
	return sorted[i] + (sorted[i+1]-sorted[i])*(pos-float64(i))
}

// gaeInput is one response for gae: its outcome reward, and per policy
// token in order the value of its state and its KL term (nil: none).
type gaeInput struct {
	score  float64
	values []float32
	kl     []float32
}

// gae computes GAE(γ, λ) per response over its policy tokens k = 1..n:
//
//	r_k = −β·kl_k + [k = n]·score
//	δ_k = r_k + γ·V_{k+1} − V_k        (V_{n+1} = 0)
//	A_k = δ_k + γλ·A_{k+1}            (A_{n+1} = 0)
//	R_k = A_k + V_k
//
// (verl's compute_gae_advantage_return with the observation tokens skipped:
// the chain runs from one policy token to the next). With whiten, the
// advantages of all the batch's tokens are then standardised as verl's
// masked_whiten does: (A − μ)/√(σ² + 1e−8), σ² the unbiased variance (μ,
// σ² over every token; with a single token σ² = 0). Returns keep the raw A.
// Sums run in input order.
func gae(in []gaeInput, beta, gamma, lam float64, whiten bool) (adv, ret [][]float64) {
	adv, ret = make([][]float64, len(in)), make([][]float64, len(in))
	for i, r := range in {
		n := len(r.values)
		adv[i], ret[i] = make([]float64, n), make([]float64, n)
		next, last := 0.0, 0.0
		for k := n - 1; k >= 0; k-- {
			rew := 0.0
			if r.kl != nil {
				rew = -beta * float64(r.kl[k])
			}
			if k == n-1 {
				rew += r.score
			}
			v := float64(r.values[k])
			delta := rew + gamma*next - v
			last = delta + gamma*lam*last
			adv[i][k], ret[i][k] = last, last+v
			next = v
		}
	}
	if !whiten {
		return adv, ret
	}
	var sum, count float64
	for _, a := range adv {
		for _, x := range a {
			sum += x
			count++
		}
	}
	if count == 0 {
		return adv, ret
	}
	mu := sum / count
	var sq float64
	for _, a := range adv {
		for _, x := range a {
			sq += (x - mu) * (x - mu)
		}
	}
	variance := sq / count
	if count > 1 {
		variance *= count / (count - 1)
	} else {
		variance = 0
	}
	inv := 1 / math.Sqrt(variance+1e-8)
	for _, a := range adv {
		for k := range a {
			a[k] = (a[k] - mu) * inv
		}
	}
	return adv, ret
}

// explainedVariance is verl's critic/vf_explained_var:
// 1 − Var(R − V)/(Var(R) + 1e-5), unbiased variances; 0 with fewer than two tokens.
func explainedVariance(values, returns []float64) float64 {
	if len(values) < 2 {
		return 0
	}
	diff := make([]float64, len(values))
	for i := range values {
		diff[i] = returns[i] - values[i]
	}
	return finite(1 - variance(diff)/(variance(returns)+1e-5))
}

func mean(x []float64) float64 {
	if len(x) == 0 {
		return 0
	}
	var s float64
	for _, v := range x {
		s += v
	}
	return s / float64(len(x))
}

// variance is the unbiased (n − 1) variance, as torch.var.
func variance(x []float64) float64 {
	m := mean(x)
	var s float64
	for _, v := range x {
		s += (v - m) * (v - m)
	}
	return s / float64(len(x)-1)
}
