package serve

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/recal-project/recal/llmpool"
	"github.com/recal-project/recal/router"
)

// scriptBackend stands in for rollout.Service in the HTTP tests: a scripted
// "policy" that, per question, calls the first allowed pool model (a real
// llmpool.Pool) calls times, then answers "echo: QUESTION". It keeps the
// service's contract: at most rows queries run, the others wait, and a
// cancelled context ends a query at once.
type scriptBackend struct {
	pool   *llmpool.Pool
	calls  int
	decode time.Duration // simulated decoding time after the calls
	// hold, when not nil, makes every query wait for it to close after its
	// calls (or for its context to end).
	hold     chan struct{}
	rows     chan struct{}
	active   atomic.Int32
	waiting  atomic.Int32
	canceled atomic.Int32 // queries ended by their context
	started  chan struct{}

	mu      sync.Mutex
	queries []Query
}

func newScriptBackend(pool *llmpool.Pool, rows, calls int) *scriptBackend {
	return &scriptBackend{pool: pool, calls: calls, rows: make(chan struct{}, rows), started: make(chan struct{}, 1024)}
}

func (b *scriptBackend) Stats() (int, int) { return int(b.active.Load()), int(b.waiting.Load()) }

func (b *scriptBackend) Answer(ctx context.Context, q Query) (Result, error) {
	b.mu.Lock()
	b.queries = append(b.queries, q)
	b.mu.Unlock()
	b.waiting.Add(1)
	select {
	case b.rows <- struct{}{}:
		b.waiting.Add(-1)
	case <-ctx.Done():
		b.waiting.Add(-1)
		b.canceled.Add(1)
		return Result{}, ctx.Err()
	}
	b.active.Add(1)
	defer func() { b.active.Add(-1); <-b.rows }()
	select {
	case b.started <- struct{}{}:
	default:
	}
	var res Result
	text := "<think>route</think>"
	models := q.Models
	if models == nil {
		for _, m := range b.pool.Models() {
			models = append(models, m.Name)
		}
	}
	for turn := range b.calls {
		if q.MaxTurns > 0 && turn >= q.MaxTurns {
			break
		}
		model := models[turn%len(models)]
		resp := b.pool.Call(ctx, llmpool.Request{Model: model, Query: q.Question})
		c := router.Call{Model: model, Query: q.Question, Reply: resp.Text, Failed: resp.Failed, Cached: resp.Cached,
			Cost: resp.Cost, Latency: resp.Latency, Turn: turn}
		setCallTokens(&c, resp.InputTokens, resp.OutputTokens)
		if ctx.Err() != nil {
			b.canceled.Add(1)
			return Result{}, ctx.Err()
		}
		if q.OnCall != nil {
			q.OnCall(c)
		}
		res.Sample.Calls = append(res.Sample.Calls, c)
		res.CostUSD += c.Cost
		res.PoolPromptTokens += resp.InputTokens
		res.PoolCompletionTokens += resp.OutputTokens
		text += fmt.Sprintf("<search>%s: %s</search>\n\n<information>%s</information>\n\n", model, q.Question, resp.Text)
	}
	if b.hold != nil {
		select {
		case <-b.hold:
		case <-ctx.Done():
			b.canceled.Add(1)
			return Result{}, ctx.Err()
		}
	}
	select {
	case <-time.After(b.decode):
	case <-ctx.Done():
		b.canceled.Add(1)
		return Result{}, ctx.Err()
	}
	res.Answer = "echo: " + q.Question
	res.Sample.Text = text + "<answer>" + res.Answer + "</answer>"
	res.Sample.End = "answer"
	res.PolicyPromptTokens = 100
	res.PolicyCompletionTokens = 20
	return res, nil
}

func (b *scriptBackend) lastQuery() Query {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.queries[len(b.queries)-1]
}
