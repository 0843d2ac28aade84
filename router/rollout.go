package router

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/recal-project/recal/internal/generate"
	"github.com/recal-project/recal/llmpool"
)

// Tokenizer is what a rollout needs of the tokenizer (*tokenizer.Tokenizer).
// It must be safe for concurrent use: pool replies are encoded on the
// goroutines that wait for them.
type Tokenizer interface {
	generate.Detokenizer
	// Encode encodes trusted text: added tokens written in it, such as
	// "<|im_end|>", become their ids.
	Encode(text string) []int
	// EncodePlain encodes untrusted text: added tokens written in it stay
	// ordinary text.
	EncodePlain(text string) []int
	Decode(ids []int) string
}

// Pool is what a rollout needs of the LLM pool (*llmpool.Pool).
type Pool interface {
	Call(ctx context.Context, req llmpool.Request) llmpool.Response
	Lookup(name string) (llmpool.ModelInfo, bool)
}

// Call records one pool call of a response.
type Call struct {
	Model string `json:"model"` // pool name, or what the policy wrote when unknown
	Query string `json:"query"`
	Reply string `json:"reply"` // the text inside the <information> block: the reply or failure text, sanitised and cut (see InfoBlock)
	// Evidence is what the model wrote when Reply is rendered from a
	// judgment (llmpool.Response.Evidence: a replayed reply); agreement
	// (Agreeing) is read on it. Empty when Reply is what the model wrote.
	Evidence   string        `json:"evidence,omitempty"`
	ReplyBytes int           `json:"reply_bytes"` // length in bytes of the reply or failure text before the cut
	Failed     bool          `json:"failed"`
	Unknown    bool          `json:"unknown,omitempty"` // the name matched no pool model (or none the response may call): no call was made
	Refused    bool          `json:"refused,omitempty"` // the response's cost budget was spent (RowOptions.MaxCostUSD): no call was made
	Cached     bool          `json:"cached,omitempty"`
	Cost       float64       `json:"cost"`
	Latency    time.Duration `json:"latency_ns"`
	Turn       int           `json:"turn"`
	// PromptTokens and CompletionTokens are the pool call's tokens as the
	// provider reported them or, when TokensEstimated, as estimated
	// (llmpool.Response); 0 when no call was made or it failed.
	PromptTokens     int  `json:"prompt_tokens,omitempty"`
	CompletionTokens int  `json:"completion_tokens,omitempty"`
	TokensEstimated  bool `json:"tokens_estimated,omitempty"`
}

// UnknownModelText is the observation for a <search> naming no pool model.
const UnknownModelText = "[router: unknown model %q; the pool has: %s]"

// Job is one response to roll out: a question and its prompt tokens.
type Job struct {
	Question llmpool.Question
	Prompt   []int32
	// Models are the pool models Rollout lets the response call (its
	// RowOptions.Models: nil means every pool model, another name is an
	// unknown model); the prompt should list exactly these. Scheduler.Submit
	// reads RowOptions.Models instead.
	Models []string
	// MaxCostUSD is the response's pool budget (its RowOptions.MaxCostUSD;
	// 0 = none).
	MaxCostUSD float64
}

// Sample is one finished response.
type Sample struct {
	Tokens []int32   // response tokens after the prompt: the policy's and the inserted <information> blocks
	Mask   []float32 // 1 for tokens the policy wrote (they train), 0 for <information> blocks
	Logp   []float32 // log-probability of each policy token at sampling time (0 for inserted tokens)
	Text   string    // the decoded response
	Calls  []Call
	Turns  int // policy turns generated
	// End says why it ended: "answer", "eos", "length" (turn limit without
	// action), "final" (search in the final turn), "context", or
	// "information" (the policy wrote <information> itself, a format failure:
	// only the environment inserts information blocks).
	End string
	// Closed counts the tags that router.on_repeat = "close" closed for the
	// policy when its copy began to loop.
	Closed int
	// Constrained lists the indices into Tokens of the policy's tokens
	// chosen under router.answer_span or router.search_names, and those
	// chosen under router.call_first, router.final_answer or
	// router.match_close with a log-probability below −0.1 (where the ban
	// can have mattered; see guardSlack). Their Logp is the
	// unconstrained policy's, which can lie far below what the constrained
	// choice gave them (a name completed that the policy meant to write
	// otherwise); PPO leaves them out of its per-token KL penalty, which
	// would otherwise reward pushing them down without bound.
	Constrained []int
}

