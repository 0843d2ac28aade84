package router

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/recal-project/recal/generate"
	"github.com/recal-project/recal/llmpool"
)

// Config holds the routing protocol's settings ([router] in recal.toml).
type Config struct {
	// MaxTurns is the most pool calls per response; one final turn without
	// routing follows them (paper: 3).
	MaxTurns int `toml:"max_turns"`
	// TurnTokens is the token limit of one policy turn.
	TurnTokens int `toml:"turn_tokens"`
	// InfoTokens is the token limit of a pool reply inside <information>
	// (Router-R1: 600).
	InfoTokens int `toml:"info_tokens"`
	// PromptTemplate is the prompt template file (text/template; see
	// router/prompt.go for its fields). Relative to the config file.
	PromptTemplate string `toml:"prompt_template"`
	// NoRepeatNGram, when n > 0, stops the policy from repeating itself
	// within a turn: a token that would complete an n-gram the turn already
	// holds is never chosen (greedy or sampled; log-probabilities stay the
	// unfiltered policy's, as with top-p). A copy that loses its place
	// otherwise loops ("in the alphabet that does not appear in the
	// alphabet that ...") until the turn's token limit. 0 = off.
	NoRepeatNGram int `toml:"no_repeat_ngram"`
	// OnRepeat is what the n-gram rule does with a token that would repeat
	// an n-gram inside a tag: "ban" chooses another token (the loop usually
	// goes on in other words: "never never never Town Town Town ..."),
	// "close" takes it as the sign that the copy lost its place and writes
	// the open tag's closing tag (</search>, </answer>, </think>) instead,
	// so the turn acts on what was written before the loop. Closing tokens
	// are inserted (mask 0), not the policy's; Sample.Closed counts them.
	// A loop outside any tag ends the turn. Used only when NoRepeatNGram > 0;
	// "" is "ban".
	OnRepeat string `toml:"on_repeat"`
	// AnswerSpan makes answers extractive: inside <answer>, after a pool
	// call, the policy may write only a span of the text of an
	// <information> block it was shown (a leading space, then tokens that
	// keep the answer a substring of a reply), then the closing tag. It
	// decides where the span starts and where it ends; a policy trained
	// from scratch no longer loses words while copying them (a pretrained
	// one copies without it). Log-probabilities stay the unconstrained
	// policy's, as with no_repeat_ngram. Needs a decoder that can ban
	// tokens and knows its vocabulary (VocabDecoder). false = off.
	AnswerSpan bool `toml:"answer_span"`
	// SearchNames constrains the model name of a search: inside <search>,
	// before the colon, the policy may write only a model name its prompt
	// lists (every pool model, or the row's subset), then the colon;
	// after it the sub-query is free. A call then never goes to a name
	// that is not there (a policy trained from scratch sometimes copies the
	// question into the name). Log-probabilities stay the unconstrained
	// policy's. Needs a pool that lists its models, and a decoder as
	// AnswerSpan's. false = off.
	SearchNames bool `toml:"search_names"`
	// CallFirst keeps the policy from answering before a pool call has
	// answered: until the response holds a reply, no token may write
	// "<a" (the start of <answer>, the only protocol tag that begins so),
	// so the policy routes before it answers. A policy that knows nothing
	// of its own (one trained from scratch) otherwise answers some
	// unfamiliar questions directly with words of no meaning. A reply that
	// is an error or a refusal counts; with no call left (max_turns) the
	// policy answers freely. Log-probabilities stay the unconstrained
	// policy's. Needs a decoder as AnswerSpan's. false = off.
	CallFirst bool `toml:"call_first"`
	// MatchClose keeps closing tags matched: inside an open <think>,
	// <search> or <answer>, a closing tag the policy writes can only be
	// that tag's own ("</" then "think>" in <think>). A policy trained from
	// scratch otherwise sometimes closes <think> with </answer> or
	// </search> on an unfamiliar question, and the turn ends with no
	// action. Log-probabilities stay the unconstrained policy's. Needs a
	// decoder as AnswerSpan's. false = off.
	MatchClose bool `toml:"match_close"`
}

// constrains reports whether a decoding constraint of the protocol is on.
func (c Config) constrains() bool {
	return c.AnswerSpan || c.SearchNames || c.CallFirst || c.MatchClose
}

// What router.on_repeat may be.
const (
	OnRepeatBan   = "ban"
	OnRepeatClose = "close"
)

// DefaultConfig is the paper's protocol.
func DefaultConfig() Config {
	return Config{MaxTurns: 3, TurnTokens: 256, InfoTokens: 600, PromptTemplate: "router/prompt.tmpl", OnRepeat: OnRepeatBan}
}

// bans reports whether the n-gram rule bans tokens, which needs a
// BanDecoder ("close" needs none).
func (c Config) bans() bool { return c.NoRepeatNGram > 0 && c.OnRepeat != OnRepeatClose }

// checkDecoder reports a setting dec cannot serve.
func (c Config) checkDecoder(dec any) error {
	_, ban := dec.(BanDecoder)
	if c.bans() && !ban {
		return fmt.Errorf("router.no_repeat_ngram = %d needs a decoder that can ban tokens (%T cannot)", c.NoRepeatNGram, dec)
	}
	if _, vocab := dec.(VocabDecoder); c.constrains() && (!ban || !vocab) {
		return fmt.Errorf("router.answer_span, router.search_names, router.call_first and router.match_close need a decoder that can ban tokens and knows its vocabulary (%T cannot)", dec)
	}
	return nil
}

