package tokenizer

import (
	"sort"
	"strings"
	"unicode/utf8"
)

// Encode returns the token ids of text, as Hugging Face's
// tokenizer.encode(text, add_special_tokens=False) does (the package comment
// lists the steps). Added and special tokens written in the text, such as
// "<|im_start|>", become their ids. Invalid UTF-8 is repaired first, as
// Decode repairs it, so Encode never fails.
func (t *Tokenizer) Encode(text string) []int {
	text = toValidUTF8(text)
	ids := make([]int, 0, len(text)/3+1)
	start := 0
	for i := 0; i < len(text); {
		id, n := t.added.match(text, i)
		if n == 0 {
			i++
			continue
		}
		ids = t.appendSection(ids, text[start:i])
		ids = append(ids, id)
		i += n
		start = i
	}
	return t.appendSection(ids, text[start:])
}

// EncodePlain returns the token ids of text read as plain text: added and
// special tokens written in it are not matched, so "<|im_end|>" encodes as
// the ordinary pieces "<|", "im", "_end", "|>" and never as id 151645.
// Otherwise it is Encode. Text from outside recal (dataset questions, pool
// replies) is encoded this way, so it can never inject a control token into
// the policy's context (given a model vocabulary that does not itself hold
// the added tokens, as Qwen2's and Qwen2.5's does not: BPE then cannot
// produce their ids).
func (t *Tokenizer) EncodePlain(text string) []int {
	text = toValidUTF8(text)
	return t.appendSection(make([]int, 0, len(text)/3+1), text)
}

// Segment is one piece of the text EncodeSegments encodes.
type Segment struct {
	Text  string
	Plain bool // added tokens written in Text are ordinary text, as in EncodePlain
}

// EncodeSegments encodes the concatenation of segs as Encode encodes it,
// except that added tokens are matched only inside segments that are not
// Plain, each segment on its own (a token is never matched across a
// boundary). Text between two matched added tokens is one section whatever
// segments it spans, so a plain segment is tokenised together with its
// neighbours: when no Plain segment holds an added token, the ids equal
// Encode of the concatenation. Recal uses it to render a chat whose template
// markers are special tokens around a question that must stay plain text.
func (t *Tokenizer) EncodeSegments(segs ...Segment) []int {
	var ids []int
	var sec strings.Builder // the section since the last added token
	for _, sg := range segs {
		text := toValidUTF8(sg.Text)
		if sg.Plain {
			sec.WriteString(text)
			continue
		}
		start := 0
		for i := 0; i < len(text); {
			id, n := t.added.match(text, i)
			if n == 0 {
				i++
				continue
			}
			sec.WriteString(text[start:i])
			ids = t.appendSection(ids, sec.String())
			sec.Reset()
			ids = append(ids, id)
			i += n
			start = i
		}
		sec.WriteString(text[start:])
	}
	return t.appendSection(ids, sec.String())
}

// appendSection encodes text that holds no added token.
func (t *Tokenizer) appendSection(ids []int, s string) []int {
	if s == "" {
		return ids
	}
	if t.normalize != nil {
		s = t.normalize(s)
	}
	t.eachPiece(s, 0, func(piece string) {
		ids = t.model.appendWord(ids, piece)
	})
	return ids
}

// eachPiece runs the Split steps from step on: every piece of one is split
// again by the next.
func (t *Tokenizer) eachPiece(s string, step int, fn func(string)) {
	if step == len(t.splits) {
		fn(s)
		return
	}
	t.splits[step].split(s, func(piece string) { t.eachPiece(piece, step+1, fn) })
}

// addedMatcher finds added tokens in raw text, leftmost-longest, as Hugging
// Face's AddedVocabulary (an Aho-Corasick automaton) does.
type addedMatcher struct {
	first  [256]bool      // some token starts with this byte
	tokens []addedPattern // longest first
}

type addedPattern struct {
	text string
	id   int
}

func (a *addedMatcher) add(text string, id int) {
	a.first[text[0]] = true
	a.tokens = append(a.tokens, addedPattern{text, id})
}

func (a *addedMatcher) finish() {
	sort.SliceStable(a.tokens, func(i, j int) bool { return len(a.tokens[i].text) > len(a.tokens[j].text) })
}

// match returns the id and length of the longest added token at s[i:], or
// n == 0.
func (a *addedMatcher) match(s string, i int) (id, n int) {
	if !a.first[s[i]] {
		return 0, 0
	}
	rest := s[i:]
	for _, p := range a.tokens {
		if strings.HasPrefix(rest, p.text) {
			return p.id, len(p.text)
		}
	}
	return 0, 0
}

// toValidUTF8 replaces each maximal invalid subsequence of s by U+FFFD.
func toValidUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return string(appendValidUTF8(make([]byte, 0, len(s)+8), []byte(s)))
}

// appendValidUTF8 appends b to dst with each maximal invalid subsequence
// replaced by U+FFFD ("substitution of maximal subparts", Unicode §3.9; what
// WHATWG TextDecoder, Rust's String::from_utf8_lossy and Python's
// decode(errors="replace") do). Go's own []rune conversion instead writes one
// U+FFFD per bad byte.
func appendValidUTF8(dst, b []byte) []byte {
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r != utf8.RuneError || n > 1 {
			dst = append(dst, b[:n]...)
			b = b[n:]
			continue
		}
		dst = utf8.AppendRune(dst, utf8.RuneError)
		b = b[maximalSubpart(b):]
	}
	return dst
}

// maximalSubpart returns the length of the invalid sequence at the start of
// b: the longest prefix that could begin a valid sequence, at least 1.
func maximalSubpart(b []byte) int {
	lo, hi := byte(0x80), byte(0xBF) // range of the first continuation byte
	var need int
	switch c := b[0]; {
	case 0xC2 <= c && c <= 0xDF:
		need = 1
	case c == 0xE0:
		need, lo = 2, 0xA0
	case 0xE1 <= c && c <= 0xEC, c == 0xEE, c == 0xEF:
		need = 2
	case c == 0xED:
		need, hi = 2, 0x9F
	case c == 0xF0:
		need, lo = 3, 0x90
	case 0xF1 <= c && c <= 0xF3:
		need = 3
	case c == 0xF4:
		need, hi = 3, 0x8F
	default:
		return 1
	}
	n := 1
	for k := 0; k < need && n < len(b); k++ {
		c := b[n]
		if k > 0 {
			lo, hi = 0x80, 0xBF
		}
		if c < lo || c > hi {
			break
		}
		n++
	}
	return n
}
