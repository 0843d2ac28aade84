package tokenizer

import (
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// fuzzTexts seed the encode/decode targets: scripts, added tokens written
// as text, invalid UTF-8 of every kind, combining marks that NFC composes.
var fuzzTexts = []string{
	"Hello world",
	"<|im_start|>user\nWho wrote Hamlet?<|im_end|>\n<|im_start|>assistant\n",
	"e\u0301<|im_end|>\u0301",
	"<|im_end",
	"DON'T we'll 123 ½ 中文 😀👍🏽",
	"a  \n\n  b\t\t c   \r\n",
	"\xff\xfe\xc0\xaf\xed\xa0\x80\xf4\x90\x80\x80\xe2\x82",
	"\u212a\u2126\u037e\u1fef", // NFC turns these into other code points (K, Ω, ;, `)
	"<think>x</think><search>m: q</search>",
	"",
}

// FuzzEncodeDecode checks the encode/decode round trip of the Qwen2.5
// tokenizer on arbitrary text, valid UTF-8 or not: Decode(Encode(s)) is
// canonically equivalent to s with its invalid sequences replaced (Encode
// normalises each section between added tokens to NFC on its own), the
// round trip is stable, EncodePlain never produces an added token, and the
// segment encoder agrees with the two.
func FuzzEncodeDecode(f *testing.F) {
	for _, s := range fuzzTexts {
		f.Add(s)
	}
	tk := qwen(f)
	added := map[int]bool{}
	for _, id := range tk.addedID {
		added[id] = true
	}
	f.Fuzz(func(t *testing.T, s string) {
		valid := toValidUTF8(s)
		if !utf8.ValidString(valid) {
			t.Fatalf("toValidUTF8(%q) = %q is not valid UTF-8", s, valid)
		}
		ids := tk.Encode(s)
		for _, id := range ids {
			if tk.TokenBytes(id) == nil {
				t.Fatalf("Encode(%q) = %v holds %d, which is not a token", s, ids, id)
			}
		}
		got := tk.Decode(ids)
		if !utf8.ValidString(got) {
			t.Fatalf("Decode(Encode(%q)) = %q is not valid UTF-8", s, got)
		}
		if norm.NFC.String(got) != norm.NFC.String(valid) {
			t.Fatalf("Decode(Encode(%q)) = %q, want text canonically equivalent to %q", s, got, valid)
		}
		if again := tk.Encode(got); !slices.Equal(again, ids) {
			t.Fatalf("Encode(Decode(Encode(%q))) = %v, want %v: a decoded text must encode back to the same ids", s, again, ids)
		}

		plain := tk.EncodePlain(s)
		for _, id := range plain {
			if added[id] || tk.IsSpecial(id) {
				t.Fatalf("EncodePlain(%q) = %v holds the added token %d: untrusted text must not inject control tokens", s, plain, id)
			}
		}
		if got, want := tk.Decode(plain), norm.NFC.String(valid); got != want {
			t.Fatalf("Decode(EncodePlain(%q)) = %q, want its NFC form %q", s, got, want)
		}
		if got := string(tk.DecodeBytes(plain)); got != norm.NFC.String(valid) {
			t.Fatalf("DecodeBytes(EncodePlain(%q)) = %q, want %q", s, got, norm.NFC.String(valid))
		}

		if seg := tk.EncodeSegments(Segment{Text: s}); !slices.Equal(seg, ids) {
			t.Fatalf("EncodeSegments(%q) = %v, want Encode's %v", s, seg, ids)
		}
		if seg := tk.EncodeSegments(Segment{Text: s, Plain: true}); !slices.Equal(seg, plain) {
			t.Fatalf("EncodeSegments(plain %q) = %v, want EncodePlain's %v", s, seg, plain)
		}
		half := len(s) / 2
		for half > 0 && half < len(s) && !utf8.RuneStart(s[half]) {
			half--
		}
		split := tk.EncodeSegments(Segment{Text: s[:half], Plain: true}, Segment{Text: s[half:], Plain: true})
		if utf8.ValidString(s) && !slices.Equal(split, plain) {
			t.Fatalf("EncodeSegments of %q in two plain halves = %v, want EncodePlain's %v", s, split, plain)
		}
	})
}

// FuzzDecode decodes arbitrary id sequences (negative, past the vocabulary,
// partial UTF-8): no panic, valid UTF-8 out, unknown ids skipped.
func FuzzDecode(f *testing.F) {
	seed := func(ids ...int32) []byte {
		b := make([]byte, 4*len(ids))
		for i, id := range ids {
			binary.LittleEndian.PutUint32(b[4*i:], uint32(id))
		}
		return b
	}
	f.Add(seed(9707, 1879))
	f.Add(seed(-1, 151645, 1<<30, 151935, 151665))
	f.Add(seed(126, 250, 120, 0)) // bytes of a split UTF-8 sequence
	f.Add([]byte{1, 2, 3})
	tk := qwen(f)
	f.Fuzz(func(t *testing.T, raw []byte) {
		ids := make([]int, len(raw)/4)
		var known []int
		for i := range ids {
			ids[i] = int(int32(binary.LittleEndian.Uint32(raw[4*i:])))
			if tk.TokenBytes(ids[i]) != nil {
				known = append(known, ids[i])
			}
		}
		b := tk.DecodeBytes(ids)
		if want := tk.DecodeBytes(known); string(b) != string(want) {
			t.Fatalf("DecodeBytes(%v) = %q, want the bytes of its known ids %q", ids, b, want)
		}
		s := tk.Decode(ids)
		if !utf8.ValidString(s) || s != toValidUTF8(string(b)) {
			t.Fatalf("Decode(%v) = %q, want the valid UTF-8 form of %q", ids, s, b)
		}
	})
}

// FuzzParse loads arbitrary tokenizer.json bytes: no panic, no allocation
// sized by a hostile number, an error naming the file, and a tokenizer that
// loads encodes and decodes text back.
func FuzzParse(f *testing.F) {
	tiny, err := json.Marshal(tinyJSON())
	if err != nil {
		f.Fatal(err)
	}
	qwenConfig, err := os.ReadFile(filepath.Join(qwenDir, ConfigFile))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(tiny, "abc <|x|> abcabc é", []byte(nil))
	f.Add(tiny, "abc", []byte(`{"eos_token":{"content":"<|x|>"},"pad_token":null,"chat_template":[{"name":"default","template":"'<|im_start|>system\\nHi<|im_end|>\\n'"}]}`))
	f.Add(tiny, "abc", []byte(`{"eos_token":"<|nope|>"}`))
	f.Add(tiny, "abc", qwenConfig)
	f.Add([]byte(strings.Replace(string(tiny), `"id":258`, `"id":1000000000000`, 1)), "x", []byte(nil))
	f.Add([]byte(strings.Replace(string(tiny), `"merges":["a b","ab c"]`, `"merges":[["a","b"],["ab","c"]]`, 1)), "abc", []byte(nil))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"pre_tokenizer":{"type":"ByteLevel"}}`), "", []byte(nil))
	f.Add([]byte(`null`), "", []byte(nil))
	f.Add([]byte(strings.Replace(string(tiny), `"id":258`, `"id":256`, 1)), "ab", []byte(nil)) // the added token takes the id of "ab"
	f.Fuzz(func(t *testing.T, data []byte, text string, config []byte) {
		tk, err := parse("tokenizer.json", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "tokenizer: tokenizer.json: ") {
				t.Fatalf("parse error %q does not name the package and file", err)
			}
			return
		}
		if len(text) > 256 {
			text = text[:256] // a Split regex from the input may backtrack
		}
		if len(config) == 0 {
			if err := tk.applyConfig("", nil); err != nil {
				t.Fatalf("applyConfig without a config file: %v", err)
			}
		} else if err := tk.applyConfig(ConfigFile, config); err != nil {
			if !strings.HasPrefix(err.Error(), "tokenizer: "+ConfigFile+": ") {
				t.Fatalf("applyConfig error %q does not name the package and file", err)
			}
		} else {
			for _, id := range []int{tk.EOS(), tk.PadID(), tk.BOS()} {
				if id != -1 && tk.TokenBytes(id) == nil {
					t.Fatalf("tokenizer_config.json %s set a special id %d that is no token", config, id)
				}
			}
		}
		ids := tk.EncodePlain(text)
		want := toValidUTF8(text)
		if tk.normalize != nil {
			want = tk.normalize(want)
		}
		if got := tk.Decode(ids); got != want {
			t.Fatalf("Decode(EncodePlain(%q)) = %q, want %q (the normalised text)", text, got, want)
		}
		_ = tk.Decode(tk.Encode(text))
	})
}
