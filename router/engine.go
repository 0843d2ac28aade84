package router

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/recal-project/recal/generate"
	"github.com/recal-project/recal/llmpool"
)

// Decoder is what the engine needs of the policy: a generate.Decoder whose
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

// Errors of the engine.
var (
	// ErrStopped is the error of a response the engine could not finish
	// because its Run ended (its context was done), and of any response
	// submitted after that.
	ErrStopped = errors.New("router: engine stopped")
	// ErrInvalidRow is wrapped by Submit's errors about the job or its
	// RowOptions.
	ErrInvalidRow = errors.New("router: invalid response")
)

// EngineOptions configure an Engine.
type EngineOptions struct {
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

// BudgetText is the observation for a <search> made after the response's
// cost budget is spent.
const BudgetText = "[router: the cost budget is spent; no model was called: answer now]"

// Engine runs the routing protocol with continuous batching: responses are
// admitted into free cache rows between decode steps, decode together on
// the goroutine that runs the engine (Run, or Rollout's caller), call the
// pool concurrently (rows that are not waiting keep decoding), and leave
// their row when they end or their context is done. Submit and Do are safe
// for concurrent use; only one Run may be active at a time.
type Engine struct {
	dec  Decoder
	tok  Tokenizer
	pool Pool
	cfg  Config
	opt  EngineOptions

	closeToks map[string][]int32 // "</think>", "</search>", "</answer>" encoded
	names     []string           // the pool's model names (router.search_names)
	// router.call_first: the tokens that write "<a", and those that start
	// with "a" (banned after a lone "<").
	openA, startA []int32
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
	// With router.answer_span: the text of every reply shown, and the
	// tokens that occur in one of them (the candidates of an answer span;
	// nil until an answer needs them after the last reply).
	replies  []string
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

// NewEngine makes an engine over dec's rows 0..opt.Rows-1, which must be
// empty or are reset before use.
func NewEngine(dec Decoder, tok Tokenizer, pool Pool, cfg Config, opt EngineOptions) (*Engine, error) {
	if opt.Rows < 1 {
		return nil, fmt.Errorf("router: engine: %d rows, want ≥ 1", opt.Rows)
	}
	if opt.MaxSamplings < 0 {
		return nil, fmt.Errorf("router: engine: at most %d samplings, want ≥ 0 (0: no bound)", opt.MaxSamplings)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("router: engine: %w", err)
	}
	if err := cfg.checkDecoder(dec); err != nil {
		// freshRows (Rollout) claims both; the decoder it wraps may not.
		return nil, fmt.Errorf("router: engine: %w", err)
	}
	if v, ok := dec.(VocabDecoder); cfg.constrains() && (!ok || v.Vocab() < 1) {
		return nil, fmt.Errorf("router: engine: router.answer_span and router.search_names need a decoder that knows its vocabulary (%T does not)", dec)
	}
	var names []string
	if cfg.SearchNames {
		lister, ok := pool.(interface{ Models() []llmpool.ModelInfo })
		if !ok {
			return nil, fmt.Errorf("router: engine: router.search_names needs a pool that lists its models (%T does not)", pool)
		}
		for _, m := range lister.Models() {
			names = append(names, m.Name)
		}
	}
	var openA, startA, closers, slashes []int32
	if cfg.CallFirst || cfg.MatchClose {
		for id := range dec.(VocabDecoder).Vocab() {
			b, t := tok.TokenBytes(id), int32(id)
			if cfg.CallFirst && bytes.Contains(b, []byte("<a")) {
				openA = append(openA, t)
			}
			if cfg.CallFirst && len(b) > 0 && b[0] == 'a' {
				startA = append(startA, t)
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
	return &Engine{dec: dec, tok: tok, pool: pool, cfg: cfg, opt: opt, closeToks: closeToks, names: names, openA: openA, startA: startA, closers: closers, slashes: slashes,
		replies: make(chan reply, opt.Rows), wake: make(chan struct{}, 1),
		slots: make([]*Pending, opt.Rows), dirty: make([]bool, opt.Rows), slowest: map[int]time.Duration{}}, nil
}

// Submit queues a response; it starts at a decode step when a row is free.
// Cancelling ctx ends it (and cancels its pool call) at the next step, with
// ctx's error, without disturbing other rows.
func (e *Engine) Submit(ctx context.Context, job Job, opt RowOptions) (*Pending, error) {
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
func (e *Engine) Do(ctx context.Context, job Job, opt RowOptions) (Sample, error) {
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
func (e *Engine) dequeue(p *Pending) bool {
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
func (e *Engine) Load() (active, waiting int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.active, len(e.queue)
}

// Stats reports where the engine's time went so far (Wall is left to the
// caller).
func (e *Engine) Stats() Stats {
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
func (e *Engine) Run(ctx context.Context) error {
	if err := e.loop(ctx, false); ctx.Err() == nil {
		return err
	}
	return nil
}

// drain decodes until no response is in flight or waiting, or ctx is done
// (then it returns ctx's error, like a failed decode step).
func (e *Engine) drain(ctx context.Context) error { return e.loop(ctx, true) }

func (e *Engine) loop(ctx context.Context, untilIdle bool) (err error) {
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
// that held earlier responses. With EngineOptions.MaxSamplings, a response
// whose sampling would be one too many stops the admissions until a
// sampling's last row ends.
func (e *Engine) admit(ctx context.Context) error {
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

// extend runs one decode step for ps and advances their state machines.
func (e *Engine) extend(ctx context.Context, ps []*Pending, s generate.Sampling, seed uint64) error {
	if len(ps) == 0 {
		return nil
	}
	rows := make([]int, len(ps))
	toks := make([][]int32, len(ps))
	for k, p := range ps {
		rows[k], toks[k] = p.row, p.feed
	}
	t0 := time.Now()
	var next []int32
	var logp []float32
	var err error
	// span: what an answer span or a model name allows (every other token
	// banned: no room for a loop); guard: the few tokens router.call_first
	// and router.match_close ban, which leave the n-gram rule its work.
	var ban, span, guard [][]int32
	if e.cfg.constrains() {
		span = make([][]int32, len(ps))
		guard = make([][]int32, len(ps))
		for k, p := range ps {
			if e.cfg.AnswerSpan {
				span[k] = e.spanBan(p)
			}
			if span[k] == nil && e.cfg.SearchNames {
				span[k] = e.nameBan(p)
			}
			if e.cfg.CallFirst {
				guard[k] = e.callBan(p)
			}
			if e.cfg.MatchClose {
				guard[k] = append(guard[k], e.closeBan(p)...)
			}
			if len(guard[k]) == 0 {
				guard[k] = nil
			}
		}
	}
	if n := e.cfg.NoRepeatNGram; n > 0 {
		// A row's next token is chosen after its feed: the turn's tokens so
		// far are the last turnToks of its output (a fed <information>
		// block starts a new turn, turnToks 0). Only the text after the
		// turn's last tag counts (the tokens after its last '>'): the
		// protocol's tags repeat themselves ("<think>" … "</think>").
		ban = make([][]int32, len(ps))
		for k, p := range ps {
			turn := p.out.Tokens[len(p.out.Tokens)-p.turnToks:]
			for i := len(turn) - 1; i >= 0; i-- {
				if bytes.IndexByte(e.tok.TokenBytes(int(turn[i])), '>') >= 0 {
					turn = turn[i+1:]
					break
				}
			}
			ban[k] = RepeatBan(turn, n)
		}
	}
	closeLoops := ban != nil && !e.cfg.bans()
	// What the decoder bans per row: a protocol constraint's (an answer
	// span or a model name, which leave no room for a loop), else the
	// n-gram rule's bans unless it closes loops instead; and the guards'.
	send := ban
	if closeLoops {
		send = nil
	}
	for k := range span {
		if span[k] == nil && guard[k] == nil {
			continue
		}
		if send == nil {
			send = make([][]int32, len(ps))
		}
		switch {
		case span[k] != nil:
			send[k] = append(slices.Clip(span[k]), guard[k]...)
		default:
			send[k] = append(slices.Clip(send[k]), guard[k]...)
		}
	}
	if send != nil {
		next, logp, err = e.dec.(BanDecoder).ExtendBanned(ctx, rows, toks, s, seed, send)
	} else {
		next, logp, err = e.dec.Extend(ctx, rows, toks, s, seed)
	}
	took := time.Since(t0)
	e.mu.Lock()
	e.stats.Decode += took
	e.mu.Unlock()
	if err != nil {
		return err
	}
	stops := []string{SearchClose, AnswerClose, InfoOpen}
	for k, p := range ps {
		o := &p.out
		p.feed = nil
		t := next[k]
		// router.on_repeat = "close": a token that would repeat an n-gram
		// of the open tag is dropped and the environment closes the tag;
		// a loop outside every tag ends the turn.
		looped := closeLoops && (span == nil || span[k] == nil) && containsToken(ban[k], t)
		fed := []int32{t}
		before := len(p.turnText)
		var closing []int32
		var closeTag string
		if looped {
			closing, closeTag = e.closing(p.turnText)
		}
		if closing != nil {
			o.Tokens = append(o.Tokens, closing...)
			o.Mask = append(o.Mask, make([]float32, len(closing))...)
			o.Logp = append(o.Logp, make([]float32, len(closing))...)
			o.Closed++
			p.turnToks += len(closing)
			p.turnText = append(p.turnText, closeTag...)
			// its own copy: fold appends the reply block to the feed
			fed, looped = slices.Clone(closing), false // after </think> the turn goes on
		} else {
			if span != nil && (span[k] != nil || (guard[k] != nil && -logp[k] > guardSlack)) {
				o.Constrained = append(o.Constrained, len(o.Tokens))
			}
			o.Tokens = append(o.Tokens, t)
			o.Mask = append(o.Mask, 1)
			o.Logp = append(o.Logp, logp[k])
			p.turnToks++
			p.policyToks++
			if isIn(t, e.opt.EOS) {
				o.End = "eos"
				o.Turns++
				e.finish(p, nil)
				continue
			}
			p.turnText = append(p.turnText, e.tok.TokenBytes(int(t))...)
		}
		capped := p.opt.MaxTokens > 0 && p.policyToks >= p.opt.MaxTokens
		_, stopped := stopIn(p.turnText, before, stops)
		if !stopped && !capped && !looped && p.turnToks < e.cfg.TurnTokens {
			p.feed = fed
			continue
		}
		// The turn is over: act on its first complete action.
		o.Turns++
		text := string(p.turnText)
		a := ParseAction(text)
		p.turnText, p.turnToks = nil, 0
		switch {
		case strings.Contains(text, InfoOpen):
			o.End = "information"
		case a.Kind == Answer:
			o.End = "answer"
		case capped:
			o.End = "length"
		case a.Kind == Search && p.callsMade >= p.maxTurns:
			o.End = "final"
		case a.Kind == Search:
			// The turn's last token goes into the cache with the reply's
			// block: the response the policy is trained on holds it.
			p.feed = fed
			e.call(p, a)
			continue
		default:
			o.End = "length"
		}
		e.finish(p, nil)
	}
	return nil
}

// callBan is what router.call_first bans for p's next token: nil once p
// holds a reply or may call no more, else the tokens that would write
// "<a", the start of <answer> (after a lone "<", every token that starts
// with "a"). nil when that is no token of the vocabulary.
func (e *Engine) callBan(p *Pending) []int32 {
	if len(p.out.Calls) > 0 || p.callsMade >= p.maxTurns {
		return nil
	}
	text := p.turnText
	if i := bytes.LastIndexByte(text, '>'); i >= 0 {
		text = text[i+1:]
	}
	if len(text) > 0 && text[len(text)-1] == '<' {
		return append(slices.Clone(e.startA), e.openA...)
	}
	if len(e.openA) == 0 {
		return nil
	}
	return slices.Clip(e.openA) // appended to (router.match_close): never into e.openA
}

// closeBan is what router.match_close bans for p's next token: nil when
// no tag is open at the end of p's turn, else the tokens that would write
// a closing tag other than the open tag's own (what follows a "</" must
// spell the rest of it). Only tokens that hold "</" can do so, and after a
// lone "<" those that start with "/"; inside an unfinished "</…" any token
// can (the whole vocabulary is checked, a step or two per closing tag).
func (e *Engine) closeBan(p *Pending) []int32 {
	_, want := e.closing(p.turnText)
	if want == "" {
		return nil
	}
	tail := ""
	if i := bytes.LastIndexByte(p.turnText, '<'); i >= 0 && bytes.IndexByte(p.turnText[i:], '>') < 0 {
		tail = string(p.turnText[i:])
	}
	bad := func(id int32) bool {
		w := tail + string(e.tok.TokenBytes(int(id)))
		for off := 0; ; {
			i := strings.Index(w[off:], "</")
			if i < 0 {
				return false
			}
			c := w[off+i:]
			if !strings.HasPrefix(want, c) && !strings.HasPrefix(c, want) {
				return true
			}
			off += i + len(want)
			if off >= len(w) {
				return false
			}
		}
	}
	var ban []int32
	if strings.HasPrefix(tail, "</") {
		for id := range e.dec.(VocabDecoder).Vocab() {
			if bad(int32(id)) {
				ban = append(ban, int32(id))
			}
		}
		return ban
	}
	cands := e.closers
	if tail == "<" {
		cands = append(slices.Clone(e.slashes), e.closers...)
	}
	for _, id := range cands {
		if bad(id) {
			ban = append(ban, id)
		}
	}
	return ban
}

// spanBan is what router.answer_span bans for p's next token: nil when
// p's turn has no <answer> open or p was shown no reply, else every token
// but those that keep the answer written so far a span of a reply's text
// starting at a word's start (after at most one leading space) and, once
// the answer is such a span of whole words, those that start the closing
// tag (an answer does not stop inside a word: "Mer" of "Mercedes-Benz").
// Once anything but a span is written (the closing tag), the turn goes on
// free.
func (e *Engine) spanBan(p *Pending) []int32 {
	if len(p.replies) == 0 {
		return nil
	}
	at := bytes.LastIndex(p.turnText, []byte(AnswerOpen))
	if at < 0 {
		return nil
	}
	written := p.turnText[at+len(AnswerOpen):]
	if bytes.IndexByte(written, '<') >= 0 {
		return nil
	}
	if p.spanToks == nil {
		for id := range e.dec.(VocabDecoder).Vocab() {
			b := string(e.tok.TokenBytes(id))
			if b == "" {
				continue
			}
			ok := strings.HasPrefix(AnswerClose, b) || b == " "
			for _, r := range p.replies {
				ok = ok || strings.Contains(r, strings.TrimPrefix(b, " "))
			}
			if ok {
				p.spanToks = append(p.spanToks, int32(id))
			}
		}
	}
	word := strings.TrimPrefix(string(written), " ")
	inReply := func(span string, whole bool) bool {
		for _, r := range p.replies {
			if wordSpan(r, span, whole) {
				return true
			}
		}
		return false
	}
	closes := word != "" && inReply(word, true)
	allowed := map[int32]bool{}
	for _, id := range p.spanToks {
		b := string(e.tok.TokenBytes(int(id)))
		var ok bool
		switch {
		case strings.HasPrefix(AnswerClose, b):
			ok = closes
		case len(written) == 0 && b == " ":
			ok = true
		default:
			cand := word + b
			if word == "" && len(written) == 0 {
				cand = strings.TrimPrefix(b, " ")
			}
			ok = cand != "" && inReply(cand, false)
		}
		if ok {
			allowed[id] = true
		}
	}
	if len(allowed) == 0 { // replies of no text: nothing to copy
		return nil
	}
	return e.banAllBut(func(id int) bool { return allowed[int32(id)] })
}

// banAllBut is every id of the decoder's vocabulary that keep rejects.
func (e *Engine) banAllBut(keep func(id int) bool) []int32 {
	var ban []int32
	for id := range e.dec.(VocabDecoder).Vocab() {
		if !keep(id) {
			ban = append(ban, int32(id))
		}
	}
	return ban
}

// nameBan is what router.search_names bans for p's next token: nil unless
// p's turn has a <search> open with no colon yet, else every token but
// those that keep what follows the tag (after at most one leading space) a
// prefix of "NAME:" for a model NAME p may call, or that complete it.
func (e *Engine) nameBan(p *Pending) []int32 {
	at := bytes.LastIndex(p.turnText, []byte(SearchOpen))
	if at < 0 {
		return nil
	}
	written := string(p.turnText[at+len(SearchOpen):])
	if strings.ContainsAny(written, ":<") {
		return nil
	}
	var targets []string
	for _, n := range e.names {
		if info, ok := e.pool.Lookup(n); ok && (p.allowed == nil || p.allowed[info.Name]) {
			targets = append(targets, n+":")
		}
	}
	if len(targets) == 0 {
		return nil
	}
	return e.banAllBut(func(id int) bool {
		b := string(e.tok.TokenBytes(id))
		cand := strings.TrimPrefix(written+b, " ")
		ok := len(b) > 0 && (cand == "" && written == "")
		for _, t := range targets {
			ok = ok || (cand != "" && (strings.HasPrefix(t, cand) || strings.HasPrefix(cand, t)))
		}
		return ok
	})
}

// wordSpan reports whether span occurs in text starting at a word's start
// (text's start, or after a rune that is neither a letter nor a digit) and,
// when whole, also ending where no letter or digit follows ("thirty-" of
// "thirty-three" does not).
func wordSpan(text, span string, whole bool) bool {
	word := func(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) }
	for off := 0; ; {
		i := strings.Index(text[off:], span)
		if i < 0 {
			return false
		}
		i += off
		before, _ := utf8.DecodeLastRuneInString(text[:i])
		after, _ := utf8.DecodeRuneInString(text[i+len(span):])
		first, _ := utf8.DecodeRuneInString(span)
		end := i + len(span)
		// A span starts at a character's first byte, and a whole one ends
		// at a character's end: half of "ā" is no answer.
		if (i == len(text) || utf8.RuneStart(text[i])) && (i == 0 || !word(before) || !word(first)) &&
			(!whole || end == len(text) || (utf8.RuneStart(text[end]) && !word(after))) {
			return true
		}
		_, n := utf8.DecodeRuneInString(text[i:])
		off = i + n
	}
}

// closing is the closing tag of the tag open at the end of a turn's text
// (<think>, <search> or <answer>), as tokens and text; nil when none is open.
func (e *Engine) closing(turn []byte) ([]int32, string) {
	at, closeTag := -1, ""
	for _, tag := range [][2]string{{ThinkOpen, ThinkClose}, {SearchOpen, SearchClose}, {AnswerOpen, AnswerClose}} {
		i := bytes.LastIndex(turn, []byte(tag[0]))
		if i > at && bytes.LastIndex(turn, []byte(tag[1])) < i {
			at, closeTag = i, tag[1]
		}
	}
	if at < 0 {
		return nil, ""
	}
	return e.closeToks[closeTag], closeTag
}

// guardSlack bounds, in nats, how far a guard's ban (router.call_first,
// router.match_close) may have moved a chosen token's log-probability for
// the token still to count as unconstrained (Sample.Constrained): a ban of
// mass m moves it by −log(1−m), and m ≤ 1 − p for a chosen token of
// probability p, so a token chosen with −log p ≤ guardSlack moved by at
// most that. The guards are on inside nearly every tag (Qwen's added
// tokens such as </tool_call> are always banned there), so listing every
// token under them took PPO's KL penalty off nearly every token, and
// Router-R1's PPO collapsed on the EVOUNA world with match_close on. A
// span constraint (answer_span, search_names) forces its tokens: they are
// always listed. A token's log-probability is the unconstrained policy's
// (0 when the decoder computes none, as evaluation's does: no token is
// listed then, and only training reads the list).
const guardSlack = 0.1

// EngineVersion changes when the engine decodes differently for the same
// weights and settings; it keys evaluation results (eval's identity), so
// answers of an older engine are not reused. 1 (unnamed): before
// 2026-11-23; 2: the KV cache holds each <search> turn's last token; 3:
// float32 policies on the CPU decode by the bridge's row-invariant kernels
// (other roundings than libtorch's); 4: router.answer_span's spans start
// and end at character boundaries; 5: router.call_first's ban no longer
// turns off router.on_repeat = "close" for the row (a full vocabulary has
// tokens holding "<a").
const EngineVersion = 5

// call starts the pool call of a <search> turn on its own goroutine.
func (e *Engine) call(p *Pending, a Action) {
	turn := p.callsMade
	p.callsMade++
	p.waiting = true
	e.pending++
	cctx, cancel := context.WithCancel(p.ctx)
	p.cancelCall = cancel
	q := p.job.Question
	refuse := p.opt.MaxCostUSD > 0 && p.spent >= p.opt.MaxCostUSD
	go func() {
		var c Call
		if refuse {
			c = Call{Model: a.Model, Query: a.Query, Turn: turn, Failed: true, Refused: true,
				Reply: BudgetText}
			if info, ok := e.pool.Lookup(a.Model); ok && (p.allowed == nil || p.allowed[info.Name]) {
				c.Model = info.Name
			}
		} else {
			c = callPool(cctx, e.pool, a, &q, turn, p.allowed)
		}
		// The reply is cut and encoded here, off the decode loop, so a
		// long one delays only its own row.
		block, body := InfoBlock(e.tok, c.Reply, e.cfg.InfoTokens)
		c.Reply, c.ReplyBytes = body, len(c.Reply)
		if p.opt.OnCall != nil && p.ctx.Err() == nil {
			p.opt.OnCall(c)
		}
		e.replies <- reply{p, c, block}
	}()
}

// fold applies an arrived pool reply to its response.
func (e *Engine) fold(rp reply) {
	p, o := rp.p, &rp.p.out
	p.waiting = false
	p.cancelCall()
	e.pending--
	e.mu.Lock()
	if c := rp.call; !c.Unknown && !c.Refused {
		e.stats.Calls++
		e.slowest[c.Turn] = max(e.slowest[c.Turn], c.Latency)
	}
	e.mu.Unlock()
	if err := p.ctx.Err(); err != nil {
		e.finish(p, err)
		return
	}
	p.spent += rp.call.Cost
	if e.cfg.AnswerSpan {
		p.replies = append(p.replies, rp.call.Reply)
		p.spanToks = nil // made again, with this reply, when an answer needs them
	}
	o.Calls = append(o.Calls, rp.call)
	o.Tokens = append(o.Tokens, rp.block...)
	o.Mask = append(o.Mask, make([]float32, len(rp.block))...)
	o.Logp = append(o.Logp, make([]float32, len(rp.block))...)
	p.feed = append(p.feed, rp.block...)
}

// finish ends a response and frees its row.
func (e *Engine) finish(p *Pending, err error) {
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
func (e *Engine) stop(err error) {
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

// callPool makes one call for a <search> action. A name that is no pool
// model, or no model of allowed (when not nil), gets a failure observation
// and no call.
func callPool(ctx context.Context, pool Pool, a Action, q *llmpool.Question, turn int, allowed map[string]bool) Call {
	info, ok := pool.Lookup(a.Model)
	if !ok || (allowed != nil && !allowed[info.Name]) {
		return Call{Model: a.Model, Query: a.Query, Turn: turn, Failed: true, Unknown: true,
			Reply: fmt.Sprintf(UnknownModelText, truncate(a.Model, 64), "see the model list in the prompt")}
	}
	resp := pool.Call(ctx, llmpool.Request{Model: info.Name, Query: a.Query, Question: q})
	return Call{Model: info.Name, Query: a.Query, Reply: resp.Text, Failed: resp.Failed, Cached: resp.Cached,
		Cost: resp.Cost, Latency: resp.Latency, Turn: turn,
		PromptTokens: resp.InputTokens, CompletionTokens: resp.OutputTokens, TokensEstimated: resp.TokensEstimated}
}
