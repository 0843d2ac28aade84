package router

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/recal-project/recal/internal/generate"
	"github.com/recal-project/recal/llmpool"
)

// Decoder is what the scheduler needs of the policy: a generate.Decoder whose
// cache rows can be emptied for the next response (torchbridge.Cache).
type Decoder interface {
	generate.Decoder
	// Reset empties the given rows.
	Reset(ctx context.Context, rows ...int) error
}

// BanDecoder is a Decoder that can keep given tokens from being chosen,
// per row (ban[i] for rows[i]). router.no_repeat_ngram needs it.
type BanDecoder interface {
	ExtendBanned(ctx context.Context, rows []int, tokens [][]int32, s generate.Sampling, seed uint64, ban [][]int32) (next []int32, logp []float32, err error)
}

// VocabDecoder is a Decoder that knows the size of its model's vocabulary
// (every id it may sample is below it). router.answer_span needs it.
type VocabDecoder interface {
	Vocab() int
}

// Errors of the scheduler.
var (
	// ErrStopped is the error of a response the scheduler could not finish
	// because its Run ended (its context was done), and of any response
	// submitted after that.
	ErrStopped = errors.New("router: scheduler stopped")
	// ErrInvalidRow is wrapped by Submit's errors about the job or its
	// RowOptions.
	ErrInvalidRow = errors.New("router: invalid response")
)

// SchedulerOptions configure a Scheduler.
type SchedulerOptions struct {
	// Rows is the number of cache rows: the most responses decoding
	// together. Responses submitted beyond it wait for a free row.
	Rows int
	// EOS are the end-of-sequence tokens.
	EOS []int32
	// Seed seeds sampling. The decoder's draw for a row depends on (seed,
	// cache row, the row's length) only.
	Seed uint64
	// StepSeeds advances the seed by one per decode step. Off (training
	// rollouts), a response's tokens do not depend on how rows were batched
	// or when replies arrived. On (a server), a cache row reused for a later
	// request does not replay the draws of the one before.
	StepSeeds bool
	// MaxSamplings bounds the distinct RowOptions.Sampling settings among
	// the rows decoding at once, each of which costs Extend calls of its
	// own every step; 0 means no bound. A response with another setting
	// waits for a row until every row of one of them has ended, and the
	// responses submitted after it wait too (first come, first served, so
	// none waits forever).
	MaxSamplings int
}

// RowOptions are one response's limits within the configured protocol. The
// zero value is the configured protocol with greedy decoding.
type RowOptions struct {
	// Models are the pool models the response may call (any spelling
	// Pool.Lookup accepts); nil or empty means every pool model. A <search>
	// naming another model is treated exactly like an unknown model: a
	// failure observation and no call.
	Models []string
	// MaxTurns is the most <search> turns acted on (≤ Config.MaxTurns);
	// 0 means Config.MaxTurns. One final turn without routing follows them.
	MaxTurns int
	// MaxCostUSD is the response's pool budget in USD; 0 means none. Once
	// the cost of its calls so far reaches it, a further <search> makes no
	// call: it is recorded as a Call with Refused and Failed set and answered
	// with the observation BudgetText, and still counts as a turn, so the
	// policy can answer. One call can overshoot the budget: its cost is
	// known only when it returns.
	MaxCostUSD float64
	// MaxTokens caps the tokens the policy writes (Mask 1); 0 means none.
	// The token that reaches the cap ends the response: End "answer" when it
	// completes an <answer>, "eos" when it is an EOS token, else "length".
	MaxTokens int
	// Sampling is the response's sampling. Rows with different sampling
	// decode in separate Decoder.Extend calls of the same step (greedy rows
	// share one whatever their TopP and TopK, as do TopP 0 and 1).
	Sampling generate.Sampling
	// OnCall, when not nil, is called with every Call of the response, in
	// order, as soon as it is known (on the goroutine that waited for the
	// pool; it must not block), and never after the response's context is
	// done. Every call happens before the response is returned.
	OnCall func(Call)
}