// Validate names the first bad key.
func (c Config) Validate() error {
	switch {
	case c.MaxTurns < 0:
		return fmt.Errorf("router.max_turns = %d: must be ≥ 0", c.MaxTurns)
	case c.TurnTokens < 1:
		return fmt.Errorf("router.turn_tokens = %d: must be ≥ 1", c.TurnTokens)
	case c.InfoTokens < 1:
		return fmt.Errorf("router.info_tokens = %d: must be ≥ 1", c.InfoTokens)
	case c.NoRepeatNGram < 0 || c.NoRepeatNGram == 1:
		return fmt.Errorf("router.no_repeat_ngram = %d: must be 0 (off) or ≥ 2", c.NoRepeatNGram)
	case c.OnRepeat != "" && c.OnRepeat != OnRepeatBan && c.OnRepeat != OnRepeatClose:
		return fmt.Errorf("router.on_repeat = %q: must be %q or %q", c.OnRepeat, OnRepeatBan, OnRepeatClose)
	}
	return nil
}

// Capacity is the most tokens a response can add after its prompt.
func (c Config) Capacity() int {
	const wrap = 16 // "\n\n<information>" and "</information>\n\n"
	return (c.MaxTurns+1)*c.TurnTokens + c.MaxTurns*(c.InfoTokens+wrap)
}

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
	Model      string        `json:"model"` // pool name, or what the policy wrote when unknown
	Query      string        `json:"query"`
	Reply      string        `json:"reply"`       // the text inside the <information> block: the reply or failure text, sanitised and cut (see InfoBlock)
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
	// unknown model); the prompt should list exactly these. Engine.Submit
	// reads RowOptions.Models instead.
	Models []string
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
	// chosen under router.call_first or router.match_close with a
	// log-probability below −0.1 (where the ban can have mattered; see
	// guardSlack). Their Logp is the
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
// It runs an Engine on the caller's goroutine with every job admitted at
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
	e, err := NewEngine(freshRows{dec}, tok, pool, cfg, EngineOptions{Rows: len(jobs), EOS: eos, Seed: seed})
	if err != nil {
		return nil, Stats{}, err
	}
	ps := make([]*Pending, len(jobs))
	for i, j := range jobs {
		if ps[i], err = e.Submit(ctx, j, RowOptions{Sampling: s, Models: j.Models}); err != nil {
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

// ReplyBytesPerToken bounds how much of a pool reply is read: InfoBlock cuts
// a reply to limit × ReplyBytesPerToken bytes (at a UTF-8 boundary) before
// anything else, so a reply of megabytes costs what a short one costs. Text
// averages about 4 bytes a token and few tokens are longer than 16 bytes
// (Qwen2.5: 1.3% of the vocabulary, runs of spaces, dashes or code), so the
// cut almost never reaches the tokens the policy is shown; when it does,
// the block just holds fewer tokens.
const ReplyBytesPerToken = 16

// InfoBlock is the observation appended after a pool call,
// "\n\n<information>BODY</information>\n\n", and BODY as text (what
// Call.Reply records). BODY is the reply cut to limit × ReplyBytesPerToken
// bytes, sanitised (protocol tags removed), encoded as plain text
// (EncodePlain: "<|im_end|>" in a reply is text, not a control token) and
// cut to at most limit tokens. Only the wrapping is recal's own.
func InfoBlock(tok Tokenizer, reply string, limit int) (block []int32, body string) {
	limit = max(limit, 0)
	maxBytes := math.MaxInt
	if limit < math.MaxInt/ReplyBytesPerToken {
		maxBytes = limit * ReplyBytesPerToken
	}
	ids := tok.EncodePlain(sanitizeReply(truncate(reply, maxBytes)))
	if len(ids) > limit {
		ids = ids[:limit]
	}
	block = toInt32(tok.Encode("\n\n" + InfoOpen))
	block = append(block, toInt32(ids)...)
	block = append(block, toInt32(tok.Encode(InfoClose+"\n\n"))...)
	return block, tok.Decode(ids)
}

// sanitizeReply trims a pool reply and removes protocol tags from it, so an
// untrusted reply can neither close the <information> block nor fake an
// action.
func sanitizeReply(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	for changed := true; changed; { // removing one tag can join the halves of another
		changed = false
		for _, t := range []string{ThinkOpen, ThinkClose, SearchOpen, SearchClose, InfoOpen, InfoClose, AnswerOpen, AnswerClose} {
			if strings.Contains(s, t) {
				s, changed = strings.ReplaceAll(s, t, ""), true
			}
		}
	}
	return strings.TrimSpace(s)
}

func stopIn(text []byte, before int, stops []string) (string, bool) {
	for _, s := range stops {
		from := max(0, before-len(s)+1)
		if bytes.Contains(text[from:], []byte(s)) {
			return s, true
		}
	}
	return "", false
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

// RepeatBan returns the tokens that would complete an n-gram already in
// turn (the tokens of the current turn so far): for every earlier position
// where turn's last n−1 tokens occur, the token that followed them. nil when
// n < 2 or the turn is shorter than n.
func RepeatBan(turn []int32, n int) []int32 {
	if n < 2 || len(turn) < n {
		return nil
	}
	k := n - 1
	tail := turn[len(turn)-k:]
	var ban []int32
	for i := 0; i+k < len(turn); i++ {
		match := true
		for j := 0; j < k; j++ {
			if turn[i+j] != tail[j] {
				match = false
				break
			}
		}
		if match && !containsToken(ban, turn[i+k]) {
			ban = append(ban, turn[i+k])
		}
	}
	return ban
}

func containsToken(ts []int32, t int32) bool {
	for _, u := range ts {
		if u == t {
			return true
		}
	}
	return false
}
