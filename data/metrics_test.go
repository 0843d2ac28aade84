package data

import (
	"math"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// The expected strings below were checked by hand and against the official
// SQuAD v1.1 normalize_answer run under Python 3. One known difference is
// not tested: Python lowercases a word-final "Σ" to "ς", Go to "σ".
func TestNormalize(t *testing.T) {
	tests := []struct{ in, want string }{
		{"The Eiffel Tower", "eiffel tower"},
		{"  a  cat, an apple & THE dog!  ", "cat apple dog"},
		{"there is an answer", "there is answer"}, // "the" inside a word stays
		{"theatre", "theatre"},
		{"The–end", "–end"},           // en dash is not ASCII punctuation, but it is a word boundary
		{"l'a", "la"},                 // punctuation goes first, so "l'a" is one word
		{"A.B.C.", "abc"},             //
		{"don't", "dont"},             //
		{"don’t", "don’t"},            // the curly apostrophe is not in string.punctuation
		{"“the quoted”", "“ quoted”"}, // nor are curly quotes
		{"1,000,000", "1000000"},
		{"the_the", "thethe"}, // "_" is punctuation, dropped before articles
		{"Café Société", "café société"},
		{"naïve—the end", "naïve— end"},
		{"Ünïcödé  ÀN", "ünïcödé àn"}, // only the ASCII words a/an/the are articles
		{"北京 the 大学", "北京 大学"},
		{"an\u00a0apple", "apple"},   // no-break space is white space
		{"x\u2003the\u2003y", "x y"}, // em space
		{"the\x1cend", "end"},        // Python's str.split splits on 0x1c–0x1f
		{"¿Qué?", "¿qué"},
		{"a-b", "ab"},
		{"Ⅻ the", "ⅻ"},                  // Roman numeral (Nl) is a word character
		{"the²", "the²"},                // so is "²" (No): no article here
		{"the\u0301 end", "\u0301 end"}, // a combining mark (Mn) is not
		{"THE", ""},
		{"a", ""},
		{"", ""},
		{" \t\n ", ""},
		{"Yes.", "yes"},
		{"no answer", "no answer"},
		{"\xff\xfeok", "\ufffd\ufffdok"}, // invalid UTF-8 becomes U+FFFD
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			if got := Normalize(tt.in); got != tt.want {
				t.Errorf("Normalize(%q) = %q, want %q (SQuAD's normalize_answer)", tt.in, got, tt.want)
			}
		})
	}
}

func TestExactMatch(t *testing.T) {
	tests := []struct {
		pred   string
		golden []string
		want   float64
	}{
		{"The Eiffel Tower.", []string{"Eiffel Tower"}, 1},
		{"eiffel", []string{"Eiffel Tower"}, 0},
		{"Paris", []string{"London", "paris!"}, 1}, // max over golden answers
		{"Paris", nil, 0},
		{"the", []string{"a"}, 0}, // both normalise to "": no answer is no match (SQuAD's script says 1)
		{"", []string{"---"}, 0},  // a missing answer against NQ's golden "---"
		{"A+", []string{"A+"}, 0}, // normalises to "": cannot be told from a missing answer
		{"Yes", []string{"yes"}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.pred, func(t *testing.T) {
			if got := ExactMatch(tt.pred, tt.golden); got != tt.want {
				t.Errorf("ExactMatch(%q, %q) = %v, want %v", tt.pred, tt.golden, got, tt.want)
			}
		})
	}
}

func TestF1(t *testing.T) {
	tests := []struct {
		pred   string
		golden []string
		want   float64
	}{
		// P = 2/2, R = 2/3: F1 = 2·1·(2/3)/(1+2/3) = 0.8.
		{"the cat sat", []string{"a cat sat down"}, 0.8},
		{"New York City", []string{"new york"}, 0.8},
		// "cat cat dog" vs "cat dog dog": overlap counts min(2,1)+min(1,2) = 2; P = R = 2/3.
		{"cat cat dog", []string{"cat dog dog"}, 2.0 / 3},
		{"Barack Obama", []string{"Obama"}, 2.0 / 3},
		{"Barack Obama", []string{"Michelle", "Barack Obama"}, 1}, // max over golden answers
		{"Yes", []string{"yes."}, 1},
		// The yes/no/noanswer rule: a special answer only matches itself.
		{"yes", []string{"no"}, 0},
		{"yes it is", []string{"yes"}, 0},
		{"no", []string{"no way"}, 0},
		{"no answer", []string{"noanswer"}, 0},
		{"noanswer", []string{"no answer"}, 0},
		{"", []string{"x"}, 0},
		{"the", []string{"a"}, 0}, // empty after normalisation: no tokens, F1 0
		{"x", nil, 0},
		// Invalid UTF-8: tokens "\ufffd" and "ok" vs "ok": P = 1/2, R = 1.
		{"\xff ok", []string{"ok"}, 2.0 / 3},
	}
	for _, tt := range tests {
		t.Run(tt.pred, func(t *testing.T) {
			if got := F1(tt.pred, tt.golden); math.Abs(got-tt.want) > 1e-12 {
				t.Errorf("F1(%q, %q) = %v, want %v", tt.pred, tt.golden, got, tt.want)
			}
		})
	}
}