// Scheduler runs the routing protocol with continuous batching: responses are
// admitted into free cache rows between decode steps, decode together on
// the goroutine that runs the scheduler (Run, or Rollout's caller), call the
// pool concurrently (rows that are not waiting keep decoding), and leave
// their row when they end or their context is done. Submit and Do are safe
// for concurrent use; only one Run may be active at a time.
type Scheduler struct {
	dec  Decoder
	tok  Tokenizer
	pool Pool
	cfg  Config
	opt  SchedulerOptions

	closeToks map[string][]int32 // "</think>", "</search>", "</answer>" encoded
	names     []string           // the pool's model names (router.search_names)
	// router.call_first: the tokens that write "<a", and those that start
	// with "a" (banned after a lone "<").
	openA, startA []int32
	// router.final_answer: the tokens that write "<s", and those that
	// start with "s".
	openS, startS []int32
	// router.match_close: the tokens that hold "</", and the others that
	// start with "/" (which can write "</" after a lone "<").
	closers, slashes []int32

	replies chan reply    // pool calls' results; one in flight per row at most
	wake    chan struct{} // a submission arrived

	mu      sync.Mutex
	queue   []*Pending // waiting for a row, first come first served
	active  int        // rows holding a response
	stopped bool       // Run ended: nothing more is admitted
	stats   Stats

	// Owned by the decode loop.
	slots   []*Pending // response per cache row; nil = free
	dirty   []bool     // the row holds tokens of an earlier response
	pending int        // pool calls in flight (at most one per row)
	slowest map[int]time.Duration
	step    uint64
}

// Pending is a submitted response.
type Pending struct {
	ctx  context.Context
	job  Job
	opt  RowOptions
	done chan struct{}

	// Set by Submit.
	maxTurns int
	allowed  map[string]bool // canonical names; nil = all

	// Owned by the decode loop until done is closed.
	out        Sample
	err        error
	row        int
	feed       []int32 // tokens for the next Extend (prompt, info block or the last sampled token)
	turnText   []byte
	turnToks   int
	policyToks int
	waiting    bool // a pool call is in flight
	finished   bool
	callsMade  int // <search> turns acted on (known, unknown or refused)
	spent      float64
	cancelCall context.CancelFunc
	// With router.answer_span: the text of every reply shown (with
	// router.answer_whole, of those that state no short answer), the
	// short answers of the others (answer_whole), and the tokens that
	// occur in one of them (the candidates of an answer span; nil until an
	// answer needs them after the last reply).
	replies  []string
	answers  []string
	spanToks []int32
}

// Done is closed when the response has ended (or failed).
func (p *Pending) Done() <-chan struct{} { return p.done }

// Result is the finished response, valid once Done is closed.
func (p *Pending) Result() (Sample, error) {
	<-p.done
	return p.out, p.err
}

type reply struct {
	p     *Pending
	call  Call
	block []int32 // the <information> block to append
}

