package eval

import (
	"context"
	"errors"
	"fmt"

	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/eval/baselines"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/llmpool"
	"github.com/recal-project/recal/router"
)

// The cascade baseline (baselines.CascadeRule: FrugalGPT's LLM cascade)
// asks the chain's models in order, each with the question as the query,
// and stops when the rule fitted on the outcome matrix of Setup.Outcomes
// (`recal collect --out`) trusts the latest answer at Setup.CascadeThreshold.
// The answer is the last asked model's extracted answer; the cost and the
// calls are every call made.

// cascadeRouter routes with a fitted cascade.
type cascadeRouter struct {
	s    Setup
	rule *baselines.CascadeRule
}

// fitCascade fits the cascade on s.Outcomes, checking its threshold.
func fitCascade(s Setup) (*baselines.CascadeRule, error) {
	if err := baselines.CheckThreshold("--cascade-threshold", s.CascadeThreshold); err != nil {
		return nil, fmt.Errorf("eval: router cascade: %w", err)
	}
	if s.Outcomes == "" {
		return nil, errors.New("eval: router cascade needs an outcome matrix to fit its stopping rule on: " +
			"`recal collect --config CONFIG --out OUTCOMES`, then --outcomes OUTCOMES")
	}
	m, err := baselines.LoadMatrix(s.Outcomes)
	if err != nil {
		return nil, fmt.Errorf("eval: router cascade: %w", err)
	}
	rule, err := baselines.FitCascade(m)
	if err != nil {
		return nil, fmt.Errorf("eval: router cascade: %w", err)
	}
	return rule, nil
}

func newCascade(s Setup) (Router, error) {
	rule, err := fitCascade(s)
	if err != nil {
		return nil, err
	}
	for _, m := range rule.Chain {
		if _, ok := s.Env.Pool.Lookup(m); !ok {
			return nil, fmt.Errorf("eval: router cascade: the outcome matrix %s holds model %q, which the pool lacks; collect this pool's outcomes", s.Outcomes, m)
		}
	}
	return cascadeRouter{s: s, rule: rule}, nil
}

func (c cascadeRouter) Answer(ctx context.Context, qs []data.Example) ([]rollout.QuestionResult, error) {
	out := make([]rollout.QuestionResult, len(qs))
	replies := make([][]string, len(qs))
	active := make([]int, len(qs))
	for i, q := range qs {
		out[i] = rollout.QuestionResult{ID: q.ID, Dataset: q.Dataset, Question: q.Question, Golden: q.Golden, WellFormed: true}
		active[i] = i
	}
	for k, model := range c.rule.Chain {
		if len(active) == 0 {
			break
		}
		reqs := make([]llmpool.Request, len(active))
		for a, i := range active {
			qq := rollout.Question(qs[i])
			reqs[a] = llmpool.Request{Model: model, Query: qs[i].Question, Question: &qq}
		}
		resps := c.s.Env.Pool.CallBatch(ctx, reqs)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var next []int
		for a, i := range active {
			r := resps[a]
			ans := ExtractAnswer(r.Text)
			if r.Failed {
				ans = ""
			}
			res := &out[i]
			call := router.Call{Model: r.Model, Query: qs[i].Question, Reply: r.Text, Evidence: r.Evidence, Failed: r.Failed,
				Cached: r.Cached, Cost: r.Cost, Latency: r.Latency}
			res.Calls = append(res.Calls, call)
			res.Cost += r.Cost
			res.Answer, res.Response = ans, r.Text
			support := 0
			if !r.Failed {
				support = baselines.Support(call.Written(), replies[i])
				replies[i] = append(replies[i], call.Written())
			}
			if c.rule.Stop(k, support, c.s.CascadeThreshold) {
				continue
			}
			next = append(next, i)
		}
		active = next
	}
	for i := range out {
		r := &out[i]
		r.EM, r.F1 = data.ExactMatch(r.Answer, r.Golden), data.F1(r.Answer, r.Golden)
		r.WellFormed = len(r.Calls) > 0 && !r.Calls[len(r.Calls)-1].Failed
	}
	return out, nil
}
