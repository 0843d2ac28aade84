package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"golang.org/x/text/unicode/norm"

	"github.com/recal-project/recal/internal/inputfile"
)

// Names of the files Load reads in a tokenizer folder.
const (
	TokenizerFile = "tokenizer.json"
	ConfigFile    = "tokenizer_config.json"
)

// Load reads a tokenizer. path is a tokenizer.json file or a folder holding
// one; tokenizer_config.json next to it is read when present (special token
// names and the chat template's default system message).
func Load(path string) (*Tokenizer, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	file := path
	if fi.IsDir() {
		file = filepath.Join(path, TokenizerFile)
	}
	data, err := inputfile.ReadFile(file, inputfile.TextLimit)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	t, err := parse(file, data)
	if err != nil {
		return nil, err
	}

	cfgFile := filepath.Join(filepath.Dir(file), ConfigFile)
	cfgData, err := inputfile.ReadFile(cfgFile, inputfile.ConfigLimit)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		cfgFile, cfgData = "", nil
	case err != nil:
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if err := t.applyConfig(cfgFile, cfgData); err != nil {
		return nil, err
	}
	return t, nil
}

// fileJSON is the part of tokenizer.json that matters for encoding.
type fileJSON struct {
	AddedTokens  []addedTokenJSON `json:"added_tokens"`
	Normalizer   json.RawMessage  `json:"normalizer"`
	PreTokenizer json.RawMessage  `json:"pre_tokenizer"`
	Decoder      json.RawMessage  `json:"decoder"`
	Model        json.RawMessage  `json:"model"`
}

