package rollout

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/generate"
	"github.com/recal-project/recal/llmpool"
	"github.com/recal-project/recal/router"
	"github.com/recal-project/recal/torchbridge"
)

// Env is the routing environment of a policy: the LLM pool, the prompt and
// the protocol's settings.
type Env struct {
	Engine *Engine
	Pool   *llmpool.Pool
	Prompt *router.Prompt
	Router router.Config
	// DecodeThreads is the CPU thread count of Roll and RollRows
	// (policy.decode_threads; 0 = whatever the process uses).
	DecodeThreads int
	// RolloutWorkers is the number of threads that decode the rows of
	// Roll and RollRows at once when they decode on one thread and ask for
	// log-probs (policy.rollout_workers; 0 = the process's thread count).
	RolloutWorkers int
	// MaxRows is the most rows RollRows decodes at once (train.rollout_rows
	// for the GRPO rollouts; 0 = all): more responses run in consecutive
	// rounds of at most MaxRows, each in a KV cache of its own that is
	// freed before the next. Each response samples as in one round.
	MaxRows int

	// ModelSubsets is train.model_subsets for the training rollouts
	// (RollRows; 0 elsewhere): the share of questions whose prompt lists a
	// random subset of the pool (ModelSubset).
	ModelSubsets float64

	// MaxCostUSD is each response's pool budget in USD (0 = none), as
	// `recal serve`'s per-request recal.max_cost_usd: once a response's
	// calls have spent it, a further <search> makes no call and shows
	// router.BudgetText. Evaluation at a budget (`recal frontier
	// --budgets`) sets it; training never does.
	MaxCostUSD float64

	mu            sync.Mutex
	prompts       map[string][]int32        // prompt tokens by question id (and subset)
	subsetPrompts map[string]*router.Prompt // prompts by the subset they list
}

// AnswerBank collects golden answers per dataset, from which simulated pool
// models draw plausible wrong answers.
func AnswerBank(sets ...[]data.Example) map[string][]string {
	bank := map[string][]string{}
	for _, set := range sets {
		for _, ex := range set {
			if len(ex.Golden) > 0 {
				bank[ex.Dataset] = append(bank[ex.Dataset], ex.Golden[0])
			}
		}
	}
	return bank
}

// NewEnv builds the pool (API keys are read from the environment here, before
// any work) and the prompt.
func NewEnv(rc config.Rollout, eng *Engine, bank map[string][]string, log *slog.Logger) (*Env, error) {
	pool, err := llmpool.New(rc.Pool, llmpool.WithLogger(log), llmpool.WithAnswerBank(bank))
	if err != nil {
		return nil, err
	}
	prompt, err := router.NewPrompt(rc.Router.PromptTemplate, pool.Models(), rc.Router.MaxTurns)
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &Env{Engine: eng, Pool: pool, Prompt: prompt, Router: rc.Router, DecodeThreads: rc.Policy.DecodeThreads,
		RolloutWorkers: rc.Policy.RolloutWorkers, prompts: map[string][]int32{}}, nil
}

// CheckPool builds the pool once to surface configuration and environment
// errors (a missing API-key variable) before any work starts.
func CheckPool(pc llmpool.Config) error {
	pool, err := llmpool.New(pc)
	if err != nil {
		return err
	}
	return pool.Close()
}

// Close closes the pool.
func (e *Env) Close() error { return e.Pool.Close() }

// Known reports whether a model name belongs to the pool.
func (e *Env) Known(name string) bool {
	_, ok := e.Pool.Lookup(name)
	return ok
}

// PromptTokens returns (and caches) a question's prompt tokens.
func (e *Env) PromptTokens(ex data.Example) ([]int32, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if p, ok := e.prompts[ex.ID]; ok {
		return p, nil
	}
	ids, err := e.Prompt.Tokens(e.Engine.Tok, ex.Question) // the question as plain text
	if err != nil {
		return nil, err
	}
	p := ToInt32(ids)
	if len(p)+e.Router.Capacity() > e.Engine.CtxLen {
		return nil, fmt.Errorf("rollout: question %s: prompt of %d tokens plus %d response tokens exceed the policy's context of %d", ex.ID, len(p), e.Router.Capacity(), e.Engine.CtxLen)
	}
	e.prompts[ex.ID] = p
	return p, nil
}

// Question converts an example for the pool.
func Question(ex data.Example) llmpool.Question {
	return llmpool.Question{ID: ex.ID, Dataset: ex.Dataset, Text: ex.Question, Golden: ex.Golden}
}

