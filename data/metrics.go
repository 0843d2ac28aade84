package data

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// Normalize applies the answer normalisation of the official SQuAD v1.1
// evaluation script (normalize_answer), in its order:
//
//  1. lowercase;
//  2. drop ASCII punctuation (Python's string.punctuation; other symbols
//     such as "–" or "’" stay);
//  3. replace the words a, an and the by a space, where a word is a maximal
//     run of Unicode letters, digits and "_" (Python's \b(a|an|the)\b), so
//     "the" goes from "the–end" but not from "there";
//  4. collapse whitespace (Python's str.split) to single spaces and trim.
//
// Invalid UTF-8 bytes become U+FFFD. Lowercasing uses Go's per-rune mapping,
// which differs from Python's str.lower only for a few special cases
// (U+0130 "İ", final sigma). Time and memory are linear in len(s).
func Normalize(s string) string {
	// Steps 1 and 2.
	var lowered strings.Builder
	lowered.Grow(len(s))
	for _, r := range s {
		if r < utf8.RuneSelf && isASCIIPunct(byte(r)) {
			continue
		}
		lowered.WriteRune(unicode.ToLower(r))
	}
	t := lowered.String()

	// Step 3: one pass over maximal word runs.
	var noArticles strings.Builder
	noArticles.Grow(len(t))
	for i := 0; i < len(t); {
		r, size := utf8.DecodeRuneInString(t[i:])
		if !isWordRune(r) {
			noArticles.WriteString(t[i : i+size])
			i += size
			continue
		}
		j := i + size
		for j < len(t) {
			r, size := utf8.DecodeRuneInString(t[j:])
			if !isWordRune(r) {
				break
			}
			j += size
		}
		switch word := t[i:j]; word {
		case "a", "an", "the":
			noArticles.WriteByte(' ')
		default:
			noArticles.WriteString(word)
		}
		i = j
	}

	// Step 4.
	return strings.Join(strings.FieldsFunc(noArticles.String(), isPySpace), " ")
}

// isASCIIPunct reports whether c is in Python's string.punctuation:
// !"#$%&'()*+,-./:;<=>?@[\]^_`{|}~
func isASCIIPunct(c byte) bool {
	return c >= '!' && c <= '/' || c >= ':' && c <= '@' || c >= '[' && c <= '`' || c >= '{' && c <= '~'
}

// isWordRune matches Python 3's \w on str: alphanumerics and "_".
func isWordRune(r rune) bool {
	return r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r)
}

// isPySpace matches Python's str.isspace, which adds the ASCII separators
// 0x1c–0x1f to Unicode white space.
func isPySpace(r rune) bool {
	return unicode.IsSpace(r) || r >= 0x1c && r <= 0x1f
}

// ExactMatch returns 1 when pred equals one of the golden answers after
// Normalize, else 0 (also for no golden answers). A prediction that
// normalises to nothing (a missing answer, "the", "---") never matches:
// SQuAD's script counts it equal to a golden answer that also normalises to
// nothing ("---", "A+" in NQ), which scored responses without any answer as
// exact matches. F1 already gives them 0.
func ExactMatch(pred string, golden []string) float64 {
	p := Normalize(pred)
	if p == "" {
		return 0
	}
	for _, g := range golden {
		if Normalize(g) == p {
			return 1
		}
	}
	return 0
}

// F1 returns the best token F1 between pred and any golden answer, as in the
// SQuAD/HotpotQA evaluation scripts: tokens are the words of Normalize,
// overlap counts each token at most as often as it occurs on both sides,
// and F1 = 2PR/(P+R). If either side normalises to "yes", "no" or
// "noanswer" and the two differ, the F1 is 0 (the HotpotQA rule, used by
// FlashRAG, Search-R1 and Router-R1). No golden answers give 0.
func F1(pred string, golden []string) float64 {
	p := Normalize(pred)
	predTokens := strings.Fields(p)
	best := 0.0
	for _, g := range golden {
		if f := tokenF1(p, predTokens, Normalize(g)); f > best {
			best = f
		}
	}
	return best
}

// tokenF1 scores one normalised prediction against one normalised answer.
func tokenF1(pred string, predTokens []string, gold string) float64 {
	if pred != gold && (isSpecialAnswer(pred) || isSpecialAnswer(gold)) {
		return 0
	}
	goldTokens := strings.Fields(gold)
	if len(predTokens) == 0 || len(goldTokens) == 0 {
		return 0
	}
	counts := make(map[string]int, len(goldTokens))
	for _, t := range goldTokens {
		counts[t]++
	}
	same := 0
	for _, t := range predTokens {
		if counts[t] > 0 {
			counts[t]--
			same++
		}
	}
	if same == 0 {
		return 0
	}
	precision := float64(same) / float64(len(predTokens))
	recall := float64(same) / float64(len(goldTokens))
	return 2 * precision * recall / (precision + recall)
}

func isSpecialAnswer(s string) bool {
	return s == "yes" || s == "no" || s == "noanswer"
}

// Mentions reports whether text states answer: whether answer's normalised
// words (Normalize) occur in text's normalised words as a contiguous run of
// whole words. An answer that normalises to nothing is mentioned nowhere.
func Mentions(text, answer string) bool {
	a := Normalize(answer)
	return a != "" && strings.Contains(" "+Normalize(text)+" ", " "+a+" ")
}

// StatedAnswer is reply's text after its last "answer is" (any case),
// trimmed, trailing periods removed, cut to 8 words, if it has one: the
// answer a reply in the protocol's form ("The answer is A.") states.
func StatedAnswer(reply string) (string, bool) {
	text := strings.TrimSpace(reply)
	k := strings.LastIndex(strings.ToLower(text), "answer is")
	if k < 0 {
		return "", false
	}
	text = strings.TrimRight(strings.TrimSpace(text[k+len("answer is"):]), ".")
	if w := strings.Fields(text); len(w) > 8 {
		text = strings.Join(w[:8], " ")
	}
	return text, true
}

// ShortAnswer is the answer a reply states, for agreement: its
// StatedAnswer, else the whole reply (trimmed, trailing periods removed)
// when it is of at most five words (a short reply, such as a reader's
// extracted span, is its own answer); none for an empty stated answer or a
// longer reply without "answer is".
func ShortAnswer(reply string) (string, bool) {
	if a, ok := StatedAnswer(reply); ok {
		return a, a != ""
	}
	text := strings.TrimRight(strings.TrimSpace(reply), ".")
	if w := strings.Fields(text); len(w) == 0 || len(w) > 5 {
		return "", false
	}
	return text, true
}

// Agree reports whether two replies agree: one's ShortAnswer is mentioned
// (Mentions) by the other, either way round. Read it on what the models
// wrote (a replayed reply's evidence, not its rendering): router.agreement's
// note, the "agree" warm-up and the cascade baseline all decide by it.
func Agree(x, y string) bool {
	if a, ok := ShortAnswer(x); ok && Mentions(y, a) {
		return true
	}
	b, ok := ShortAnswer(y)
	return ok && Mentions(x, b)
}