type addedTokenJSON struct {
	ID         *int   `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

type modelJSON struct {
	Type                    string          `json:"type"`
	Vocab                   map[string]int  `json:"vocab"`
	Merges                  json.RawMessage `json:"merges"`
	Dropout                 *float64        `json:"dropout"`
	ContinuingSubwordPrefix string          `json:"continuing_subword_prefix"`
	EndOfWordSuffix         string          `json:"end_of_word_suffix"`
	ByteFallback            bool            `json:"byte_fallback"`
	IgnoreMerges            bool            `json:"ignore_merges"`
}

// component is any normalizer, pre-tokenizer or decoder object; only the
// fields this package reads.
type component struct {
	Type           string            `json:"type"`
	Normalizers    []json.RawMessage `json:"normalizers"`
	PreTokenizers  []json.RawMessage `json:"pretokenizers"`
	AddPrefixSpace *bool             `json:"add_prefix_space"`
	UseRegex       *bool             `json:"use_regex"`
	Pattern        *struct {
		Regex  *string `json:"Regex"`
		String *string `json:"String"`
	} `json:"pattern"`
	Behavior string `json:"behavior"`
	Invert   bool   `json:"invert"`
}

// isNull reports whether a raw JSON value is absent or null.
func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// maxVocabID bounds token ids: the id table is allocated up to the highest
// id, so a hostile id must not size it. The largest vocabularies in use
// hold about 262k tokens.
const maxVocabID = 1 << 22

// parse builds a Tokenizer from the bytes of tokenizer.json; file names it in
// errors.
func parse(file string, data []byte) (*Tokenizer, error) {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("tokenizer: %s: "+format, append([]any{file}, args...)...)
	}
	var f fileJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fail("%w", err)
	}
	if isNull(f.Model) {
		return nil, fail("model: missing")
	}
	var m modelJSON
	if err := json.Unmarshal(f.Model, &m); err != nil {
		return nil, fail("model: %w", err)
	}
	switch {
	case m.Type == "BPE":
	case m.Type == "" && !isNull(m.Merges): // old files omit the type of a BPE model
	case m.Type == "":
		return nil, fail("model.type: missing")
	default:
		return nil, fail("model.type %q: %w (only BPE)", m.Type, ErrUnsupported)
	}
	if m.Dropout != nil && *m.Dropout != 0 {
		return nil, fail("model.dropout %v: %w (only 0 or null)", *m.Dropout, ErrUnsupported)
	}
	if m.ByteFallback {
		return nil, fail("model.byte_fallback true: %w", ErrUnsupported)
	}
	if m.ContinuingSubwordPrefix != "" || m.EndOfWordSuffix != "" {
		return nil, fail("model.continuing_subword_prefix/end_of_word_suffix: %w (only empty)", ErrUnsupported)
	}
	if len(m.Vocab) == 0 {
		return nil, fail("model.vocab: missing or empty")
	}
	if isNull(m.Merges) {
		return nil, fail("model.merges: missing")
	}
	merges, err := parseMerges(m.Merges)
	if err != nil {
		return nil, fail("model.merges: %w", err)
	}

	t := &Tokenizer{path: file, eos: -1, pad: -1, bos: -1}

	// Vocabulary: byte-level keys → raw bytes.
	maxID := -1
	for key, id := range m.Vocab {
		if id < 0 || id >= maxVocabID {
			return nil, fail("model.vocab[%q]: id %d is outside [0, %d)", key, id, maxVocabID)
		}
		maxID = max(maxID, id)
	}
	for _, a := range f.AddedTokens {
		if a.ID == nil || *a.ID < 0 || *a.ID >= maxVocabID {
			return nil, fail("added_tokens: %q: id missing or outside [0, %d)", a.Content, maxVocabID)
		}
		maxID = max(maxID, *a.ID)
	}
	t.vocabSize = maxID + 1
	t.tokens = make([][]byte, t.vocabSize)
	t.special = make([]bool, t.vocabSize)
	t.vocabID = make(map[string]int, len(m.Vocab))
	for key, id := range m.Vocab {
		raw, ok := byteLevelDecode(key)
		if !ok {
			return nil, fail("model.vocab[%q]: not a byte-level token (rune outside the ByteLevel alphabet)", key)
		}
		if t.tokens[id] != nil {
			return nil, fail("model.vocab[%q]: id %d is used twice", key, id)
		}
		t.tokens[id] = raw
		t.vocabID[string(raw)] = id
	}
	t.model.vocabID = t.vocabID
	t.model.ignoreMerges = m.IgnoreMerges
	for b := range 256 {
		id, ok := m.Vocab[string(byteToRune[b])]
		if !ok {
			return nil, fail("model.vocab: no token for byte 0x%02x (%q); a byte-level vocabulary needs all 256", b, string(byteToRune[b]))
		}
		t.model.byteID[b] = int32(id)
	}
	t.model.merges = make(map[uint64]mergeResult, len(merges))
	for rank, pair := range merges {
		a, okA := m.Vocab[pair[0]]
		b, okB := m.Vocab[pair[1]]
		c, okC := m.Vocab[pair[0]+pair[1]]
		if !okA || !okB || !okC {
			return nil, fail("model.merges[%d] %q: token not in model.vocab", rank, pair[0]+" "+pair[1])
		}
		// As in Hugging Face, a repeated pair keeps its last rank.
		t.model.merges[pairKey(int32(a), int32(b))] = mergeResult{rank: int32(rank), id: int32(c)}
	}
	t.model.cache = newWordCache()

	// Added tokens.
	t.addedID = make(map[string]int, len(f.AddedTokens))
	for i, a := range f.AddedTokens {
		if a.Content == "" {
			return nil, fail("added_tokens[%d]: empty content", i)
		}
		if a.LStrip || a.RStrip || a.SingleWord {
			return nil, fail("added_tokens[%d] %q: lstrip/rstrip/single_word: %w", i, a.Content, ErrUnsupported)
		}
		raw, ok := byteLevelDecode(a.Content)
		if !ok { // as Hugging Face's ByteLevel decoder: fall back to the text itself
			raw = []byte(a.Content)
		}
		// An id may name one text only: were it a vocabulary token too, BPE
		// could produce the added token from plain text, and decoding would
		// turn that text into the added token's.
		if prev := t.tokens[*a.ID]; prev != nil && string(prev) != string(raw) {
			return nil, fail("added_tokens[%d] %q: id %d is already the token %q", i, a.Content, *a.ID, prev)
		}
		t.tokens[*a.ID] = raw
		t.special[*a.ID] = a.Special
		t.addedID[string(raw)] = *a.ID
		t.added.add(a.Content, *a.ID)
	}
	t.added.finish()

	if t.normalize, err = parseNormalizer(f.Normalizer); err != nil {
		return nil, fail("normalizer: %w", err)
	}
	if t.splits, err = parsePreTokenizer(f.PreTokenizer); err != nil {
		return nil, fail("pre_tokenizer: %w", err)
	}
	if err := checkDecoder(f.Decoder); err != nil {
		return nil, fail("decoder: %w", err)
	}
	return t, nil
}

// parseMerges accepts both forms Hugging Face writes: ["a b", ...] and
// [["a", "b"], ...].
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	var lines []string
	if err := json.Unmarshal(raw, &lines); err == nil {
		out := make([][2]string, len(lines))
		for i, l := range lines {
			a, b, ok := strings.Cut(l, " ")
			if !ok || a == "" || b == "" || strings.Contains(b, " ") {
				return nil, fmt.Errorf("[%d] %q: want two tokens separated by one space", i, l)
			}
			out[i] = [2]string{a, b}
		}
		return out, nil
	}
	var pairs [][]string
	if err := json.Unmarshal(raw, &pairs); err != nil {
		return nil, errors.New(`want a list of "a b" strings or of ["a", "b"] pairs`)
	}
	out := make([][2]string, len(pairs))
	for i, p := range pairs {
		if len(p) != 2 {
			return nil, fmt.Errorf("[%d]: pair of %d tokens, want 2", i, len(p))
		}
		out[i] = [2]string{p[0], p[1]}
	}
	return out, nil
}

// parseNormalizer returns nil for no normalization.
func parseNormalizer(raw json.RawMessage) (func(string) string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	switch c.Type {
	case "NFC":
		return norm.NFC.String, nil
	case "NFD":
		return norm.NFD.String, nil
	case "NFKC":
		return norm.NFKC.String, nil
	case "NFKD":
		return norm.NFKD.String, nil
	case "Sequence":
		var steps []func(string) string
		for i, r := range c.Normalizers {
			f, err := parseNormalizer(r)
			if err != nil {
				return nil, fmt.Errorf("normalizers[%d]: %w", i, err)
			}
			if f != nil {
				steps = append(steps, f)
			}
		}
		return func(s string) string {
			for _, f := range steps {
				s = f(s)
			}
			return s
		}, nil
	default:
		return nil, fmt.Errorf("type %q: %w (only NFC, NFD, NFKC, NFKD, Sequence)", c.Type, ErrUnsupported)
	}
}

// gpt2Pattern is the regex ByteLevel applies when use_regex is true.
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// parsePreTokenizer accepts ByteLevel alone or a Sequence of Split steps
// ending in ByteLevel.
func parsePreTokenizer(raw json.RawMessage) ([]splitter, error) {
	if isNull(raw) {
		return nil, errors.New("missing; a byte-level BPE needs ByteLevel")
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	steps := []json.RawMessage{raw}
	if c.Type == "Sequence" {
		steps = c.PreTokenizers
	}
	var splits []splitter
	for i, r := range steps {
		var s component
		if err := json.Unmarshal(r, &s); err != nil {
			return nil, err
		}
		where := s.Type
		if c.Type == "Sequence" {
			where = fmt.Sprintf("pretokenizers[%d] (%s)", i, s.Type)
		}
		last := i == len(steps)-1
		switch s.Type {
		case "Split":
			if last {
				return nil, fmt.Errorf("%s: %w: the last step must be ByteLevel", where, ErrUnsupported)
			}
			sp, err := parseSplit(s)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", where, err)
			}
			splits = append(splits, sp)
		case "ByteLevel":
			if !last {
				return nil, fmt.Errorf("%s: %w: ByteLevel must be the last step", where, ErrUnsupported)
			}
			// Hugging Face's defaults are add_prefix_space=true, use_regex=true.
			if s.AddPrefixSpace == nil || *s.AddPrefixSpace {
				return nil, fmt.Errorf("%s: add_prefix_space true: %w", where, ErrUnsupported)
			}
			if s.UseRegex == nil || *s.UseRegex {
				splits = append(splits, newRegexSplitter(gpt2Pattern))
			}
		default:
			return nil, fmt.Errorf("%s: %w (only ByteLevel, Split, Sequence)", where, ErrUnsupported)
		}
	}
	if len(steps) == 0 {
		return nil, errors.New("empty Sequence; a byte-level BPE needs ByteLevel")
	}
	return splits, nil
}

func parseSplit(s component) (splitter, error) {
	if s.Behavior != "Isolated" {
		return nil, fmt.Errorf("behavior %q: %w (only Isolated)", s.Behavior, ErrUnsupported)
	}
	if s.Invert {
		return nil, fmt.Errorf("invert true: %w", ErrUnsupported)
	}
	switch {
	case s.Pattern == nil:
		return nil, errors.New("pattern: missing")
	case s.Pattern.Regex != nil:
		if *s.Pattern.Regex == qwen2Pattern {
			return qwen2Splitter{}, nil
		}
		sp, err := compileRegexSplitter(*s.Pattern.Regex)
		if err != nil {
			return nil, fmt.Errorf("pattern.Regex: %w", err)
		}
		return sp, nil
	case s.Pattern.String != nil:
		if *s.Pattern.String == "" {
			return nil, errors.New("pattern.String: empty")
		}
		return newRegexSplitter(regexp.QuoteMeta(*s.Pattern.String)), nil
	default:
		return nil, errors.New("pattern: want Regex or String")
	}
}

func checkDecoder(raw json.RawMessage) error {
	if isNull(raw) {
		return errors.New("missing; want ByteLevel")
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return err
	}
	if c.Type != "ByteLevel" {
		return fmt.Errorf("type %q: %w (only ByteLevel)", c.Type, ErrUnsupported)
	}
	return nil
}

// configJSON is the part of tokenizer_config.json this package reads.
type configJSON struct {
	EOSToken     json.RawMessage `json:"eos_token"`
	PadToken     json.RawMessage `json:"pad_token"`
	BOSToken     json.RawMessage `json:"bos_token"`
	ChatTemplate json.RawMessage `json:"chat_template"`
}

// qwen25DefaultSystem is the system message Qwen2.5's chat template inserts
// when the conversation does not start with one.
const qwen25DefaultSystem = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

// defaultSystemRE finds the default system block of a Qwen chat template: a
// Jinja string literal '<|im_start|>system\n…<|im_end|>\n' (Qwen2 and
// Qwen2.5 both write it so).
var defaultSystemRE = regexp.MustCompile(`'<\|im_start\|>system\\n([^'\\]*)<\|im_end\|>\\n'`)

