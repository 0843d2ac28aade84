package router

import (
	"fmt"
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
	// AnswerWhole narrows AnswerSpan to whole answers: a reply that states
	// a short answer (data.ShortAnswer: its text after "answer is", or the
	// whole reply when of at most five words) offers only that answer,
	// from its first word to its last, instead of any span of its text, so
	// an answer can neither stop inside it ("Gerald" of "Gerald R. Ford")
	// nor take in the words around it ("answer is Paris"). Other replies
	// (prose) still offer any span. Needs AnswerSpan. false = off.
	AnswerWhole bool `toml:"answer_whole"`
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
	// FinalAnswer keeps the last turn for the answer: once the response
	// has no call left (max_turns <search> turns acted on, refused ones
	// included), no token may write "<s" (the start of <search>, the only
	// protocol tag that begins so), and after the turn's </think> only
	// tokens that spell <answer> may follow (a forced span, as
	// SearchNames's names). Without it a <search> there ends the response
	// unanswered (Sample.End "final"); a policy trained from scratch that
	// does not count its calls does so on some questions, and with only
	// the search banned it writes other tags or loops until the turn's
	// limit. Log-probabilities stay the unconstrained policy's. Needs a
	// decoder as AnswerSpan's. false = off.
	FinalAnswer bool `toml:"final_answer"`
	// MatchClose keeps closing tags matched: inside an open <think>,
	// <search> or <answer>, a closing tag the policy writes can only be
	// that tag's own ("</" then "think>" in <think>). A policy trained from
	// scratch otherwise sometimes closes <think> with </answer> or
	// </search> on an unfamiliar question, and the turn ends with no
	// action. Log-probabilities stay the unconstrained policy's. Needs a
	// decoder as AnswerSpan's. false = off.
	MatchClose bool `toml:"match_close"`
	// Agreement adds a note to each observation after the first:
	// "Agrees with: fid." naming the earlier replies of the response that
	// agree with this one (one's short answer mentioned by the other,
	// either way round: Agreeing), or "Agrees with: none.". It is computed
	// from what the models wrote (a replayed reply's logged text, not its
	// rendering), as a deployment would compute it, and reads no label; it
	// spares a small policy the string comparison a large one does by
	// reading. false = off.
	Agreement bool `toml:"agreement"`
}

// constrains reports whether a decoding constraint of the protocol is on.
func (c Config) constrains() bool {
	return c.AnswerSpan || c.SearchNames || c.CallFirst || c.FinalAnswer || c.MatchClose
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
	case c.AnswerWhole && !c.AnswerSpan:
		return fmt.Errorf("router.answer_whole = true: it narrows router.answer_span, which is off")
	}
	return nil
}

// Capacity is the most tokens a response can add after its prompt.
func (c Config) Capacity() int {
	const wrap = 16 // "\n\n<information>" and "</information>\n\n"
	return (c.MaxTurns+1)*c.TurnTokens + c.MaxTurns*(c.InfoTokens+wrap)
}