// NewScheduler makes a scheduler over dec's rows 0..opt.Rows-1, which must be
// empty or are reset before use.
func NewScheduler(dec Decoder, tok Tokenizer, pool Pool, cfg Config, opt SchedulerOptions) (*Scheduler, error) {
	if opt.Rows < 1 {
		return nil, fmt.Errorf("router: scheduler: %d rows, want ≥ 1", opt.Rows)
	}
	if opt.MaxSamplings < 0 {
		return nil, fmt.Errorf("router: scheduler: at most %d samplings, want ≥ 0 (0: no bound)", opt.MaxSamplings)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("router: scheduler: %w", err)
	}
	if err := cfg.checkDecoder(dec); err != nil {
		// freshRows (Rollout) claims both; the decoder it wraps may not.
		return nil, fmt.Errorf("router: scheduler: %w", err)
	}
	if v, ok := dec.(VocabDecoder); cfg.constrains() && (!ok || v.Vocab() < 1) {
		return nil, fmt.Errorf("router: scheduler: router.answer_span and router.search_names need a decoder that knows its vocabulary (%T does not)", dec)
	}
	var names []string
	if cfg.SearchNames {
		lister, ok := pool.(interface{ Models() []llmpool.ModelInfo })
		if !ok {
			return nil, fmt.Errorf("router: scheduler: router.search_names needs a pool that lists its models (%T does not)", pool)
		}
		for _, m := range lister.Models() {
			names = append(names, m.Name)
		}
	}
	var openA, startA, openS, startS, closers, slashes []int32
	if cfg.CallFirst || cfg.FinalAnswer || cfg.MatchClose {
		for id := range dec.(VocabDecoder).Vocab() {
			b, t := tok.TokenBytes(id), int32(id)
			if cfg.CallFirst && bytes.Contains(b, []byte("<a")) {
				openA = append(openA, t)
			}
			if cfg.CallFirst && len(b) > 0 && b[0] == 'a' {
				startA = append(startA, t)
			}
			if cfg.FinalAnswer && bytes.Contains(b, []byte("<s")) {
				openS = append(openS, t)
			}
			if cfg.FinalAnswer && len(b) > 0 && b[0] == 's' {
				startS = append(startS, t)
			}
			switch {
			case !cfg.MatchClose:
			case bytes.Contains(b, []byte("</")):
				closers = append(closers, t)
			case len(b) > 0 && b[0] == '/':
				slashes = append(slashes, t)
			}
		}
	}
	closeToks := map[string][]int32{}
	for _, c := range []string{ThinkClose, SearchClose, AnswerClose} {
		closeToks[c] = toInt32(tok.Encode(c))
	}
	return &Scheduler{dec: dec, tok: tok, pool: pool, cfg: cfg, opt: opt, closeToks: closeToks, names: names, openA: openA, startA: startA, openS: openS, startS: startS, closers: closers, slashes: slashes,
		replies: make(chan reply, opt.Rows), wake: make(chan struct{}, 1),
		slots: make([]*Pending, opt.Rows), dirty: make([]bool, opt.Rows), slowest: map[int]time.Duration{}}, nil
}

// Submit queues a response; it starts at a decode step when a row is free.
// Cancelling ctx ends it (and cancels its pool call) at the next step, with
// ctx's error, without disturbing other rows.
func (e *Scheduler) Submit(ctx context.Context, job Job, opt RowOptions) (*Pending, error) {
	p := &Pending{ctx: ctx, job: job, opt: opt, done: make(chan struct{})}
	s := opt.Sampling
	switch {
	case len(job.Prompt) == 0:
		return nil, fmt.Errorf("%w: empty prompt", ErrInvalidRow)
	case opt.MaxTurns < 0 || opt.MaxTurns > e.cfg.MaxTurns:
		return nil, fmt.Errorf("%w: max turns %d: want 0 (configured) to %d", ErrInvalidRow, opt.MaxTurns, e.cfg.MaxTurns)
	case !(opt.MaxCostUSD >= 0) || math.IsInf(opt.MaxCostUSD, 0):
		return nil, fmt.Errorf("%w: max cost %v USD: want a finite number ≥ 0", ErrInvalidRow, opt.MaxCostUSD)
	case opt.MaxTokens < 0:
		return nil, fmt.Errorf("%w: max tokens %d: want ≥ 0", ErrInvalidRow, opt.MaxTokens)
	case !(s.Temperature >= 0) || math.IsInf(s.Temperature, 0) || !(s.TopP >= 0 && s.TopP <= 1) || s.TopK < 0:
		// A value the decoder rejects would fail the whole step, every row.
		return nil, fmt.Errorf("%w: sampling %+v: want temperature ≥ 0, top_p in [0, 1], top_k ≥ 0", ErrInvalidRow, s)
	}
	p.opt.Sampling = sameDraws(s)
	p.maxTurns = e.cfg.MaxTurns
	if opt.MaxTurns > 0 {
		p.maxTurns = opt.MaxTurns
	}
	if len(opt.Models) > 0 {
		p.allowed = map[string]bool{}
		for _, m := range opt.Models {
			info, ok := e.pool.Lookup(m)
			if !ok {
				return nil, fmt.Errorf("%w: model %q is not in the pool", ErrInvalidRow, m)
			}
			p.allowed[info.Name] = true
		}
	}
	p.feed = job.Prompt
	e.mu.Lock()
	if e.stopped {
		e.mu.Unlock()
		return nil, ErrStopped
	}
	e.queue = append(e.queue, p)
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
	return p, nil
}