// TestMetricsHuge checks that a pathological prediction costs linear time.
func TestMetricsHuge(t *testing.T) {
	huge := strings.Repeat("the cat sat on a mat, ", 500_000) // 11 MB
	start := time.Now()
	f1 := F1(huge, []string{"cat", "the mat"})
	em := ExactMatch(huge, []string{"cat"})
	if f1 <= 0 || f1 > 0.001 || em != 0 {
		t.Errorf("F1 = %v, EM = %v; want a tiny positive F1 (low precision) and EM 0", f1, em)
	}
	if d := time.Since(start); d > 10*time.Second && !raceDetector {
		t.Errorf("scoring an 11 MB prediction took %v; want linear time", d)
	}
}

func FuzzMetrics(f *testing.F) {
	for _, s := range []string{"", "the", "Yes", "no answer", "naïve—the end", "\xff\xfe", "a\x1cb", "Ⅻ the"} {
		f.Add(s, "the cat")
	}
	f.Fuzz(func(t *testing.T, pred, gold string) {
		n := Normalize(pred)
		if !utf8.ValidString(n) {
			t.Fatalf("Normalize(%q) = %q is not valid UTF-8", pred, n)
		}
		if n != strings.TrimSpace(n) || strings.Contains(n, "  ") {
			t.Fatalf("Normalize(%q) = %q: want single spaces, trimmed", pred, n)
		}
		if again := Normalize(n); again != n {
			t.Fatalf("Normalize not idempotent on %q: %q then %q", pred, n, again)
		}
		f1, em := F1(pred, []string{gold}), ExactMatch(pred, []string{gold})
		if f1 < 0 || f1 > 1 || math.IsNaN(f1) || (em != 0 && em != 1) {
			t.Fatalf("F1 = %v, EM = %v for %q vs %q: want F1 in [0,1], EM 0 or 1", f1, em, pred, gold)
		}
		if em == 1 && n != "" && f1 != 1 {
			t.Fatalf("EM 1 but F1 %v for %q vs %q: equal non-empty answers have F1 1", f1, pred, gold)
		}
		if self := F1(pred, []string{pred}); n != "" && self != 1 {
			t.Fatalf("F1(%q, itself) = %v, want 1", pred, self)
		}
	})
}

func TestMentions(t *testing.T) {
	cases := []struct {
		text, answer string
		want         bool
	}{
		{"The answer is Paris.", "paris", true},
		{"The answer is Paris, France.", "Paris France", true}, // punctuation normalised away
		{"The answer is The Beatles.", "Beatles", true},        // articles dropped
		{"The answer is Parisian.", "Paris", false},            // whole words only
		{"The answer is Paris.", "answer Paris", false},        // a contiguous run
		{"The answer is Paris.", "", false},
		{"The answer is Paris.", "the", false}, // normalises to nothing
		{"", "Paris", false},
	}
	for _, c := range cases {
		if got := Mentions(c.text, c.answer); got != c.want {
			t.Errorf("Mentions(%q, %q) = %v, want %v", c.text, c.answer, got, c.want)
		}
	}
}

func TestShortAnswer(t *testing.T) {
	cases := []struct {
		reply, want string
		ok          bool
	}{
		{"The answer is Lagos State.", "Lagos State", true},
		{"Lagos, I think. The answer is Lagos.", "Lagos", true}, // the last "answer is"
		{"the ANSWER IS one two three four five six seven eight nine.", "one two three four five six seven eight", true},
		{"The answer is .", "", false},
		{"  Lagos State.  ", "Lagos State", true},                    // a short reply is its own answer
		{"It is the largest city of Nigeria by far.", "", false},     // a longer one states none
		{"one two three four five", "one two three four five", true}, // five words
		{"one two three four five six", "", false},
		{"", "", false},
	}
	for _, c := range cases {
		if got, ok := ShortAnswer(c.reply); got != c.want || ok != c.ok {
			t.Errorf("ShortAnswer(%q) = %q, %v, want %q, %v", c.reply, got, ok, c.want, c.ok)
		}
	}
}

func TestAgree(t *testing.T) {
	cases := []struct {
		x, y string
		want bool
	}{
		{"Lagos", "Most sources name Lagos, the largest city.", true}, // the short one's answer in the long one
		{"Most sources name Lagos, the largest city.", "Lagos", true}, // either way round
		{"The answer is Lagos.", "The answer is Lagos State.", true},  // whole words of the longer answer
		{"The answer is Abuja.", "The answer is Lagos State.", false},
		{"Most sources name Lagos.", "Some name Lagos, some Abuja, in prose.", false}, // two long replies state no answer
		{"I don't know.", "", false},
		{"", "", false},
	}
	for _, c := range cases {
		if got := Agree(c.x, c.y); got != c.want {
			t.Errorf("Agree(%q, %q) = %v, want %v", c.x, c.y, got, c.want)
		}
	}
}
