// Package router implements the routing protocol between the policy and the
// LLM pool: the prompt, parsing of the policy's actions, the multi-turn
// rollout state machine and the raw reward components (ReCal's five and cost).
//
// Policy output is untrusted text: every function here accepts any bytes
// (unclosed or nested tags, invalid UTF-8, huge queries) without panicking
// and without producing unbounded requests.
package router

import (
	"strings"
	"unicode/utf8"
)

// Tags of the protocol.
const (
	ThinkOpen   = "<think>"
	ThinkClose  = "</think>"
	SearchOpen  = "<search>"
	SearchClose = "</search>"
	InfoOpen    = "<information>"
	InfoClose   = "</information>"
	AnswerOpen  = "<answer>"
	AnswerClose = "</answer>"
)

// DemoThinkSearch is what the format demonstrations of the SFT warm-up
// (trainer) think before a <search>.
const DemoThinkSearch = "I will ask a model."

// ProtocolText holds the fixed strings of the protocol, the demonstrations
// and the pool's replies, for building compact vocabularies (policyinit).
var ProtocolText = strings.Join([]string{ThinkOpen, ThinkClose, SearchOpen, SearchClose,
	"\n\n" + InfoOpen, InfoClose + "\n\n", AnswerOpen, AnswerClose, DemoThinkSearch,
	"[simulated ] The answer is .", "[pool error: model  unavailable]", "[router: unknown model"}, "\n")

// ActionKind says what a turn asked for.
type ActionKind int

const (
	// NoAction: the turn holds neither a complete search nor an answer.
	NoAction ActionKind = iota
	// Search: <search>MODEL: query</search>, a call to a pool model.
	Search
	// Answer: <answer>…</answer>, the final answer.
	Answer
)

// Action is the first complete <search> or <answer> element of a turn.
type Action struct {
	Kind   ActionKind
	Model  string // Search: the text before the first colon, trimmed (not yet matched against the pool)
	Query  string // Search: the text after the first colon, trimmed and cut to MaxQueryBytes
	Answer string // Answer: the text inside the tags, trimmed
}

// MaxQueryBytes bounds a sub-query sent to the pool; longer ones are cut at
// a UTF-8 boundary.
const MaxQueryBytes = 2000

// ParseAction returns the first complete <search>…</search> or
// <answer>…</answer> of a turn's text, whichever starts first.
func ParseAction(text string) Action {
	text = strings.ToValidUTF8(text, "\uFFFD")
	s, sOK := element(text, SearchOpen, SearchClose)
	a, aOK := element(text, AnswerOpen, AnswerClose)
	si := strings.Index(text, SearchOpen)
	ai := strings.Index(text, AnswerOpen)
	if sOK && (!aOK || si < ai) {
		name, query, _ := strings.Cut(s, ":")
		// Trimmed again after the cut, which may end at a space.
		return Action{Kind: Search, Model: strings.TrimSpace(name), Query: strings.TrimSpace(truncate(strings.TrimSpace(query), MaxQueryBytes))}
	}
	if aOK {
		return Action{Kind: Answer, Answer: strings.TrimSpace(a)}
	}
	return Action{Kind: NoAction}
}

// element returns the content of the first open…close pair; the content is
// taken from the last open tag before the close, so "<search><search>x</search>"
// yields "x".
func element(text, open, close string) (string, bool) {
	i := strings.Index(text, open)
	if i < 0 {
		return "", false
	}
	j := strings.Index(text[i:], close)
	if j < 0 {
		return "", false
	}
	inner := text[i+len(open) : i+j]
	if k := strings.LastIndex(inner, open); k >= 0 {
		inner = inner[k+len(open):]
	}
	return inner, true
}

// truncate cuts s to at most n bytes without splitting a rune.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// LastAnswer is the content of the last complete <answer> element of a
// response, trimmed, and whether there was one: the last <answer> with a
// </answer> after it, up to the first one ("<answer>A</answer></answer>"
// answers "A").
func LastAnswer(text string) (string, bool) {
	j := strings.LastIndex(text, AnswerClose)
	if j < 0 {
		return "", false
	}
	i := strings.LastIndex(text[:j], AnswerOpen)
	if i < 0 {
		return "", false
	}
	inner := text[i+len(AnswerOpen) : j]
	if k := strings.Index(inner, AnswerClose); k >= 0 {
		inner = inner[:k]
	}
	return strings.TrimSpace(inner), true
}

// InfoBlocks returns the contents of every complete <information> element.
func InfoBlocks(text string) []string {
	var out []string
	for {
		i := strings.Index(text, InfoOpen)
		if i < 0 {
			return out
		}
		rest := text[i+len(InfoOpen):]
		j := strings.Index(rest, InfoClose)
		if j < 0 {
			return out
		}
		out = append(out, rest[:j])
		text = rest[j+len(InfoClose):]
	}
}

var tagNames = []string{"think", "search", "information", "answer"}

// WellFormed reports whether a whole response (policy text with the
// <information> blocks the environment inserted) follows the protocol:
// it starts with <think>; think/search/information/answer tags are balanced
// and never nested; exactly one <answer>, at the end; as many information
// blocks as searches; every search names a model that known accepts and has
// a non-empty query after the first colon.
func WellFormed(text string, known func(model string) bool) bool {
	text = strings.TrimSpace(text)
	if !strings.HasPrefix(text, ThinkOpen) || !strings.HasSuffix(text, AnswerClose) {
		return false
	}
	open := ""
	openAt := 0
	counts := map[string]int{}
	for i := 0; i < len(text); {
		if text[i] != '<' {
			i++
			continue
		}
		name, closing, n := tagAt(text[i:])
		if n == 0 {
			i++
			continue
		}
		switch {
		case !closing && open != "":
			return false // nested
		case !closing:
			open, openAt = name, i+n
		case closing && open != name:
			return false // unbalanced
		default:
			counts[name]++
			if name == "search" {
				model, query, ok := strings.Cut(text[openAt:i], ":")
				if !ok || strings.TrimSpace(query) == "" || !known(strings.TrimSpace(model)) {
					return false
				}
			}
			open = ""
		}
		i += n
	}
	return open == "" && counts["answer"] == 1 && counts["information"] == counts["search"]
}

// tagAt recognises a protocol tag at the start of s, returning its name,
// whether it closes, and its length (0 if none).
func tagAt(s string) (name string, closing bool, n int) {
	rest := s[1:]
	if strings.HasPrefix(rest, "/") {
		closing = true
		rest = rest[1:]
	}
	for _, t := range tagNames {
		if strings.HasPrefix(rest, t+">") {
			n = len(s) - len(rest) + len(t) + 1
			return t, closing, n
		}
	}
	return "", false, 0
}