// Do submits a response and waits for it. When ctx is done first, it
// returns ctx's error once the response has left its row (at once if it
// was still waiting for one).
func (e *Scheduler) Do(ctx context.Context, job Job, opt RowOptions) (Sample, error) {
	p, err := e.Submit(ctx, job, opt)
	if err != nil {
		return Sample{}, err
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		if e.dequeue(p) {
			return Sample{}, ctx.Err()
		}
		<-p.done // the loop frees the row at its next step
	}
	return p.out, p.err
}

// dequeue removes p from the queue, reporting whether it was there.
func (e *Scheduler) dequeue(p *Pending) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, q := range e.queue {
		if q == p {
			e.queue = append(e.queue[:i], e.queue[i+1:]...)
			return true
		}
	}
	return false
}

// Load reports the rows holding a response and the responses waiting for
// a row.
func (e *Scheduler) Load() (active, waiting int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.active, len(e.queue)
}

// Stats reports where the scheduler's time went so far (Wall is left to the
// caller).
func (e *Scheduler) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.stats
	for _, d := range e.slowest {
		st.SlowestSum += d
	}
	return st
}

// Run decodes until ctx is done; then responses in flight end with
// ErrStopped (their pool calls cancelled), as do those still waiting for a
// row, and Run returns nil. It returns the decoder's error when a decode
// step fails; every response in flight or waiting ends with that error.
func (e *Scheduler) Run(ctx context.Context) error {
	if err := e.loop(ctx, false); ctx.Err() == nil {
		return err
	}
	return nil
}

// drain decodes until no response is in flight or waiting, or ctx is done
// (then it returns ctx's error, like a failed decode step).
func (e *Scheduler) drain(ctx context.Context) error { return e.loop(ctx, true) }

func (e *Scheduler) loop(ctx context.Context, untilIdle bool) (err error) {
	defer func() {
		if err != nil && !untilIdle && ctx.Err() != nil {
			e.stop(ErrStopped)
		} else {
			e.stop(err)
		}
	}()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		// Fold in pool replies that have arrived, without waiting.
		for drained := false; !drained; {
			select {
			case rp := <-e.replies:
				e.fold(rp)
			default:
				drained = true
			}
		}
		// Responses whose context is done leave their rows; one waiting on
		// the pool leaves when its (cancelled) call returns.
		for _, p := range e.slots {
			if p != nil && !p.waiting && p.ctx.Err() != nil {
				e.finish(p, p.ctx.Err())
			}
		}
		if err := e.admit(ctx); err != nil {
			return err
		}
		// Rows just given a prompt or an <information> block go in their
		// own call, so a long block does not pad every single-token row of
		// the step; rows with other sampling go in calls of their own.
		type group struct {
			s             generate.Sampling
			multi, single []*Pending
		}
		var groups []*group
		for _, p := range e.slots {
			if p == nil || p.finished || p.waiting || p.feed == nil {
				continue
			}
			var g *group
			for _, h := range groups {
				if h.s == p.opt.Sampling {
					g = h
				}
			}
			if g == nil {
				g = &group{s: p.opt.Sampling}
				groups = append(groups, g)
			}
			if len(p.feed) > 1 {
				g.multi = append(g.multi, p)
			} else {
				g.single = append(g.single, p)
			}
		}
		if len(groups) == 0 {
			e.mu.Lock()
			idle := e.active == 0 && len(e.queue) == 0
			e.mu.Unlock()
			if idle && untilIdle {
				return nil
			}
			// Everyone left is waiting on the pool, or nobody is here.
			select {
			case rp := <-e.replies:
				e.fold(rp)
			case <-e.wake:
			case <-ctx.Done():
				return ctx.Err()
			}
			continue
		}
		seed := e.opt.Seed
		if e.opt.StepSeeds {
			seed += e.step
		}
		e.step++
		for _, g := range groups {
			if err := e.extend(ctx, g.multi, g.s, seed); err != nil {
				return err
			}
			if err := e.extend(ctx, g.single, g.s, seed); err != nil {
				return err
			}
		}
	}
}

