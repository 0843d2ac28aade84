package rollout

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/recal-project/recal/internal/generate"
	"github.com/recal-project/recal/llmpool"
	"github.com/recal-project/recal/router"
	"github.com/recal-project/recal/torchbridge"
)

// ErrInvalidQuery marks a query the service cannot run as asked, which is
// the asker's fault: a question too long for the KV cache's rows, a model
// not in the pool, limits out of range. `recal serve` answers it 400.
var ErrInvalidQuery = errors.New("rollout: invalid query")

// ServiceQuestionTokens is the room the service's KV cache leaves for a
// question's tokens in each row, on top of the prompt with every pool model
// and the responses' capacity (router.Config.Capacity), within the policy's
// context. A longer question gets ErrInvalidQuery.
const ServiceQuestionTokens = 1024

// promptCacheSize bounds the prompts the service keeps, one per (model
// subset, max turns) asked for; beyond it prompts are built per query.
const promptCacheSize = 256

// ServiceQuery is one question for the service.
type ServiceQuery struct {
	Question string
	// Models are the pool models the router may call (the prompt lists only
	// these, in the pool's order; names as Pool.Lookup accepts them); nil
	// or empty means all. A <search> naming another model is treated like
	// an unknown model: a failure observation and no call.
	Models []string
	// MaxTurns caps the pool calls (≤ router.max_turns); 0 means the
	// configured router.max_turns. The prompt states the cap.
	MaxTurns int
	// MaxCostUSD is the pool budget in USD; 0 means none. Once the calls so
	// far cost that much, a further <search> makes no call and is answered
	// with router.BudgetText (see router.RowOptions.MaxCostUSD).
	MaxCostUSD float64
	// Sampling is the policy's sampling; Temperature 0 is greedy.
	Sampling generate.Sampling
	// MaxTokens caps the tokens the policy writes; 0 means none. Reaching it
	// ends the response (End "length" unless that token completed an answer).
	MaxTokens int
	// OnCall is called with each entry of Sample.Calls as soon as it is known
	// (on the goroutine that waited for the pool; it must not block); may be
	// nil.
	OnCall func(router.Call)
	// Pool, when not nil, is the question as simulated pool models see it
	// (id, dataset, golden answers), for evaluating through the service;
	// nil means Question alone. Its Text should be Question.
	Pool *llmpool.Question
}

// ServiceAnswer is the service's response to a ServiceQuery.
type ServiceAnswer struct {
	// Answer is the <answer> content ("" when the response has none).
	Answer string
	// Sample is the whole response: Text, Calls (model, query, latency,
	// cost, cached, failed, tokens), End.
	Sample router.Sample
	// PolicyPromptTokens are the prompt's tokens; PolicyCompletionTokens the
	// tokens the policy wrote (the inserted <information> blocks are in
	// neither).
	PolicyPromptTokens, PolicyCompletionTokens int
	// PoolPromptTokens and PoolCompletionTokens sum the pool calls' tokens.
	PoolPromptTokens, PoolCompletionTokens int
	// CostUSD sums the pool calls' list-price cost.
	CostUSD float64
}

// Service answers questions with the policy for a server: queries that
// arrive at any time decode together as rows of one KV cache (admitted
// between decode steps, removed when done), while their pool calls run
// concurrently, on the same scheduler (router.Scheduler) as training rollouts.
// Answer and Stats are safe for concurrent use.
type Service struct {
	env      *Env
	cache    *torchbridge.Cache
	sched    *router.Scheduler
	capacity int // tokens per cache row
	ran      atomic.Bool

	mu      sync.Mutex
	prompts map[string]*router.Prompt
}

// resettable is the policy's cache as the scheduler drives it.
type resettable struct{ Decoder }

func (d resettable) Reset(ctx context.Context, rows ...int) error { return d.C.Reset(ctx, rows...) }

// NewService makes a service of maxBatch rows decoding together: a KV cache
// of maxBatch rows, each of the longest prompt (every pool model and
// ServiceQuestionTokens of question) plus the router's capacity, bounded by
// the policy's context. At most maxSamplings distinct sampling settings
// decode together (each is a decode call of its own per step); a query with
// another waits for a row, first come, first served
// (router.SchedulerOptions.MaxSamplings). seed seeds sampling; it advances per
// decode step, so a sampled answer depends on the other rows' timing. The
// cache is freed when Run returns.
func (e *Env) NewService(maxBatch, maxSamplings int, seed uint64) (*Service, error) {
	if maxBatch < 1 {
		return nil, fmt.Errorf("rollout: service: max batch %d, want ≥ 1", maxBatch)
	}
	if maxSamplings < 1 {
		return nil, fmt.Errorf("rollout: service: max samplings %d, want ≥ 1", maxSamplings)
	}
	base, err := e.Prompt.Tokens(e.Engine.Tok, "")
	if err != nil {
		return nil, err
	}
	need := len(base) + e.Router.Capacity()
	if need > e.Engine.CtxLen {
		return nil, fmt.Errorf("rollout: service: the prompt (%d tokens) and a response (%d) exceed the policy's context of %d tokens",
			len(base), e.Router.Capacity(), e.Engine.CtxLen)
	}
	capacity := min(need+ServiceQuestionTokens, e.Engine.CtxLen)
	cache, err := e.Engine.Policy.NewCache(maxBatch, capacity)
	if err != nil {
		return nil, err
	}
	sched, err := router.NewScheduler(resettable{Decoder{C: cache}}, e.Engine.Tok, e.Pool, e.Router,
		router.SchedulerOptions{Rows: maxBatch, EOS: e.Engine.EOS, Seed: seed, StepSeeds: true, MaxSamplings: maxSamplings})
	if err != nil {
		cache.Close()
		return nil, err
	}
	return &Service{env: e, cache: cache, sched: sched, capacity: capacity, prompts: map[string]*router.Prompt{}}, nil
}

