// Package tokenizer loads a Hugging Face tokenizer.json that describes a
// byte-level BPE tokenizer, the kind Qwen2 and Qwen2.5 ship, and encodes and
// decodes text exactly as the Hugging Face `tokenizers` library does.
//
// The pipeline of [Tokenizer.Encode], in Hugging Face's order:
//
//  1. invalid UTF-8 is repaired: each maximal invalid subsequence becomes
//     U+FFFD, as Python's bytes.decode(errors="replace") does (Hugging Face
//     itself only ever sees valid strings);
//  2. added tokens (special or not, e.g. <|im_start|>, <tool_call>) are split
//     out of the raw text first, leftmost-longest, and map to their ids;
//  3. every other section is normalized (NFC for Qwen) on its own;
//  4. the pre-tokenizer splits it into pieces with the Split regex (Qwen2's
//     pattern runs on a hand-written scanner, proven equal to the regex by
//     tests; any other pattern runs on github.com/dlclark/regexp2);
//  5. each piece is mapped to bytes and merged by BPE, lowest merge rank first.
//
// Encode never adds BOS/EOS tokens (Qwen's post-processor adds none).
// [Tokenizer.EncodePlain] skips step 2, for untrusted text in which
// "<|im_end|>" must stay text; [Tokenizer.EncodeSegments] skips it only in
// the segments marked Plain.
//
// Supported tokenizer.json components: model BPE (no dropout, no
// byte_fallback, no subword prefix/suffix; ignore_merges honoured);
// normalizer null, NFC, NFD, NFKC, NFKD or a Sequence of them; pre_tokenizer
// ByteLevel (add_prefix_space false), optionally preceded by Split steps
// (behavior Isolated, not inverted) in a Sequence; decoder ByteLevel. Anything
// else is rejected by [Load] with an error wrapping [ErrUnsupported].
//
// Encodings equal those of the JS port of Hugging Face tokenizers on the
// fixture in testdata (see testdata/README.md). Where that port and the Rust
// library differ, this package follows the Rust library's Oniguruma regex
// semantics: \s includes U+0085 and excludes U+FEFF. Unicode tables are Go's
// (Unicode 15.0), so characters assigned later count as neither letters nor
// digits.
//
// A Tokenizer is immutable after Load and safe for concurrent use.
package tokenizer

import (
	"errors"
)

// Errors returned (wrapped) by Load.
var (
	// ErrUnsupported marks a tokenizer.json component or option this package
	// does not implement; encoding with it would silently differ from
	// Hugging Face.
	ErrUnsupported = errors.New("unsupported")
)

// Tokenizer is a loaded byte-level BPE tokenizer.
type Tokenizer struct {
	path string // tokenizer.json, for messages

	tokens    [][]byte // id → raw bytes of the token; nil where no token has that id
	special   []bool   // id → the token is an added token marked special
	vocabID   map[string]int
	addedID   map[string]int // raw bytes of an added token → id; wins over vocabID
	vocabSize int            // highest id + 1

	model     bpeModel
	normalize func(string) string // nil: no normalizer
	splits    []splitter          // applied in order; each piece of one feeds the next
	added     addedMatcher

	eos, pad, bos int    // -1 when none
	defaultSystem string // system message FormatChat inserts; "" for none
}

// VocabSize is the highest token id plus one, over the model vocabulary and
// the added tokens (151,665 for Qwen2.5). The model's embedding may have more
// rows (Qwen2.5: 151,936); ids in between decode to nothing.
func (t *Tokenizer) VocabSize() int { return t.vocabSize }

// TokenBytes returns the raw bytes of one token (a copy), e.g. " world" for
// 1879 and "<|im_end|>" for 151645. A token may hold part of a UTF-8
// sequence. It returns nil for an id that is not a token.
func (t *Tokenizer) TokenBytes(id int) []byte {
	if id < 0 || id >= len(t.tokens) || t.tokens[id] == nil {
		return nil
	}
	return append([]byte(nil), t.tokens[id]...)
}

// TokenID returns the id of the token whose raw bytes are exactly s, as
// TokenBytes returns them: TokenID(" world") is 1879 and
// TokenID("<|im_end|>") is 151645. Added tokens win over the vocabulary.
// Note: s is plain text, not the byte-level form of vocab.json ("Ġworld").
func (t *Tokenizer) TokenID(s string) (int, bool) {
	if id, ok := t.addedID[s]; ok {
		return id, true
	}
	id, ok := t.vocabID[s]
	return id, ok
}

// IsSpecial reports whether id is an added token marked special (for Qwen2.5
// ids 151643..151656, e.g. <|im_start|>; <tool_call> is added but not
// special).
func (t *Tokenizer) IsSpecial(id int) bool {
	return id >= 0 && id < len(t.special) && t.special[id]
}

// EOS is the id of tokenizer_config.json's eos_token (<|im_end|>, 151645, for
// Qwen2.5 Instruct). Without a config file, or when eos_token is null, it
// falls back to <|im_end|>, then <|endoftext|>, then -1.
func (t *Tokenizer) EOS() int { return t.eos }

// PadID is the id of tokenizer_config.json's pad_token (<|endoftext|>, 151643,
// for Qwen2.5). Without a config file, or when pad_token is null, it falls
// back to <|endoftext|>, then EOS.
func (t *Tokenizer) PadID() int { return t.pad }

// BOS is the id of tokenizer_config.json's bos_token, or -1 (Qwen2.5 has none
// and adds none).
func (t *Tokenizer) BOS() int { return t.bos }

// StopIDs are the ids that end a generation: EOS and, when it is a different
// token, <|endoftext|> (Qwen2.5's generation_config.json lists both, 151645
// and 151643).
func (t *Tokenizer) StopIDs() []int {
	var ids []int
	if t.eos >= 0 {
		ids = append(ids, t.eos)
	}
	if id, ok := t.addedID["<|endoftext|>"]; ok && id != t.eos {
		ids = append(ids, id)
	}
	return ids
}
