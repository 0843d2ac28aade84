package llmpool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"
)

var (
	// ErrUnknownModel: the request names no model of the pool. No provider
	// is called.
	ErrUnknownModel = errors.New("llmpool: unknown model")
	// ErrCacheMiss: pool.cache is read-only and the reply is not cached.
	ErrCacheMiss = errors.New("llmpool: cache miss in read-only mode")
	// ErrEmptyQuery: a real model was asked an empty sub-query (after
	// sanitising); no request is sent.
	ErrEmptyQuery = errors.New("llmpool: empty query")
	// ErrClosed: the pool is closed.
	ErrClosed = errors.New("llmpool: pool is closed")
)

// Question is the example being routed. Only simulators may look at Golden.
type Question struct {
	// ID is the question's globally unique id (dataset + id).
	ID string
	// Dataset is the dataset name, e.g. "nq", "hotpotqa".
	Dataset string
	// Text is the question as the policy sees it.
	Text string
	// Golden are the golden answers.
	Golden []string
}

// Request is one pool call: <search>Model: Query</search>.
type Request struct {
	// Model is the name the policy wrote, matched without case.
	Model string
	// Query is the sub-query; it becomes the only user message (Router-R1).
	// It is made valid UTF-8, trimmed and cut to pool.max_query_chars.
	Query string
	// Question is the example being routed (for simulators); may be nil.
	Question *Question
}

// Response is the outcome of one pool call. It is never an error for the
// caller: on failure Failed is set, Err says why and Text is the failure
// text, so that the trajectory goes on.
type Response struct {
	// Model is the pool name of the model called ("" when unknown).
	Model string
	// Text is the reply, or the failure text when Failed.
	Text string
	// InputTokens and OutputTokens are the tokens of the reply, reported by
	// the provider or, when TokensEstimated, estimated (4 characters per
	// token); 0 when Failed. A cache hit gives the stored counts.
	InputTokens  int
	OutputTokens int
	// TokensEstimated is true when the token counts are estimated.
	TokensEstimated bool
	// Cost is the list-price cost of the reply in USD (tokens times the
	// model's prices per million tokens; a replayed reply's logged cost when
	// the log has one), the same whether it came from the
	// cache or the provider, so rewards do not depend on the cache. The money
	// actually spent is Usage.Cost. 0 when Failed.
	Cost float64
	// Latency is the wall time of the call, waits and retries included; a
	// replayed reply's logged latency (0 when not logged, and for a failed
	// replayed call).
	Latency time.Duration
	// Cached is true when the reply came from the cache.
	Cached bool
	// Evidence is what the model wrote when Text is not it: a replayed reply
	// rendered from its judgment (render = "judgment") has the logged reply
	// here. Empty otherwise (Text is what the model wrote). Agreement
	// between replies (router.agreement, the "agree" warm-up) is read on
	// it, so that a rendered reply tells a policy no more about which
	// replies agree than the models' own words do.
	Evidence string
	// Failed is true when no reply could be had; Text is then the failure text.
	Failed bool
	// Err is why the call failed; nil unless Failed.
	Err error
}

// ModelInfo describes a model for the policy's prompt.
type ModelInfo struct {
	// Name is the model's pool name.
	Name string
	// Description is the text shown to the policy.
	Description string
	// PriceIn and PriceOut are USD per million input and output tokens.
	PriceIn, PriceOut float64
	// Provider is the provider's registered name.
	Provider string
	// Simulated is true for simulated models (provider "sim").
	Simulated bool
}

// Option configures New.
type Option func(*options)

type options struct {
	log        *slog.Logger
	answerBank map[string][]string
	lookupEnv  func(string) (string, bool)
}

// WithLogger sets the logger (default: discard). The pool logs retries and
// failures at Warn and every call at Debug; it never logs an API key or an
// Authorization header.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.log = l
		}
	}
}

// WithAnswerBank gives simulated models, per dataset name, answers they draw
// wrong replies from (typically the golden answers of the dataset's other
// questions). Without a bank they make up names.
func WithAnswerBank(bank map[string][]string) Option {
	return func(o *options) { o.answerBank = bank }
}

