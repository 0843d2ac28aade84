package tokenizer

import (
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// splitter is one Split step of the pre-tokenizer (behavior Isolated): it cuts
// s into consecutive pieces, the regex matches and the text between them,
// and calls fn on each non-empty piece in order.
type splitter interface {
	split(s string, fn func(piece string))
}

// regexSplitter runs any pattern on regexp2, whose default (.NET) syntax is
// close to the Oniguruma syntax Hugging Face uses: lookahead, (?i:…), \p{L}.
// As in Oniguruma, \s is Unicode White_Space (U+0085 included, U+FEFF not).
type regexSplitter struct {
	re *regexp2.Regexp
}

func compileRegexSplitter(pattern string) (regexSplitter, error) {
	re, err := regexp2.Compile(pattern, regexp2.None)
	if err != nil {
		return regexSplitter{}, err
	}
	return regexSplitter{re: re}, nil
}

// newRegexSplitter compiles a pattern known to be valid.
func newRegexSplitter(pattern string) regexSplitter {
	sp, err := compileRegexSplitter(pattern)
	if err != nil {
		panic("tokenizer: built-in pattern: " + err.Error())
	}
	return sp
}

func (r regexSplitter) split(s string, fn func(string)) {
	runes := []rune(s)
	prev := 0
	m, err := r.re.FindRunesMatch(runes)
	for m != nil && err == nil {
		if m.Index > prev {
			fn(string(runes[prev:m.Index]))
		}
		if m.Length > 0 {
			fn(string(runes[m.Index : m.Index+m.Length]))
		}
		prev = m.Index + m.Length
		m, err = r.re.FindNextMatch(m)
	}
	if prev < len(runes) {
		fn(string(runes[prev:]))
	}
}

// qwen2Pattern is the Split regex of Qwen2, Qwen2.5 (and Qwen3) tokenizers.
const qwen2Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// qwen2Splitter matches qwen2Pattern without a regex engine, about 30 times
// faster than regexp2 (BenchmarkSplit). Its character classes are regexp2's:
// \p{L} and \p{N} are Go's unicode.L and unicode.N, \s is unicode.IsSpace
// (Oniguruma's \s too), and (?i) compares unicode.ToLower of the input, so
// 'S matches and 'ſ (U+017F) does not; Oniguruma's Unicode case folding may
// match 'ſ, an untested corner.
// TestQwen2SplitterMatchesRegex and FuzzQwen2Splitter check it against the
// regex.
//
// The alternatives, tried in order at each position, as a backtracking
// engine resolves them:
//
//  1. ' followed by s, t, re, ve, m, ll or d in any case;
//  2. one rune that is not \r, \n, letter or digit, then letters; or letters;
//  3. one digit;
//  4. an optional space, runes that are not space, letter or digit, then
//     \r and \n;
//  5. a whitespace run that holds \r or \n, up to and including the last of
//     them (\s*[\r\n]+ backtracks to it);
//  6. a whitespace run, less its last rune when a non-space follows;
//  7. a whitespace run.
//
// Every rune is a letter, a digit, a space or none of these, so no text falls
// between matches.
type qwen2Splitter struct{}

func (qwen2Splitter) split(s string, fn func(string)) {
	for len(s) > 0 {
		n := qwen2Match(s)
		fn(s[:n])
		s = s[n:]
	}
}

func isLetter(r rune) bool { return unicode.IsLetter(r) }
func isDigit(r rune) bool  { return unicode.IsNumber(r) }
func isSpace(r rune) bool  { return unicode.IsSpace(r) }
func isNL(r rune) bool     { return r == '\r' || r == '\n' }

// isOther is [^\s\p{L}\p{N}].
func isOther(r rune) bool { return !isSpace(r) && !isLetter(r) && !isDigit(r) }

// decode returns the rune at s[i:] and its size; utf8.RuneError, 0 at the end.
func decode(s string, i int) (rune, int) {
	if i >= len(s) {
		return utf8.RuneError, 0
	}
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

// spanOf returns the end of the run of runes satisfying f from i.
func spanOf(s string, i int, f func(rune) bool) int {
	for i < len(s) {
		r, n := decode(s, i)
		if !f(r) {
			break
		}
		i += n
	}
	return i
}

// qwen2Match returns the byte length of the qwen2Pattern match at the start
// of the non-empty s.
func qwen2Match(s string) int {
	r0, n0 := decode(s, 0)
	r1, n1 := decode(s, n0)

	// 1. (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if r0 == '\'' && n1 > 0 {
		switch unicode.ToLower(r1) {
		case 's', 't', 'm', 'd':
			return n0 + n1
		case 'r', 'v', 'l':
			want := 'e'
			if unicode.ToLower(r1) == 'l' {
				want = 'l'
			}
			if r2, n2 := decode(s, n0+n1); n2 > 0 && unicode.ToLower(r2) == want {
				return n0 + n1 + n2
			}
		}
	}
	// 2. [^\r\n\p{L}\p{N}]?\p{L}+
	if !isNL(r0) && !isLetter(r0) && !isDigit(r0) && n1 > 0 && isLetter(r1) {
		return spanOf(s, n0+n1, isLetter)
	}
	if isLetter(r0) {
		return spanOf(s, n0, isLetter)
	}
	// 3. \p{N}
	if isDigit(r0) {
		return n0
	}
	// 4. ' ?[^\s\p{L}\p{N}]+[\r\n]*'
	if r0 == ' ' && n1 > 0 && isOther(r1) {
		return spanOf(s, spanOf(s, n0+n1, isOther), isNL)
	}
	if isOther(r0) {
		return spanOf(s, spanOf(s, n0, isOther), isNL)
	}
	// r0 is white space: alternatives 5 to 7 look at the run from here.
	end := spanOf(s, 0, isSpace)
	// 5. \s*[\r\n]+ : up to and including the run's last \r or \n.
	for i := end - 1; i >= 0; i-- {
		if isNL(rune(s[i])) {
			return i + 1
		}
	}
	// 6. \s+(?!\S) : the whole run at the end of the text, else less its last rune.
	if end == len(s) {
		return end
	}
	_, last := utf8.DecodeLastRuneInString(s[:end])
	if end-last > 0 {
		return end - last
	}
	// 7. \s+
	return end
}