// Roll runs the routing protocol for g responses to each question, in one
// KV cache: response i·g+j is sample j of question i. logp asks for the
// log-probabilities of the sampled tokens (the loss needs them).
func (e *Env) Roll(ctx context.Context, qs []data.Example, g int, s generate.Sampling, seed uint64, logp bool) ([]router.Sample, router.Stats, error) {
	return e.RollRows(ctx, qs, g, s, seed, logp, 0)
}

// RollRows is Roll for the responses [first, first+len(qs)·g) of a larger
// batch: each samples what response first+k of that batch would (see
// Decoder.RowBase), so a data-parallel rank rolls out its share exactly as
// one process rolls out the whole batch. In a training environment with
// train.model_subsets, a question's prompt and the models its g responses
// may call are ModelSubset's for seed and its id. It decodes on e.DecodeThreads
// threads and restores the count before it returns; with log-probs on one
// thread, e.RolloutWorkers threads decode shares of the rows at once.
func (e *Env) RollRows(ctx context.Context, qs []data.Example, g int, s generate.Sampling, seed uint64, logp bool, first int) (out []router.Sample, st router.Stats, err error) {
	workers := 1
	if logp && e.DecodeThreads == 1 {
		if workers = e.RolloutWorkers; workers == 0 {
			if workers, err = torchbridge.Threads(); err != nil {
				return nil, router.Stats{}, err
			}
		}
	}
	restore, err := DecodeThreads(e.DecodeThreads)
	if err != nil {
		return nil, router.Stats{}, err
	}
	defer func() {
		if rerr := restore(); err == nil {
			err = rerr
		}
	}()
	var jobs []router.Job
	longest := 0
	for _, q := range qs {
		p, models, _, err := e.RowPrompt(q, seed)
		if err != nil {
			return nil, router.Stats{}, err
		}
		longest = max(longest, len(p))
		for range g {
			jobs = append(jobs, router.Job{Question: Question(q), Prompt: p, Models: models, MaxCostUSD: e.MaxCostUSD})
		}
	}
	capacity := min(longest+e.Router.Capacity(), e.Engine.CtxLen)
	round := len(jobs)
	if e.MaxRows > 0 {
		round = min(round, e.MaxRows)
	}
	// The KV cache of a round is freed when the round ends: nothing of the
	// rollouts stays in memory for the update.
	for lo := 0; lo < len(jobs); lo += round {
		hi := min(lo+round, len(jobs))
		part, pst, err := e.rollRound(ctx, jobs[lo:hi], capacity, s, seed, logp, first+lo, workers)
		out = append(out, part...)
		st.Wall += pst.Wall
		st.Decode += pst.Decode
		st.SlowestSum += pst.SlowestSum
		st.Calls += pst.Calls
		if err != nil {
			return out, st, err
		}
	}
	if out == nil {
		out = []router.Sample{}
	}
	return out, st, nil
}

// rollRound decodes jobs, rows first.. of the batch, in a KV cache of their
// own, freed before it returns.
func (e *Env) rollRound(ctx context.Context, jobs []router.Job, capacity int, s generate.Sampling, seed uint64, logp bool, first, workers int) ([]router.Sample, router.Stats, error) {
	cache, err := e.Engine.Policy.NewCache(len(jobs), capacity)
	if err != nil {
		return nil, router.Stats{}, err
	}
	defer cache.Close()
	return router.Rollout(ctx, Decoder{C: cache, Logp: logp, RowBase: first, Workers: workers}, e.Engine.Tok, e.Pool, e.Router, jobs, s, e.Engine.EOS, seed)
}

// WithBudget returns an environment sharing e's policy, pool, prompt and
// protocol whose responses each have a pool budget of usd (MaxCostUSD).
func (e *Env) WithBudget(usd float64) *Env {
	c := e.WithPrompt(e.Prompt, e.Router)
	c.ModelSubsets, c.MaxCostUSD = e.ModelSubsets, usd
	return c
}

// WithPrompt returns an environment sharing e's policy and pool but with
// another prompt and protocol settings (e.g. no models and no calls).
func (e *Env) WithPrompt(p *router.Prompt, rc router.Config) *Env {
	return &Env{Engine: e.Engine, Pool: e.Pool, Prompt: p, Router: rc, DecodeThreads: e.DecodeThreads, RolloutWorkers: e.RolloutWorkers,
		MaxRows: e.MaxRows, MaxCostUSD: e.MaxCostUSD, prompts: map[string][]int32{}}
}