// CalledModels lists the pool models actually called, in order.
func (s *Sample) CalledModels() []string {
	var out []string
	for _, c := range s.Calls {
		if !c.Unknown && !c.Refused {
			out = append(out, c.Model)
		}
	}
	return out
}

// Stats describe where a rollout's time went.
type Stats struct {
	Wall       time.Duration // the whole rollout
	Decode     time.Duration // time inside Decoder.Extend
	SlowestSum time.Duration // Σ over turns of the slowest pool call of that turn
	Calls      int
}

// CriticalPath is decode time plus the slowest call of every turn: what a
// rollout that overlaps everything else could not beat.
func (s Stats) CriticalPath() time.Duration { return s.Decode + s.SlowestSum }

// Rollout runs the routing protocol for jobs on rows 0..len(jobs)-1 of a
// decoder whose rows are empty: generate until </search>, </answer>,
// <information>, EOS or the turn's token limit; act on the turn's first
// <search> or <answer>; call the named pool model (concurrently: rows that
// are not waiting keep decoding); append
// "\n\n<information>REPLY</information>\n\n" (see InfoBlock); continue.
// After cfg.MaxTurns calls comes one final turn without routing. A turn in
// which the policy writes <information> itself ends the response there
// (End "information"): it never sees a block it wrote, and the response is
// never well formed.
//
// It runs a Scheduler on the caller's goroutine with every job admitted at
// once (job i on row i) and one seed for the whole rollout: the decoder
// draws per row and position, so samples do not depend on how rows were
// batched.
func Rollout(ctx context.Context, dec generate.Decoder, tok Tokenizer, pool Pool, cfg Config, jobs []Job,
	s generate.Sampling, eos []int32, seed uint64) ([]Sample, Stats, error) {
	start := time.Now()
	for i, j := range jobs {
		if len(j.Prompt) == 0 {
			return nil, Stats{}, fmt.Errorf("router: job %d: empty prompt", i)
		}
	}
	if len(jobs) == 0 {
		return []Sample{}, Stats{}, nil
	}
	if err := cfg.checkDecoder(dec); err != nil {
		return nil, Stats{}, fmt.Errorf("router: rollout: %w", err)
	}
	e, err := NewScheduler(freshRows{dec}, tok, pool, cfg, SchedulerOptions{Rows: len(jobs), EOS: eos, Seed: seed})
	if err != nil {
		return nil, Stats{}, err
	}
	ps := make([]*Pending, len(jobs))
	for i, j := range jobs {
		if ps[i], err = e.Submit(ctx, j, RowOptions{Sampling: s, Models: j.Models, MaxCostUSD: j.MaxCostUSD}); err != nil {
			return nil, Stats{}, fmt.Errorf("router: job %d: %w", i, err)
		}
	}
	err = e.drain(ctx)
	st := e.Stats()
	st.Wall = time.Since(start)
	if err != nil {
		return nil, st, err
	}
	out := make([]Sample, len(jobs))
	for i, p := range ps {
		if out[i], err = p.Result(); err != nil {
			return nil, st, err
		}
	}
	return out, st, nil
}

// freshRows is Rollout's Decoder: its rows are never reused.
type freshRows struct{ generate.Decoder }

func (freshRows) Reset(context.Context, ...int) error {
	return errors.New("router: rollout: rows are never reused")
}

// ExtendBanned passes bans on when the wrapped decoder takes them.
func (f freshRows) ExtendBanned(ctx context.Context, rows []int, tokens [][]int32, s generate.Sampling, seed uint64, ban [][]int32) ([]int32, []float32, error) {
	b, ok := f.Decoder.(BanDecoder)
	if !ok {
		return nil, nil, fmt.Errorf("router: %T cannot ban tokens (router.no_repeat_ngram)", f.Decoder)
	}
	return b.ExtendBanned(ctx, rows, tokens, s, seed, ban)
}

// Vocab passes the wrapped decoder's vocabulary size on (0 when it has none).
func (f freshRows) Vocab() int {
	if v, ok := f.Decoder.(VocabDecoder); ok {
		return v.Vocab()
	}
	return 0
}

func isIn(t int32, set []int32) bool {
	for _, e := range set {
		if t == e {
			return true
		}
	}
	return false
}

func toInt32(v []int) []int32 {
	out := make([]int32, len(v))
	for i, x := range v {
		out[i] = int32(x)
	}
	return out
}

func toInts(v []int32) []int {
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = int(x)
	}
	return out
}
