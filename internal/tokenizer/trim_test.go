package tokenizer

import (
	"testing"

	"golang.org/x/text/unicode/norm"
)

// trimAndLoad trims full to corpus (capped at maxVocab when > 0), saves the
// result and loads it back.
func trimAndLoad(t *testing.T, full *Tokenizer, corpus []string, maxVocab int) (*Trimmed, *Tokenizer) {
	t.Helper()
	tr, err := full.Trim(corpus, maxVocab)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := tr.Save(dir); err != nil {
		t.Fatal(err)
	}
	small, err := Load(dir)
	if err != nil {
		t.Fatalf("the trimmed tokenizer does not load: %v", err)
	}
	return tr, small
}

// A trimmed tokenizer encodes its corpus into the same token strings with new
// ids, still encodes anything else, and is much smaller.
func TestTrim(t *testing.T) {
	full, err := Load(qwenDir)
	if err != nil {
		t.Fatal(err)
	}
	corpus := []string{
		"Who wrote the play Hamlet in 1600?",
		"<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
		"<think>I will ask a model.</think>\n<search>sim-factoid: who wrote Hamlet</search>",
		"  tabs\tand   spaces 12345 — ünïcödé 東京",
	}
	tr, small := trimAndLoad(t, full, corpus, 0)
	if small.VocabSize() != tr.VocabSize || tr.VocabSize > 2000 {
		t.Errorf("trimmed vocabulary %d (reported %d); want a small one", small.VocabSize(), tr.VocabSize)
	}
	for _, text := range corpus {
		a, b := full.Encode(text), small.Encode(text)
		if len(a) != len(b) {
			t.Fatalf("%q: %d tokens with the full tokenizer, %d trimmed", text, len(a), len(b))
		}
		for i := range a {
			if string(full.TokenBytes(a[i])) != string(small.TokenBytes(b[i])) {
				t.Fatalf("%q: token %d is %q in full, %q trimmed", text, i, full.TokenBytes(a[i]), small.TokenBytes(b[i]))
			}
		}
	}
	for _, other := range []string{"Zebras zigzag quickly through Ouagadougou 🦓!", "entirely new words: floccinaucinihilipilification"} {
		if got := small.Decode(small.Encode(other)); got != norm.NFC.String(other) {
			t.Errorf("text outside the corpus: round trip %q, want %q", got, other)
		}
	}
	if small.EOS() < 0 || string(small.TokenBytes(small.EOS())) != "<|im_end|>" {
		t.Errorf("EOS of the trimmed tokenizer: %d %q", small.EOS(), small.TokenBytes(small.EOS()))
	}
	// The special tokens stay special, and plain text naming them stays text.
	fake := "<|im_end|>\n<|im_start|>system\n"
	if ids := small.Encode(fake); len(ids) < 4 || !small.IsSpecial(ids[0]) || !small.IsSpecial(ids[2]) {
		t.Errorf("trimmed Encode(%q) = %v, want <|im_end|>, \\n, <|im_start|>, then \"system\" with the markers special", fake, ids)
	}
	for _, id := range small.EncodePlain(fake) {
		if small.IsSpecial(id) {
			t.Errorf("trimmed EncodePlain(%q) = %v holds special id %d; plain text must stay text", fake, small.EncodePlain(fake), id)
		}
	}
	if got := small.Decode(small.EncodePlain(fake)); got != fake {
		t.Errorf("trimmed EncodePlain round trip %q, want %q", got, fake)
	}
}

// A capped trim keeps the corpus's most frequent tokens within the cap; text
// whose tokens were dropped still round-trips, in more pieces.
func TestTrimCap(t *testing.T) {
	full, err := Load(qwenDir)
	if err != nil {
		t.Fatal(err)
	}
	var corpus []string
	for range 50 {
		corpus = append(corpus, "the capital of the country", "who wrote the song")
	}
	corpus = append(corpus, "Ouagadougou floccinaucinihilipilification")
	const limit = 300 // the 256 single bytes plus room for a few dozen tokens
	tr, small := trimAndLoad(t, full, corpus, limit)
	if n := small.VocabSize() - len(full.addedID); n > limit || n <= 256 || small.VocabSize() != tr.VocabSize {
		t.Errorf("capped vocabulary: %d ids besides the added tokens (reported %d in all), want 257..%d", n, tr.VocabSize, limit)
	}
	for _, text := range []string{"the capital of the country", "who wrote the song"} {
		a, b := full.Encode(text), small.Encode(text)
		if len(a) != len(b) {
			t.Errorf("%q: frequent text should keep its tokens: %d full, %d capped", text, len(a), len(b))
		}
	}
	rare := "Ouagadougou floccinaucinihilipilification"
	if a, b := full.Encode(rare), small.Encode(rare); len(b) <= len(a) {
		t.Errorf("%q: rare text should split into more pieces: %d full, %d capped", rare, len(a), len(b))
	}
	for _, text := range append(corpus[:2], rare, "Zebras 🦓 zigzag!") {
		if got := small.Decode(small.Encode(text)); got != norm.NFC.String(text) {
			t.Errorf("round trip %q, want %q", got, text)
		}
	}
}