// Pool is the pool of models. Its methods are safe for concurrent use.
type Pool struct {
	cfg    Config
	log    *slog.Logger
	models []*poolModel
	byName map[string]*poolModel // lowercased name
	cache  *diskCache            // nil when off
	usage  *usageBook
	// secrets are the configured API keys: scrubbed from every reply
	// (scrub), fresh or cached, so that an endpoint echoing its request's
	// Authorization header puts no key in a response, trace, cache file,
	// outcome log or log line.
	secrets []string

	mu       sync.Mutex
	closed   bool
	inflight sync.WaitGroup
}

type poolModel struct {
	info ModelInfo
	prov provider
}

// New builds the pool from cfg (not modified): it sets defaults, validates,
// prepares the cache directory and builds every model's provider, reading
// API keys from the environment. Any problem is an error here, before any
// call.
func New(cfg Config, opts ...Option) (*Pool, error) {
	o := options{log: slog.New(slog.NewTextHandler(io.Discard, nil)), lookupEnv: os.LookupEnv}
	for _, opt := range opts {
		opt(&o)
	}
	cfg = cfg.clone()
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &Pool{
		cfg:    cfg,
		log:    o.log,
		byName: map[string]*poolModel{},
	}
	env := providerEnv{log: o.log, getenv: o.lookupEnv, answerBank: o.answerBank,
		wire: semaphore.NewWeighted(int64(cfg.MaxConcurrency)), logs: logBook{}}
	names := make([]string, 0, len(cfg.Models))
	for i, m := range cfg.Models {
		prov, err := providers[m.Provider](m, env)
		if err != nil {
			p.closeProviders()
			return nil, fmt.Errorf("llmpool: pool.models[%d] (%q): %w", i, m.Name, err)
		}
		pm := &poolModel{
			info: ModelInfo{Name: m.Name, Description: m.Description, PriceIn: m.PriceIn, PriceOut: m.PriceOut,
				Provider: m.Provider, Simulated: m.Provider == "sim"},
			prov: prov,
		}
		p.models = append(p.models, pm)
		p.byName[strings.ToLower(m.Name)] = pm
		names = append(names, m.Name)
		if m.OpenAI != nil && m.OpenAI.APIKeyEnv != "" {
			if key, err := APIKey(m.OpenAI.APIKeyEnv, o.lookupEnv); err == nil && !slices.Contains(p.secrets, key) {
				p.secrets = append(p.secrets, key)
			}
		}
	}
	cache, err := openCache(cfg.CacheDir, cfg.Cache, o.log)
	if err != nil {
		p.closeProviders()
		return nil, err
	}
	p.cache = cache
	p.usage = newUsageBook(names)
	return p, nil
}

// Models returns the models in config order, for the policy's prompt.
func (p *Pool) Models() []ModelInfo {
	out := make([]ModelInfo, len(p.models))
	for i, m := range p.models {
		out[i] = m.info
	}
	return out
}

// Lookup finds a model by name, without case and ignoring surrounding spaces.
func (p *Pool) Lookup(name string) (ModelInfo, bool) {
	m, ok := p.byName[strings.ToLower(strings.TrimSpace(name))]
	if !ok {
		return ModelInfo{}, false
	}
	return m.info, true
}

// Usage returns a snapshot of the accounting per model name, with every
// model of the pool present and UnknownModel once a call named no model.
func (p *Pool) Usage() UsageMap { return p.usage.snapshot() }

