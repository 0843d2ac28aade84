package tokenizer

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// tinyJSON is a minimal byte-level BPE tokenizer.json in Qwen2's shape: ids
// 0..255 are the bytes in order, then "ab" (256) and "abc" (257), and one
// special added token <|x|> (258).
func tinyJSON() map[string]any {
	vocab := map[string]any{}
	for b := range 256 {
		vocab[string(byteToRune[b])] = b
	}
	vocab["ab"] = 256
	vocab["abc"] = 257
	return map[string]any{
		"version": "1.0",
		"added_tokens": []any{
			map[string]any{"id": 258, "content": "<|x|>", "special": true, "normalized": false, "lstrip": false, "rstrip": false, "single_word": false},
		},
		"normalizer": map[string]any{"type": "NFC"},
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": qwen2Pattern}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
		}},
		"decoder": map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
		"model": map[string]any{
			"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": "", "end_of_word_suffix": "",
			"fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": []any{"a b", "ab c"},
		},
	}
}

// writeTiny writes doc (and config, when not nil) into a new folder and
// returns the tokenizer.json path.
func writeTiny(t *testing.T, doc any, config any) string {
	t.Helper()
	dir := t.TempDir()
	write := func(name string, v any) {
		data, ok := v.([]byte)
		if !ok {
			var err error
			if data, err = json.Marshal(v); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(TokenizerFile, doc)
	if config != nil {
		write(ConfigFile, config)
	}
	return filepath.Join(dir, TokenizerFile)
}

func TestTinyTokenizer(t *testing.T) {
	const text = "abc ab<|x|>a"
	want := []int{257, 32, 256, 258, 97} // "abc", " "+"ab", <|x|>, "a"
	for _, tc := range []struct {
		name   string
		merges any
	}{
		{"string merges", []any{"a b", "ab c"}},
		{"pair merges", []any{[]any{"a", "b"}, []any{"ab", "c"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := tinyJSON()
			doc["model"].(map[string]any)["merges"] = tc.merges
			file := writeTiny(t, doc, nil)
			for _, path := range []string{file, filepath.Dir(file)} {
				tk, err := Load(path)
				if err != nil {
					t.Fatalf("Load(%s): %v", path, err)
				}
				if got := tk.Encode(text); !slices.Equal(got, want) {
					t.Errorf("Encode(%q) = %v, want %v", text, got, want)
				}
				if got := tk.Decode(want); got != text {
					t.Errorf("Decode(%v) = %q, want %q", want, got, text)
				}
				if tk.VocabSize() != 259 || tk.EOS() != -1 || tk.PadID() != -1 {
					t.Errorf("VocabSize %d, EOS %d, PadID %d; want 259, -1, -1 (no config, no <|im_end|>/<|endoftext|>)", tk.VocabSize(), tk.EOS(), tk.PadID())
				}
			}
		})
	}
}

// TestGenericRegex runs a tokenizer whose Split pattern is not Qwen2's, so
// regexp2 splits; GPT-2's ByteLevel use_regex goes the same way.
func TestGenericRegex(t *testing.T) {
	doc := tinyJSON()
	pre := doc["pre_tokenizer"].(map[string]any)["pretokenizers"].([]any)
	pre[0].(map[string]any)["pattern"] = map[string]any{"Regex": `\s+|\S+`}
	tk, err := Load(writeTiny(t, doc, nil))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := tk.Encode("abc  abab"), []int{257, 32, 32, 256, 256}; !slices.Equal(got, want) {
		t.Errorf("Encode with Split %q = %v, want %v", `\s+|\S+`, got, want)
	}

	doc = tinyJSON()
	doc["pre_tokenizer"] = map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}
	if tk, err = Load(writeTiny(t, doc, nil)); err != nil {
		t.Fatal(err)
	}
	if got, want := tk.Encode("ab abc"), []int{256, 32, 257}; !slices.Equal(got, want) {
		t.Errorf("Encode with ByteLevel use_regex = %v, want %v", got, want)
	}
}

func TestLoadErrors(t *testing.T) {
	model := func(d map[string]any) map[string]any { return d["model"].(map[string]any) }
	for _, tc := range []struct {
		name        string
		edit        func(d map[string]any)
		raw         []byte // written instead of the edited document
		config      any
		want        []string // substrings of the message, after "tokenizer: " and the file name
		unsupported bool     // errors.Is(err, ErrUnsupported)
	}{
		{name: "not json", raw: []byte("{"), want: []string{"unexpected end of JSON"}},
		{name: "no model", edit: func(d map[string]any) { delete(d, "model") }, want: []string{"model: missing"}},
		{name: "model type", edit: func(d map[string]any) { model(d)["type"] = "WordPiece" }, want: []string{`model.type "WordPiece"`, "only BPE"}, unsupported: true},
		{name: "no vocab", edit: func(d map[string]any) { delete(model(d), "vocab") }, want: []string{"model.vocab: missing"}},
		{name: "no merges", edit: func(d map[string]any) { delete(model(d), "merges") }, want: []string{"model.merges: missing"}},
		{name: "bad merge", edit: func(d map[string]any) { model(d)["merges"] = []any{"a b", "abc"} }, want: []string{`model.merges: [1] "abc"`}},
		{name: "merge not in vocab", edit: func(d map[string]any) { model(d)["merges"] = []any{"b c"} }, want: []string{`model.merges[0] "b c": token not in model.vocab`}},
		{name: "merges not a list", edit: func(d map[string]any) { model(d)["merges"] = 3 }, want: []string{"model.merges: want a list"}},
		{name: "byte missing", edit: func(d map[string]any) { delete(model(d)["vocab"].(map[string]any), "Ġ") }, want: []string{"model.vocab: no token for byte 0x20"}},
		{name: "not byte level", edit: func(d map[string]any) { model(d)["vocab"].(map[string]any)["▁x"] = 300 }, want: []string{`model.vocab["▁x"]: not a byte-level token`}},
		{name: "huge vocab id", edit: func(d map[string]any) { model(d)["vocab"].(map[string]any)["ab"] = 1 << 40 }, want: []string{`model.vocab["ab"]: id 1099511627776 is outside [0, 4194304)`}},
		{name: "negative vocab id", edit: func(d map[string]any) { model(d)["vocab"].(map[string]any)["ab"] = -1 }, want: []string{`model.vocab["ab"]: id -1 is outside`}},
		{name: "huge added id", edit: func(d map[string]any) { d["added_tokens"].([]any)[0].(map[string]any)["id"] = 1 << 40 }, want: []string{`added_tokens: "<|x|>": id missing or outside [0, 4194304)`}},
		{name: "added id of a vocab token", edit: func(d map[string]any) { d["added_tokens"].([]any)[0].(map[string]any)["id"] = 256 }, want: []string{`added_tokens[0] "<|x|>": id 256 is already the token "ab"`}},
		{name: "added id twice", edit: func(d map[string]any) {
			d["added_tokens"] = append(d["added_tokens"].([]any), map[string]any{"id": 258, "content": "<|y|>", "special": true})
		}, want: []string{`added_tokens[1] "<|y|>": id 258 is already the token "<|x|>"`}},
		{name: "byte fallback", edit: func(d map[string]any) { model(d)["byte_fallback"] = true }, want: []string{"model.byte_fallback"}, unsupported: true},
		{name: "dropout", edit: func(d map[string]any) { model(d)["dropout"] = 0.1 }, want: []string{"model.dropout 0.1"}, unsupported: true},
		{name: "normalizer", edit: func(d map[string]any) { d["normalizer"] = map[string]any{"type": "Lowercase"} }, want: []string{`normalizer: type "Lowercase"`}, unsupported: true},
		{name: "normalizer in sequence", edit: func(d map[string]any) {
			d["normalizer"] = map[string]any{"type": "Sequence", "normalizers": []any{map[string]any{"type": "NFC"}, map[string]any{"type": "Strip"}}}
		}, want: []string{`normalizer: normalizers[1]: type "Strip"`}, unsupported: true},
		{name: "no pre_tokenizer", edit: func(d map[string]any) { d["pre_tokenizer"] = nil }, want: []string{"pre_tokenizer: missing"}},
		{name: "pre_tokenizer type", edit: func(d map[string]any) { d["pre_tokenizer"] = map[string]any{"type": "Whitespace"} }, want: []string{"pre_tokenizer: Whitespace"}, unsupported: true},
		{name: "split behavior", edit: func(d map[string]any) {
			d["pre_tokenizer"].(map[string]any)["pretokenizers"].([]any)[0].(map[string]any)["behavior"] = "Removed"
		}, want: []string{"pre_tokenizer: pretokenizers[0] (Split): behavior \"Removed\""}, unsupported: true},
		{name: "bad regex", edit: func(d map[string]any) {
			d["pre_tokenizer"].(map[string]any)["pretokenizers"].([]any)[0].(map[string]any)["pattern"] = map[string]any{"Regex": "(a"}
		}, want: []string{"pre_tokenizer: pretokenizers[0] (Split): pattern.Regex:"}},
		{name: "prefix space", edit: func(d map[string]any) {
			d["pre_tokenizer"] = map[string]any{"type": "ByteLevel", "add_prefix_space": true}
		}, want: []string{"pre_tokenizer: ByteLevel: add_prefix_space true"}, unsupported: true},
		{name: "decoder", edit: func(d map[string]any) { d["decoder"] = map[string]any{"type": "WordPiece"} }, want: []string{`decoder: type "WordPiece"`}, unsupported: true},
		{name: "added lstrip", edit: func(d map[string]any) { d["added_tokens"].([]any)[0].(map[string]any)["lstrip"] = true }, want: []string{`added_tokens[0] "<|x|>": lstrip`}, unsupported: true},
		{name: "config eos", config: map[string]any{"eos_token": "<|nope|>"}, want: []string{ConfigFile, `eos_token "<|nope|>": not a token`}},
		{name: "config bad json", config: []byte("[1,"), want: []string{ConfigFile}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var doc any = tc.raw
			if tc.raw == nil {
				d := tinyJSON()
				if tc.edit != nil {
					tc.edit(d)
				}
				doc = d
			}
			file := writeTiny(t, doc, tc.config)
			tk, err := Load(file)
			if err == nil {
				t.Fatalf("Load = %v, nil; want an error mentioning %q", tk, tc.want)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "tokenizer: ") {
				t.Errorf("error %q lacks the package prefix", msg)
			}
			wantFile := file
			if tc.config != nil {
				wantFile = filepath.Join(filepath.Dir(file), ConfigFile)
			}
			for _, w := range append([]string{wantFile}, tc.want...) {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not mention %q: it must name the file and the field", msg, w)
				}
			}
			if got := errors.Is(err, ErrUnsupported); got != tc.unsupported {
				t.Errorf("errors.Is(%q, ErrUnsupported) = %v, want %v", msg, got, tc.unsupported)
			}
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	dir := t.TempDir()
	for _, path := range []string{filepath.Join(dir, "nope.json"), dir} {
		if _, err := Load(path); err == nil || !strings.HasPrefix(err.Error(), "tokenizer: ") || !errors.Is(err, os.ErrNotExist) {
			t.Errorf("Load(%s) error = %v, want a tokenizer: error wrapping os.ErrNotExist", path, err)
		}
	}
}

// A tokenizer.json or tokenizer_config.json that is not a regular file (a
// FIFO no one writes, a link to /dev/urandom) is refused at once, naming
// it, never waited on or read without end.
func TestLoadHostileFiles(t *testing.T) {
	for _, tc := range []struct{ file, kind string }{
		{TokenizerFile, "fifo"}, {TokenizerFile, "urandom"}, {ConfigFile, "fifo"},
	} {
		t.Run(tc.file+" "+tc.kind, func(t *testing.T) {
			dir := t.TempDir()
			b, err := os.ReadFile(filepath.Join(qwenDir, TokenizerFile))
			if err != nil {
				t.Fatal(err)
			}
			os.WriteFile(filepath.Join(dir, TokenizerFile), b, 0o644)
			path := filepath.Join(dir, tc.file)
			os.Remove(path)
			if tc.kind == "fifo" {
				if err := syscall.Mkfifo(path, 0o600); err != nil {
					t.Fatal(err)
				}
			} else if err := os.Symlink("/dev/urandom", path); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { _, err := Load(dir); done <- err }()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "not a regular file") {
					t.Fatalf("Load with %s as a %s: %v; want an error naming it as not a regular file", tc.file, tc.kind, err)
				}
			// A blocked Load never returns; the bound only ends the test. It is
			// generous because the config cases first parse the real
			// tokenizer.json, which took over 5 s under -race on a loaded
			// 2-core machine.
			case <-time.After(2 * time.Minute):
				t.Fatalf("Load with %s as a %s: still blocked after 2 min", tc.file, tc.kind)
			}
		})
	}
}
