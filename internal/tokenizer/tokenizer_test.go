package tokenizer

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/text/unicode/norm"
)

var update = flag.Bool("update", false, "regenerate testdata/golden.jsonl and testdata/chat_golden.jsonl with node (run npm ci in testdata/ref first)")

// qwenDir is the vendored Qwen2.5 tokenizer the golden files were made from
// (a data folder at the top of the repository).
const qwenDir = "../../tokenizer/qwen2.5"

var (
	qwenOnce sync.Once
	qwenTok  *Tokenizer
	qwenErr  error
)

// qwen loads the vendored Qwen2.5 tokenizer once for all tests.
func qwen(tb testing.TB) *Tokenizer {
	tb.Helper()
	qwenOnce.Do(func() { qwenTok, qwenErr = Load(qwenDir) })
	if qwenErr != nil {
		tb.Fatalf("Load(%q): %v", qwenDir, qwenErr)
	}
	return qwenTok
}

func TestKnownEncodings(t *testing.T) {
	tk := qwen(t)
	for _, tc := range []struct {
		text string
		want []int
	}{
		{"Hello world", []int{9707, 1879}},
		{"<|im_start|>user\n", []int{151644, 872, 198}},
		{"\n\n", []int{271}},
		{"<think>", []int{13708, 766, 29}},
		{"0123456789", []int{15, 16, 17, 18, 19, 20, 21, 22, 23, 24}},
		{"", nil},
	} {
		if got := tk.Encode(tc.text); !slices.Equal(got, tc.want) {
			t.Errorf("Encode(%q) = %v, want %v (known Hugging Face encoding)", tc.text, got, tc.want)
		}
	}
}

type goldenCase struct {
	Name    string `json:"name"`
	Text    string `json:"text"`
	IDs     []int  `json:"ids"`
	Decoded string `json:"decoded"`
}

type chatCase struct {
	Name                string    `json:"name"`
	Messages            []Message `json:"messages"`
	AddGenerationPrompt bool      `json:"add_generation_prompt"`
	Text                string    `json:"text"`
	IDs                 []int     `json:"ids"`
}

// regenerate runs testdata/ref/make_golden.mjs once when -update is given.
var regenerate = sync.OnceValue(func() error {
	cmd := exec.Command("node", "make_golden.mjs")
	cmd.Dir = filepath.Join("testdata", "ref")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return errors.New(err.Error() + ": " + string(out))
	}
	return nil
})

// readJSONL decodes one T per line of a testdata file.
func readJSONL[T any](t *testing.T, name string) []T {
	t.Helper()
	if *update {
		if err := regenerate(); err != nil {
			t.Fatalf("regenerate golden files: %v", err)
		}
	}
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	var out []T
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("%s line %d: %v", name, len(out)+1, err)
		}
		out = append(out, v)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestGolden compares Encode and Decode with the JS port of Hugging Face
// tokenizers (testdata/ref) on hand-written and random text.
func TestGolden(t *testing.T) {
	tk := qwen(t)
	cases := readJSONL[goldenCase](t, "golden.jsonl")
	if len(cases) < 300 {
		t.Fatalf("golden.jsonl has %d cases, want the full fixture (>= 300)", len(cases))
	}
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			got := tk.Encode(c.Text)
			if !slices.Equal(got, c.IDs) && !(len(got) == 0 && len(c.IDs) == 0) {
				t.Fatalf("Encode(%q):\n got  %v\n want %v (Hugging Face reference; a model sees different tokens than in training)", c.Text, got, c.IDs)
			}
			if dec := tk.Decode(c.IDs); dec != c.Decoded {
				t.Errorf("Decode(%v) = %q, want %q (reference)", c.IDs, dec, c.Decoded)
			}
			if dec, want := tk.Decode(got), norm.NFC.String(c.Text); dec != want {
				t.Errorf("Decode(Encode(%q)) = %q, want its NFC form %q: the round trip must be lossless", c.Text, dec, want)
			}
		})
	}
}

// TestChatGolden compares FormatChat with the Jinja template of
// tokenizer_config.json as the JS reference renders it.
func TestChatGolden(t *testing.T) {
	tk := qwen(t)
	for _, c := range readJSONL[chatCase](t, "chat_golden.jsonl") {
		t.Run(c.Name, func(t *testing.T) {
			got := tk.FormatChat(c.Messages, c.AddGenerationPrompt)
			if got != c.Text {
				t.Fatalf("FormatChat(%+v, %v):\n got  %q\n want %q (Qwen2.5 chat template)", c.Messages, c.AddGenerationPrompt, got, c.Text)
			}
			if ids := tk.Encode(got); !slices.Equal(ids, c.IDs) {
				t.Errorf("Encode(chat):\n got  %v\n want %v", ids, c.IDs)
			}
		})
	}
}

