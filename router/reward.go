package router

import (
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/recal-project/recal/data"
)

// Components are the raw reward components, in their fixed order: ReCal's
// five, then cost (not in the paper; its calibration weight is 0 by default).
var Components = []string{"ans", "info", "format", "route", "balance", "cost"}

// Rewards holds one response's raw reward components (before gating and
// calibration) and the exact match beside the answer F1.
type Rewards struct {
	Ans     float64 `json:"ans"`     // token F1 of the last <answer> against the golden answers
	Info    float64 `json:"info"`    // best F1 of the replies the pool returned (calls made and not failed)
	Format  float64 `json:"format"`  // 1 if the response is well formed, else 0
	Route   float64 `json:"route"`   // routing efficiency of the number of pool calls
	Balance float64 `json:"balance"` // mean of 1 − p(model) over the calls, p from EMA counts
	Cost    float64 `json:"cost"`    // cheapness: 1 − spend/(max_turns × the pool's dearest call), clipped to [0, 1] (CostReward)
	EM      float64 `json:"em"`      // exact match of the answer (logged, not a component)
}

// Get returns component m by name (one of Components).
func (r Rewards) Get(m string) float64 {
	switch m {
	case "ans":
		return r.Ans
	case "info":
		return r.Info
	case "format":
		return r.Format
	case "route":
		return r.Route
	case "balance":
		return r.Balance
	case "cost":
		return r.Cost
	}
	return 0
}

// RouteReward is the routing-efficiency component for k pool calls with at
// most maxTurns allowed: 0 when the pool was not used, otherwise
// 1 − (k−1)/maxTurns, so one call earns 1 and every further call costs
// 1/maxTurns (docs/method.md).
func RouteReward(k, maxTurns int) float64 {
	if k <= 0 || maxTurns <= 0 {
		return 0
	}
	return 1 - float64(k-1)/float64(maxTurns)
}

// CostReward is the cost component of a response that spent spend USD on
// pool calls (the sum of its calls' list-price Call.Cost; 0 with no call or
// only failed ones) when maxTurns calls were allowed and dearest USD is the
// pool's dearest single call about the question (llmpool.Pool.DearestCall):
//
//	r_cost = clip(1 − spend / (maxTurns · dearest), 0, 1)
//
// the share of the most the response could have spent that it left
// unspent, comparable across questions and pools whatever their prices. A
// response with no call gets 1; when maxTurns · dearest is 0 (every price 0,
// or no call allowed) there is nothing to save and every response gets 1
// (docs/method.md §4.6).
func CostReward(spend float64, maxTurns int, dearest float64) float64 {
	budget := float64(maxTurns) * dearest
	if !(budget > 0) {
		return 1
	}
	return min(max(1-spend/budget, 0), 1)
}

// Balance keeps exponentially decayed routing counts per pool model:
// c⁽ᵏ⁾ ← α·c⁽ᵏ⁾ + ĉ⁽ᵏ⁾ after each step, ĉ the step's calls to model k.
// Rewards within a step use the counts from before it.
type Balance struct {
	Decay  float64            `json:"decay"`  // α, ema_decay (0.9)
	Counts map[string]float64 `json:"counts"` // c⁽ᵏ⁾ by lower-case model name
}

// NewBalance starts with zero counts for the given models.
func NewBalance(decay float64, models []string) *Balance {
	b := &Balance{Decay: decay, Counts: map[string]float64{}}
	for _, m := range models {
		b.Counts[strings.ToLower(m)] = 0
	}
	return b
}

// Share is p⁽ᵏ⁾ = c⁽ᵏ⁾ / Σ c. Before any call was counted (Σ c = 0) every
// model has the uniform share 1/K.
func (b *Balance) Share(model string) float64 {
	var total float64
	for _, k := range slices.Sorted(maps.Keys(b.Counts)) { // a fixed order: a float sum depends on it, and runs must repeat exactly
		total += b.Counts[k]
	}
	if total <= 0 {
		if len(b.Counts) == 0 {
			return 0
		}
		return 1 / float64(len(b.Counts))
	}
	return b.Counts[strings.ToLower(model)] / total
}

// Reward is the balance component of a response that called models (one
// entry per call, repeats allowed): the mean of 1 − p⁽ᵏ⁾, or 0 with no call.
func (b *Balance) Reward(calls []string) float64 {
	if len(calls) == 0 {
		return 0
	}
	var s float64
	for _, m := range calls {
		s += 1 - b.Share(m)
	}
	return s / float64(len(calls))
}

// Update folds one step's calls into the counts: c ← α·c + ĉ.
func (b *Balance) Update(calls []string) {
	step := map[string]float64{}
	for _, m := range calls {
		step[strings.ToLower(m)]++
	}
	keys := make([]string, 0, len(b.Counts))
	for k := range b.Counts {
		keys = append(keys, k)
	}
	for k := range step {
		if _, ok := b.Counts[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		b.Counts[k] = b.Decay*b.Counts[k] + step[k]
	}
}

// Score computes the raw components of one finished response s (its Text:
// the policy's text and the inserted <information> blocks; its Calls; its
// End); known tells whether a model name belongs to the pool, and dearest
// is the pool's dearest single call about the question, USD (CostReward).
//
// Rewards pay only for what happened. Info is scored from the replies the
// pool returned for this response (Call.Reply, the text the policy was
// shown), never from <information> text in the response: a call that failed
// or named no pool model earns nothing, since its text is recal's failure
// message (which quotes what the policy wrote). A response that wrote
// <information> itself (End "information") is never well formed.
func Score(s *Sample, golden []string, maxTurns int, dearest float64, known func(string) bool, bal *Balance) Rewards {
	var r Rewards
	if ans, ok := LastAnswer(s.Text); ok {
		r.Ans = data.F1(ans, golden)
		r.EM = data.ExactMatch(ans, golden)
	}
	for _, c := range s.Calls {
		if c.Failed || c.Unknown {
			continue
		}
		if f := data.F1(c.Reply, golden); f > r.Info {
			r.Info = f
		}
	}
	if s.End != "information" && WellFormed(s.Text, known) {
		r.Format = 1
	}
	calls := s.CalledModels()
	r.Route = RouteReward(len(calls), maxTurns)
	r.Balance = bal.Reward(calls)
	var spend float64
	for _, c := range s.Calls {
		spend += c.Cost
	}
	r.Cost = CostReward(spend, maxTurns, dearest)
	return r
}