// sameDraws is s with the settings that do not change the decoder's choice
// cleared: greedy decoding ignores TopP and TopK, and TopP 1 is off like 0.
// Rows whose settings differ only there share an Extend call.
func sameDraws(s generate.Sampling) generate.Sampling {
	if s.Temperature == 0 {
		return generate.Sampling{}
	}
	if s.TopP == 1 {
		s.TopP = 0
	}
	return s
}

// admit moves waiting responses into free rows, in order, emptying rows
// that held earlier responses. With SchedulerOptions.MaxSamplings, a response
// whose sampling would be one too many stops the admissions until a
// sampling's last row ends.
func (e *Scheduler) admit(ctx context.Context) error {
	var reset []int
	e.mu.Lock()
	var samplings []generate.Sampling
	if e.opt.MaxSamplings > 0 {
		for _, p := range e.slots {
			if p != nil && !slices.Contains(samplings, p.opt.Sampling) {
				samplings = append(samplings, p.opt.Sampling)
			}
		}
	}
	row := 0
	for len(e.queue) > 0 {
		for row < len(e.slots) && e.slots[row] != nil {
			row++
		}
		if row == len(e.slots) {
			break
		}
		p := e.queue[0]
		if err := p.ctx.Err(); err != nil {
			e.queue = e.queue[1:]
			p.err = err
			close(p.done)
			continue
		}
		if e.opt.MaxSamplings > 0 && !slices.Contains(samplings, p.opt.Sampling) {
			if len(samplings) == e.opt.MaxSamplings {
				break
			}
			samplings = append(samplings, p.opt.Sampling)
		}
		e.queue = e.queue[1:]
		p.row = row
		e.slots[row] = p
		e.active++
		if e.dirty[row] {
			reset = append(reset, row)
		}
		e.dirty[row] = true
	}
	e.mu.Unlock()
	if len(reset) == 0 {
		return nil
	}
	if err := e.dec.Reset(ctx, reset...); err != nil {
		return fmt.Errorf("router: reset rows %v: %w", reset, err)
	}
	return nil
}

// DecodeVersion changes when the scheduler decodes differently for the same
// weights and settings; it keys evaluation results (eval's identity), so
// answers of an older scheduler are not reused. 1 (unnamed): before
// 2026-11-23; 2: the KV cache holds each <search> turn's last token; 3:
// float32 policies on the CPU decode by the bridge's row-invariant kernels
// (other roundings than libtorch's); 4: router.answer_span's spans start
// and end at character boundaries; 5: router.call_first's ban no longer
// turns off router.on_repeat = "close" for the row (a full vocabulary has
// tokens holding "<a").
const DecodeVersion = 5

// finish ends a response and frees its row.
func (e *Scheduler) finish(p *Pending, err error) {
	if p.finished {
		return
	}
	p.finished = true
	if err == nil {
		p.out.Text = e.tok.Decode(toInts(p.out.Tokens))
	} else {
		p.out = Sample{}
	}
	p.err = err
	e.mu.Lock()
	e.slots[p.row] = nil
	e.active--
	e.mu.Unlock()
	close(p.done)
}

// stop ends every response in flight or waiting with err (ErrStopped when
// the loop ended because its context was done), after their pool calls
// return, and refuses further submissions.
func (e *Scheduler) stop(err error) {
	if err == nil {
		return // drained: nothing is left
	}
	e.mu.Lock()
	e.stopped = true
	queue := e.queue
	e.queue = nil
	e.mu.Unlock()
	for _, p := range e.slots {
		if p != nil && p.waiting {
			p.cancelCall()
		}
	}
	for ; e.pending > 0; e.pending-- {
		rp := <-e.replies
		rp.p.waiting = false
		rp.p.cancelCall()
	}
	for _, p := range e.slots {
		if p != nil {
			e.finish(p, err)
		}
	}
	for _, p := range queue {
		p.err = err
		close(p.done)
	}
}