// applyConfig sets the special token ids and the default system message from
// tokenizer_config.json (file == "" when there is none).
func (t *Tokenizer) applyConfig(file string, data []byte) error {
	fallback := func(names ...string) int {
		for _, n := range names {
			if id, ok := t.TokenID(n); ok {
				return id
			}
		}
		return -1
	}
	if file == "" {
		t.eos = fallback("<|im_end|>", "<|endoftext|>")
		t.pad = fallback("<|endoftext|>")
		if t.pad < 0 {
			t.pad = t.eos
		}
		t.defaultSystem = qwen25DefaultSystem
		return nil
	}
	fail := func(format string, args ...any) error {
		return fmt.Errorf("tokenizer: %s: "+format, append([]any{file}, args...)...)
	}
	var c configJSON
	if err := json.Unmarshal(data, &c); err != nil {
		return fail("%w", err)
	}
	for _, f := range []struct {
		name string
		raw  json.RawMessage
		dst  *int
	}{{"eos_token", c.EOSToken, &t.eos}, {"pad_token", c.PadToken, &t.pad}, {"bos_token", c.BOSToken, &t.bos}} {
		name, err := tokenName(f.raw)
		if err != nil {
			return fail("%s: %w", f.name, err)
		}
		if name == "" {
			continue
		}
		id, ok := t.TokenID(name)
		if !ok {
			return fail("%s %q: not a token of %s", f.name, name, t.path)
		}
		*f.dst = id
	}
	if t.eos < 0 {
		t.eos = fallback("<|im_end|>", "<|endoftext|>")
	}
	if t.pad < 0 {
		t.pad = fallback("<|endoftext|>")
		if t.pad < 0 {
			t.pad = t.eos
		}
	}

	tmpl, err := chatTemplate(c.ChatTemplate)
	if err != nil {
		return fail("chat_template: %w", err)
	}
	if m := defaultSystemRE.FindStringSubmatch(tmpl); m != nil {
		t.defaultSystem = m[1]
	}
	return nil
}

// tokenName reads a special token entry: null, "text" or {"content": "text"}.
func tokenName(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var obj struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return "", errors.New(`want null, a string or {"content": ...}`)
	}
	return obj.Content, nil
}

// chatTemplate reads chat_template: a string, or a list of {name, template}
// of which "default" is used.
func chatTemplate(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var list []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return "", errors.New("want a string or a list of {name, template}")
	}
	for _, e := range list {
		if e.Name == "default" {
			return e.Template, nil
		}
	}
	return "", nil
}