// Call asks one model one sub-query. It never fails the caller (see
// Response); only ctx's end stops it early, and then the Response is Failed
// with ctx's error. In order: the model is looked up (unknown: failure, no
// provider call), the query is sanitised, the cache is read (read-only miss:
// failure), the provider is called (its requests on the wire bounded by
// pool.max_concurrency, see Config.MaxConcurrency), the reply is made valid
// UTF-8 (validText) and written to the cache (read-write). A cache write
// error is logged, not returned.
func (p *Pool) Call(ctx context.Context, req Request) Response {
	start := time.Now()
	if !p.enter() {
		return p.failure(ctx, start, UnknownModel, req.Model, ErrClosed, false)
	}
	defer p.inflight.Done()

	m, ok := p.byName[strings.ToLower(strings.TrimSpace(req.Model))]
	if !ok {
		err := fmt.Errorf("%w %q (known: %s)", ErrUnknownModel, sanitizeName(req.Model), strings.Join(p.names(), ", "))
		return p.failure(ctx, start, UnknownModel, req.Model, err, true)
	}
	name := m.info.Name
	if err := ctx.Err(); err != nil {
		return p.failure(ctx, start, name, name, err, true)
	}
	call := providerCall{Query: sanitizeQuery(req.Query, p.cfg.MaxQueryChars), Question: req.Question}

	key := ""
	_, offline := m.prov.(offlineProvider)
	if p.cache != nil && !offline {
		k, err := cacheKeyOf(m.info.Provider, m.prov.cacheKey(call))
		switch {
		case err != nil && p.cfg.Cache == CacheReadOnly:
			return p.failure(ctx, start, name, name, err, true)
		case err != nil:
			p.log.Warn("llmpool: cache bypassed", slog.String("model", name), slog.String("err", err.Error()))
		default:
			key = k
			if e, hit := p.cache.get(key); hit {
				return p.success(ctx, start, m, completion{Text: p.scrub(e.Text), InputTokens: e.InputTokens,
					OutputTokens: e.OutputTokens, Estimated: e.Estimated}, true)
			}
			if p.cfg.Cache == CacheReadOnly {
				return p.failure(ctx, start, name, name, fmt.Errorf("%w (model %q)", ErrCacheMiss, name), true)
			}
		}
	}

	c, err := m.prov.complete(ctx, call)
	if err != nil {
		r := p.failureAttempts(ctx, start, name, err, c.Attempts)
		if offline {
			r.Latency = 0
		}
		return r
	}
	// What is returned is what the cache returns on the next call. What
	// the model wrote, when Text is rendered from it, is made safe alike.
	c.Text = p.scrub(validText(c.Text))
	if c.Evidence != "" {
		c.Evidence = p.scrub(validText(c.Evidence))
	}
	if key != "" {
		e := cacheEntry{Text: c.Text, InputTokens: c.InputTokens, OutputTokens: c.OutputTokens, Estimated: c.Estimated}
		if err := p.cache.put(key, name, m.info.Provider, e); err != nil {
			p.log.Warn("llmpool: cache write failed", slog.String("model", name), slog.String("err", err.Error()))
		}
	}
	return p.success(ctx, start, m, c, false)
}

// CallBatch makes the calls concurrently and returns the responses in the
// order of reqs. Every request gets its own goroutine: the requests on the
// wire are bounded by pool.max_concurrency and each model's own limits, not
// by the fan-out, so calls queued on one slow or rate-limited model never
// keep the calls to other models from starting.
func (p *Pool) CallBatch(ctx context.Context, reqs []Request) []Response {
	out := make([]Response, len(reqs))
	var g errgroup.Group
	for i, r := range reqs {
		g.Go(func() error {
			out[i] = p.Call(ctx, r)
			return nil
		})
	}
	_ = g.Wait() // Call never returns an error.
	return out
}

// Close waits for calls in flight, then releases the providers. Calls after
// Close fail with ErrClosed. Closing twice is a no-op.
func (p *Pool) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	p.inflight.Wait()
	p.closeProviders()
	return nil
}

func (p *Pool) closeProviders() {
	for _, m := range p.models {
		m.prov.close()
	}
}

// enter registers a call in flight unless the pool is closed.
func (p *Pool) enter() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.inflight.Add(1)
	return true
}

func (p *Pool) names() []string {
	out := make([]string, len(p.models))
	for i, m := range p.models {
		out[i] = m.info.Name
	}
	return out
}

// scrub replaces every configured API key in a reply with "[redacted]".
func (p *Pool) scrub(s string) string {
	for _, k := range p.secrets {
		s = strings.ReplaceAll(s, k, "[redacted]")
	}
	return s
}

// cost is tokens times prices per million tokens, in USD.
func cost(info ModelInfo, in, out int) float64 {
	return (float64(in)*info.PriceIn + float64(out)*info.PriceOut) / 1e6
}

