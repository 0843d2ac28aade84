package tokenizer

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// splitterRunes are representatives of every class qwen2Pattern tells apart,
// and of the runes where regex engines disagree: letters (with case-folding
// traps ſ, İ and the Kelvin sign), the letters of the contractions, digits of
// several kinds, every kind of white space (U+0085 and U+2028 included),
// U+FEFF, combining marks, ZWJ, emoji and punctuation.
var splitterRunes = []rune{
	'a', 'Z', 'é', 'ſ', 'İ', '\u212A', 'ß', '中', 'ー', 'ǅ',
	's', 'S', 't', 'T', 'r', 'R', 'e', 'E', 'v', 'V', 'm', 'M', 'l', 'L', 'd', 'D',
	'0', '7', '٣', '½', 'Ⅻ', '²',
	' ', '\t', '\n', '\r', '\v', '\f', '\u00a0', '\u3000', '\u2003', '\u2028', '\u2029', '\u0085', '\u1680',
	'\ufeff', '\u180e', '\u200b',
	'\'', '!', '.', '<', '|', '_', '"', '\u0301', '\u200d', '😀', '\x00', '\uFFFD',
}

// checkSplit fails when qwen2Splitter and regexp2 running qwen2Pattern cut s
// differently.
func checkSplit(t *testing.T, re splitter, s string) {
	t.Helper()
	var want, got []string
	re.split(s, func(p string) { want = append(want, p) })
	qwen2Splitter{}.split(s, func(p string) { got = append(got, p) })
	if !slices.Equal(got, want) {
		t.Fatalf("split(%q):\n scanner %q\n regexp2 %q", s, got, want)
	}
}

// TestQwen2SplitterMatchesRegex proves the hand-written scanner equal to the
// regex on every string of up to three representative runes, and on random
// longer strings of representative and arbitrary runes.
func TestQwen2SplitterMatchesRegex(t *testing.T) {
	re := newRegexSplitter(qwen2Pattern)
	n := len(splitterRunes)
	for i := range n {
		checkSplit(t, re, string(splitterRunes[i]))
		for j := range n {
			checkSplit(t, re, string([]rune{splitterRunes[i], splitterRunes[j]}))
			for k := range n {
				checkSplit(t, re, string([]rune{splitterRunes[i], splitterRunes[j], splitterRunes[k]}))
			}
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		var b strings.Builder
		for range rng.IntN(40) {
			if rng.IntN(8) == 0 {
				r := rune(rng.IntN(0x30000))
				if utf8.ValidRune(r) {
					b.WriteRune(r)
				}
				continue
			}
			b.WriteRune(splitterRunes[rng.IntN(n)])
		}
		checkSplit(t, re, b.String())
	}
}

func FuzzQwen2Splitter(f *testing.F) {
	for _, s := range []string{"Hello world", "DON'T We'Ll", "a  \n\n  b\t\t c   ", "x\r\n\r\n y", "'ſ 'İ", "123 ½", "😀👍🏽 e\u0301"} {
		f.Add(s)
	}
	re := newRegexSplitter(qwen2Pattern)
	f.Fuzz(func(t *testing.T, s string) {
		checkSplit(t, re, toValidUTF8(s))
	})
}

// naiveMerge is textbook BPE: merge the lowest-ranked adjacent pair, leftmost
// on ties, until none is left. merge must agree with it.
func naiveMerge(m *bpeModel, word string) []int {
	var ids []int32
	for i := 0; i < len(word); i++ {
		ids = append(ids, m.byteID[word[i]])
	}
	for {
		best, at := mergeResult{rank: -1}, -1
		for i := 0; i+1 < len(ids); i++ {
			if r, ok := m.merges[pairKey(ids[i], ids[i+1])]; ok && (at < 0 || r.rank < best.rank) {
				best, at = r, i
			}
		}
		if at < 0 {
			break
		}
		ids = slices.Replace(ids, at, at+2, best.id)
	}
	out := make([]int, len(ids))
	for i, id := range ids {
		out[i] = int(id)
	}
	return out
}

func TestMergeMatchesNaive(t *testing.T) {
	tk := qwen(t)
	rng := rand.New(rand.NewPCG(3, 4))
	pool := []string{"a", "b", "aa", " ", "  ", "\n", "e", "r", "er", "the", "ing", "中", "文", "😀", "1", "\xe2", "\x80", "'", "ll"}
	words := []string{strings.Repeat(" ", 257), strings.Repeat("a", 100), strings.Repeat("ab", 50), "internationalization", " supercalifragilistic"}
	for range 5000 {
		var b strings.Builder
		for range 1 + rng.IntN(12) {
			b.WriteString(pool[rng.IntN(len(pool))])
		}
		words = append(words, b.String())
	}
	for _, w := range words {
		if got, want := tk.model.merge(nil, w), naiveMerge(&tk.model, w); !slices.Equal(got, want) {
			t.Fatalf("merge(%q) = %v, want %v (textbook BPE)", w, got, want)
		}
	}
}

// TestWhitespaceLikeOniguruma pins where this package follows Hugging Face's
// Rust library (Oniguruma) rather than the JS reference of testdata/ref:
// Oniguruma's \s is U+0009..U+000D, U+0085 and the Zs, Zl, Zp categories, as
// Go's unicode.IsSpace; ECMAScript's \s, which the JS port uses, adds U+FEFF
// and leaves out U+0085. The golden fuzz strings avoid both runes.
func TestWhitespaceLikeOniguruma(t *testing.T) {
	for _, tc := range []struct {
		text string
		want []string
	}{
		// JS: "a", " ", " \u0085", "b" (U+0085 is not \s there).
		{"a  \u0085b", []string{"a", "  ", "\u0085b"}},
		// JS: "a", "  ", "\ufeffb" (U+FEFF is \s there).
		{"a  \ufeffb", []string{"a", " ", " \ufeff", "b"}},
	} {
		var got []string
		qwen2Splitter{}.split(tc.text, func(p string) { got = append(got, p) })
		if !slices.Equal(got, tc.want) {
			t.Errorf("split(%q) = %q, want %q (Oniguruma's \\s)", tc.text, got, tc.want)
		}
	}
}

func BenchmarkSplit(b *testing.B) {
	text := strings.Repeat(benchText, 4)
	for _, bc := range []struct {
		name string
		sp   splitter
	}{{"scanner", qwen2Splitter{}}, {"regexp2", newRegexSplitter(qwen2Pattern)}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				bc.sp.split(text, func(string) {})
			}
		})
	}
}
