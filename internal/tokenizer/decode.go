package tokenizer

// DecodeBytes returns the raw bytes of ids, concatenated. The result may end
// inside a UTF-8 sequence (a token can hold part of one), which makes it the
// right input for stop-string checks while streaming. Ids that are not tokens
// are skipped, as Hugging Face skips them.
func (t *Tokenizer) DecodeBytes(ids []int) []byte {
	n := 0
	for _, id := range ids {
		if id >= 0 && id < len(t.tokens) {
			n += len(t.tokens[id])
		}
	}
	out := make([]byte, 0, n)
	for _, id := range ids {
		if id >= 0 && id < len(t.tokens) {
			out = append(out, t.tokens[id]...)
		}
	}
	return out
}

// Decode returns the text of ids, as Hugging Face's tokenizer.decode(ids)
// does with its defaults: special tokens are kept as their text, and invalid
// UTF-8 (e.g. a sequence cut at the end) becomes U+FFFD, one per maximal
// invalid subsequence. Decode(Encode(s)) is the NFC form of s
// for valid UTF-8 s.
func (t *Tokenizer) Decode(ids []int) string {
	b := t.DecodeBytes(ids)
	return string(appendValidUTF8(make([]byte, 0, len(b)), b))
}