func TestFormatChatEmpty(t *testing.T) {
	tk := qwen(t)
	want := "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>assistant\n"
	if got := tk.FormatChat(nil, true); got != want {
		t.Errorf("FormatChat(nil, true) = %q, want %q (default system block, then the prompt)", got, want)
	}
}

func TestTokenAccessors(t *testing.T) {
	tk := qwen(t)
	for _, tc := range []struct {
		name      string
		got, want any
	}{
		{"VocabSize", tk.VocabSize(), 151665},
		{"EOS", tk.EOS(), 151645},
		{"PadID", tk.PadID(), 151643},
		{"BOS", tk.BOS(), -1},
		{"StopIDs", tk.StopIDs(), []int{151645, 151643}},
		{"TokenBytes(1879)", string(tk.TokenBytes(1879)), " world"},
		{"TokenBytes(151645)", string(tk.TokenBytes(151645)), "<|im_end|>"},
		{"TokenBytes(-1)", tk.TokenBytes(-1), []byte(nil)},
		{"TokenBytes(151665)", tk.TokenBytes(151665), []byte(nil)},
		{"IsSpecial(im_start)", tk.IsSpecial(151644), true},
		{"IsSpecial(tool_call)", tk.IsSpecial(151657), false},
		{"IsSpecial(world)", tk.IsSpecial(1879), false},
		{"DefaultSystem", tk.DefaultSystem(), "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."},
	} {
		if !jsonEqual(tc.got, tc.want) {
			t.Errorf("%s = %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	for s, want := range map[string]int{" world": 1879, "Hello": 9707, "<|im_end|>": 151645, "<tool_call>": 151657, "\n\n": 271} {
		if id, ok := tk.TokenID(s); !ok || id != want {
			t.Errorf("TokenID(%q) = %d, %v; want %d, true", s, id, ok, want)
		}
	}
	if id, ok := tk.TokenID("Ġworld"); ok {
		t.Errorf("TokenID(%q) = %d, true; want false: TokenID takes plain text, not vocab.json's byte-level form", "Ġworld", id)
	}
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

func TestDecodeBytes(t *testing.T) {
	tk := qwen(t)
	ids := tk.Encode("é😀")
	var all []byte
	for _, id := range ids {
		all = append(all, tk.TokenBytes(id)...)
	}
	if got := tk.DecodeBytes(ids); string(got) != "é😀" || string(all) != "é😀" {
		t.Fatalf("DecodeBytes(%v) = %q, concatenated TokenBytes = %q; want %q", ids, got, all, "é😀")
	}
	// A prefix of the emoji's tokens ends inside its UTF-8 sequence: raw bytes
	// keep it, Decode shows U+FFFD.
	for n := 1; n < len(ids); n++ {
		raw := tk.DecodeBytes(ids[:n])
		if !strings.HasPrefix("é😀", string(raw)) {
			t.Errorf("DecodeBytes(%v) = %q, want a byte prefix of %q", ids[:n], raw, "é😀")
		}
	}
	if got := tk.Decode([]int{-5, 9707, 999999, 1879}); got != "Hello world" {
		t.Errorf("Decode with unknown ids = %q, want %q (unknown ids are skipped)", got, "Hello world")
	}
}

func TestInvalidUTF8(t *testing.T) {
	tk := qwen(t)
	for _, tc := range []struct {
		in, repaired string
	}{
		{"\xff", "\uFFFD"},
		{"a\xffb", "a\uFFFDb"},
		{"\xe2\x82", "\uFFFD"},                 // truncated 3-byte sequence: one maximal subpart
		{"\xe2\x82x", "\uFFFDx"},               //
		{"\xed\xa0\x80", "\uFFFD\uFFFD\uFFFD"}, // surrogate: ED A0 is never valid
		{"\xf0\x9f\x98", "\uFFFD"},             // truncated emoji
		{"\xc0\xaf", "\uFFFD\uFFFD"},           // overlong
		{"ok\xf4\x90\x80\x80", "ok\uFFFD\uFFFD\uFFFD\uFFFD"},
		{"<|im_end|>\xff<|im_end|>", "<|im_end|>\uFFFD<|im_end|>"},
	} {
		got := tk.Encode(tc.in)
		want := tk.Encode(tc.repaired)
		if !slices.Equal(got, want) {
			t.Errorf("Encode(%q) = %v, want %v, the encoding of %q (invalid bytes become U+FFFD)", tc.in, got, want, tc.repaired)
		}
		if dec := tk.Decode(got); dec != tc.repaired {
			t.Errorf("Decode(Encode(%q)) = %q, want %q", tc.in, dec, tc.repaired)
		}
		if dec := string(appendValidUTF8(nil, []byte(tc.in))); dec != tc.repaired {
			t.Errorf("appendValidUTF8(%q) = %q, want %q (maximal subparts, as Python and WHATWG)", tc.in, dec, tc.repaired)
		}
	}
}

// TestConcurrentEncode encodes the golden texts from several goroutines; with
// the shared word cache the results must not change.
func TestConcurrentEncode(t *testing.T) {
	tk := qwen(t)
	cases := readJSONL[goldenCase](t, "golden.jsonl")
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range cases {
				c := cases[(i+g*37)%len(cases)]
				if got := tk.Encode(c.Text); !slices.Equal(got, c.IDs) && len(c.IDs) > 0 {
					errs <- c.Name
					return
				}
				_ = tk.Decode(c.IDs)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for name := range errs {
		t.Errorf("concurrent Encode of %s differs from the golden ids", name)
	}
}

func TestLoadWithoutConfig(t *testing.T) {
	dir := t.TempDir()
	data, err := os.ReadFile(filepath.Join(qwenDir, TokenizerFile))
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, TokenizerFile)
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	tk, err := Load(file) // the file itself, not the folder
	if err != nil {
		t.Fatal(err)
	}
	if tk.EOS() != 151645 || tk.PadID() != 151643 || tk.DefaultSystem() == "" {
		t.Errorf("without tokenizer_config.json: EOS %d, PadID %d, DefaultSystem %q; want the documented fallbacks 151645, 151643 and Qwen2.5's", tk.EOS(), tk.PadID(), tk.DefaultSystem())
	}
	if got := tk.Encode("Hello world"); !slices.Equal(got, []int{9707, 1879}) {
		t.Errorf("Encode = %v", got)
	}
}

func ExampleTokenizer_Encode() {
	tk, err := Load(qwenDir)
	if err != nil {
		panic(err)
	}
	ids := tk.Encode("<|im_start|>user\nHello world<|im_end|>")
	fmt.Println(ids)
	fmt.Printf("%q\n", tk.Decode(ids[3:]))
	// Output:
	// [151644 872 198 9707 1879 151645]
	// "Hello world<|im_end|>"
}

func ExampleTokenizer_FormatChat() {
	tk, err := Load(qwenDir)
	if err != nil {
		panic(err)
	}
	fmt.Print(tk.FormatChat([]Message{{Role: "user", Content: "Hi"}}, true))
	// Output:
	// <|im_start|>system
	// You are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>
	// <|im_start|>user
	// Hi<|im_end|>
	// <|im_start|>assistant
}

// benchText is a mix of prose, code, CJK and emoji, about 2 KB.
const benchText = "Reinforcement learning from human feedback fine-tunes a language model against a reward model. " +
	"In 2022, InstructGPT showed that a 1.3B-parameter model was preferred over the 175B GPT-3 85% of the time! " +
	"Isn't that surprising?\n\n" +
	"def reward(completion: str, answers: list[str]) -> float:\n    \"\"\"Exact match after normalisation.\"\"\"\n" +
	"    pred = extract(completion).strip().lower()\n    return float(any(pred == a.lower() for a in answers))\n\n" +
	"中文也可以：奖励模型、策略梯度。日本語のテキスト。😀👍🏽 Café naïve résumé.\n" +
	"<|im_start|>user\nWho wrote 'The Old Man and the Sea'? Answer in <answer></answer> tags.<|im_end|>\n"

func BenchmarkEncode(b *testing.B) {
	tk := qwen(b)
	text := strings.Repeat(benchText, 4)
	noCache := *tk
	noCache.model.cache = nil
	regex := noCache
	regex.splits = []splitter{newRegexSplitter(qwen2Pattern)}
	for _, bc := range []struct {
		name string
		tk   *Tokenizer
	}{{"cached", tk}, {"uncached", &noCache}, {"regexp2_uncached", &regex}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				bc.tk.Encode(text)
			}
		})
	}
}

func BenchmarkDecode(b *testing.B) {
	tk := qwen(b)
	ids := tk.Encode(strings.Repeat(benchText, 4))
	b.ReportAllocs()
	for b.Loop() {
		tk.Decode(ids)
	}
}