// Run is the decode loop: all the policy's work happens here (on its torch
// thread). It returns after ctx is done and the rows in flight have ended
// (their queries fail with router.ErrStopped, their pool calls cancelled),
// or when a decode step fails (every query in flight or waiting gets that
// error). It frees the KV cache; a Service runs once.
func (s *Service) Run(ctx context.Context) error {
	if s.ran.Swap(true) {
		return errors.New("rollout: service: Run called twice")
	}
	defer s.cache.Close()
	return s.sched.Run(ctx)
}

// Stats reports the rows decoding and the queries waiting for a row.
func (s *Service) Stats() (active, waiting int) { return s.sched.Load() }

// Answer runs the routing protocol for one question. It blocks until a row
// is free and the answer is done; cancelling ctx cancels the row and its
// pending pool call and returns ctx's error. Errors that are the query's
// fault wrap ErrInvalidQuery.
func (s *Service) Answer(ctx context.Context, q ServiceQuery) (ServiceAnswer, error) {
	rc := s.env.Router
	switch {
	case q.MaxTurns < 0 || q.MaxTurns > rc.MaxTurns:
		return ServiceAnswer{}, fmt.Errorf("%w: max turns %d: want 0 (configured) to %d", ErrInvalidQuery, q.MaxTurns, rc.MaxTurns)
	case q.MaxTurns > 0:
		rc.MaxTurns = q.MaxTurns
	}
	models, err := s.subset(q.Models)
	if err != nil {
		return ServiceAnswer{}, err
	}
	prompt, err := s.prompt(models, rc.MaxTurns)
	if err != nil {
		return ServiceAnswer{}, err
	}
	ids, err := prompt.Tokens(s.env.Engine.Tok, q.Question) // the question as plain text
	if err != nil {
		return ServiceAnswer{}, err
	}
	if len(ids)+rc.Capacity() > s.capacity {
		return ServiceAnswer{}, fmt.Errorf("%w: the prompt of %d tokens plus %d response tokens exceed the %d tokens of a row (the policy's context is %d)",
			ErrInvalidQuery, len(ids), rc.Capacity(), s.capacity, s.env.Engine.CtxLen)
	}
	pq := llmpool.Question{Text: q.Question}
	if q.Pool != nil {
		pq = *q.Pool
	}
	opt := router.RowOptions{MaxTurns: rc.MaxTurns, MaxCostUSD: q.MaxCostUSD, MaxTokens: q.MaxTokens, Sampling: q.Sampling, OnCall: q.OnCall}
	if len(q.Models) > 0 {
		for _, m := range models {
			opt.Models = append(opt.Models, m.Name)
		}
	}
	sample, err := s.sched.Do(ctx, router.Job{Question: pq, Prompt: ToInt32(ids)}, opt)
	if errors.Is(err, router.ErrInvalidRow) {
		return ServiceAnswer{}, fmt.Errorf("%w: %w", ErrInvalidQuery, err)
	}
	if err != nil {
		return ServiceAnswer{}, err
	}
	a := ServiceAnswer{Sample: sample, PolicyPromptTokens: len(ids)}
	a.Answer, _ = router.LastAnswer(sample.Text)
	for _, m := range sample.Mask {
		if m != 0 {
			a.PolicyCompletionTokens++
		}
	}
	for _, c := range sample.Calls {
		a.PoolPromptTokens += c.PromptTokens
		a.PoolCompletionTokens += c.CompletionTokens
		a.CostUSD += c.Cost
	}
	return a, nil
}

// subset returns the pool models named, in the pool's order (all of them
// for none).
func (s *Service) subset(names []string) ([]llmpool.ModelInfo, error) {
	all := s.env.Pool.Models()
	if len(names) == 0 {
		return all, nil
	}
	want := map[string]bool{}
	for _, n := range names {
		info, ok := s.env.Pool.Lookup(n)
		if !ok {
			return nil, fmt.Errorf("%w: model %q is not in the pool", ErrInvalidQuery, n)
		}
		want[info.Name] = true
	}
	var out []llmpool.ModelInfo
	for _, m := range all {
		if want[m.Name] {
			out = append(out, m)
		}
	}
	return out, nil
}

// prompt returns the prompt listing models with maxTurns: the environment's
// own (the one training used) for every model and the configured turns.
func (s *Service) prompt(models []llmpool.ModelInfo, maxTurns int) (*router.Prompt, error) {
	if len(models) == len(s.env.Pool.Models()) && maxTurns == s.env.Router.MaxTurns {
		return s.env.Prompt, nil
	}
	names := make([]string, len(models))
	for i, m := range models {
		names[i] = m.Name
	}
	key := fmt.Sprintf("%d\x00%s", maxTurns, strings.Join(names, "\x00"))
	s.mu.Lock()
	p, ok := s.prompts[key]
	s.mu.Unlock()
	if ok {
		return p, nil
	}
	p, err := router.NewPrompt(s.env.Router.PromptTemplate, models, maxTurns)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if len(s.prompts) < promptCacheSize {
		s.prompts[key] = p
	}
	s.mu.Unlock()
	return p, nil
}