func (p *Pool) success(ctx context.Context, start time.Time, m *poolModel, c completion, cached bool) Response {
	r := Response{
		Model: m.info.Name, Text: c.Text, InputTokens: c.InputTokens, OutputTokens: c.OutputTokens,
		TokensEstimated: c.Estimated, Cost: cost(m.info, c.InputTokens, c.OutputTokens),
		Latency: time.Since(start), Cached: cached, Evidence: c.Evidence,
	}
	if c.Cost != nil {
		r.Cost = *c.Cost
	}
	if c.Latency != nil {
		r.Latency = *c.Latency
	}
	u := Usage{Calls: 1, ListCost: r.Cost, Latency: r.Latency}
	if cached {
		u.CacheHits = 1
	} else {
		u.InputTokens, u.OutputTokens, u.Cost = int64(c.InputTokens), int64(c.OutputTokens), r.Cost
		u.Retries = int64(max(c.Attempts-1, 0))
	}
	p.usage.add(m.info.Name, u)
	p.log.LogAttrs(ctx, slog.LevelDebug, "llmpool: call", slog.String("model", r.Model), slog.Bool("cached", cached),
		slog.Duration("latency", r.Latency), slog.Int("tokens_in", r.InputTokens), slog.Int("tokens_out", r.OutputTokens))
	return r
}

// failure builds a failed Response and counts it under usageKey. shown is
// the model name put in the failure text (sanitised).
func (p *Pool) failure(ctx context.Context, start time.Time, usageKey, shown string, err error, count bool) Response {
	r := Response{Text: p.failureText(shown), Latency: time.Since(start), Failed: true, Err: err}
	if usageKey != UnknownModel {
		r.Model = usageKey
	}
	if count {
		p.usage.add(usageKey, Usage{Calls: 1, Failures: 1, Latency: r.Latency})
	}
	level := slog.LevelWarn
	if errors.Is(err, ErrUnknownModel) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrClosed) {
		// The policy's own mistakes and shutdowns are routine.
		level = slog.LevelDebug
	}
	p.log.LogAttrs(ctx, level, "llmpool: call failed", slog.String("model", sanitizeName(shown)), slog.String("err", err.Error()))
	return r
}

// failureAttempts is failure for a provider error, counting retries sent.
func (p *Pool) failureAttempts(ctx context.Context, start time.Time, name string, err error, attempts int) Response {
	r := p.failure(ctx, start, name, name, err, true)
	if attempts > 1 {
		p.usage.add(name, Usage{Retries: int64(attempts - 1)})
	}
	return r
}

// failureText is pool.failure_text with {model} replaced.
func (p *Pool) failureText(model string) string {
	return strings.ReplaceAll(p.cfg.FailureText, "{model}", sanitizeName(model))
}

// sanitizeName makes a policy-written model name safe to show inside
// <information> tags: valid UTF-8 without '<', '>' or control characters,
// trimmed, at most 64 characters.
func sanitizeName(s string) string {
	s = strings.Map(func(r rune) rune {
		if r == '<' || r == '>' || unicode.IsControl(r) {
			return -1
		}
		return r
	}, strings.ToValidUTF8(s, ""))
	return strings.TrimSpace(cutRunes(strings.TrimSpace(s), 64))
}

// sanitizeQuery makes a policy-written sub-query safe to send: invalid
// UTF-8 is dropped, surrounding space trimmed, and the result cut to
// maxChars code points, so an untrusted 50,000-character query never makes
// an unbounded request.
func sanitizeQuery(s string, maxChars int) string {
	s = strings.TrimSpace(strings.ToValidUTF8(s, ""))
	return strings.TrimSpace(cutRunes(s, maxChars))
}

// validText makes a reply valid UTF-8 by replacing every byte that is not
// part of a valid UTF-8 sequence with U+FFFD, one per byte, exactly as
// encoding/json does when it writes the reply to the cache. A reply with
// invalid bytes (a simulated answer drawn from a dataset, say) is therefore
// byte-identical whether it comes fresh or from the cache, including
// entries written before this normalisation existed. (strings.ToValidUTF8
// would put one U+FFFD per run of bad bytes, and differ from old entries.)
func validText(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b.WriteRune(utf8.RuneError)
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// cutRunes returns the first n code points of s.
func cutRunes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := 0
	for j := range s {
		if i == n {
			return s[:j]
		}
		i++
	}
	return s
}
