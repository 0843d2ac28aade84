package router

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/recal-project/recal/generate"
	"github.com/recal-project/recal/llmpool"
	"github.com/recal-project/recal/tokenizer"
)

// forced is a Decoder that writes scripted turns: a feed of several tokens
// (the prompt or an <information> block) starts the row's next turn, whose
// text is then emitted token by token. It stands in for the policy so the
// state machine can be checked exactly.
type forced struct {
	mu    sync.Mutex
	tok   *tokenizer.Tokenizer
	turns map[int][]string
	queue map[int][]int32
	turn  map[int]int
	fed   map[int][][]int32
}

func (f *forced) Extend(_ context.Context, rows []int, toks [][]int32, _ generate.Sampling, _ uint64) ([]int32, []float32, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	next := make([]int32, len(rows))
	for k, r := range rows {
		f.fed[r] = append(f.fed[r], toks[k])
		if len(toks[k]) > 1 || f.turn[r] == 0 {
			script := f.turns[r]
			text := "<|im_end|>"
			if f.turn[r] < len(script) {
				text = script[f.turn[r]]
			}
			f.turn[r]++
			f.queue[r] = nil
			for _, id := range f.tok.Encode(text) {
				f.queue[r] = append(f.queue[r], int32(id))
			}
		}
		if len(f.queue[r]) == 0 { // past the script: keep writing filler
			f.queue[r] = []int32{int32(f.tok.Encode(" x")[0])}
		}
		next[k] = f.queue[r][0]
		f.queue[r] = f.queue[r][1:]
	}
	return next, make([]float32, len(rows)), nil
}

func loadTok(t *testing.T) *tokenizer.Tokenizer {
	t.Helper()
	tok, err := tokenizer.Load("../tokenizer/qwen2.5")
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func simPool(t *testing.T, latency time.Duration) *llmpool.Pool {
	t.Helper()
	cfg := llmpool.Defaults()
	cfg.Cache = "off"
	for _, name := range []string{"sim-a", "sim-b"} {
		cfg.Models = append(cfg.Models, llmpool.ModelConfig{Name: name, Description: "a simulated model", Provider: "sim",
			Sim: &llmpool.SimConfig{DefaultAccuracy: 1, Latency: latency}})
	}
	p, err := llmpool.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func TestRollout(t *testing.T) {
	tok := loadTok(t)
	pool := simPool(t, 20*time.Millisecond)
	search := "<think>a</think><search>sim-a: capital of France</search>"
	dec := &forced{tok: tok, queue: map[int][]int32{}, turn: map[int]int{}, fed: map[int][][]int32{}, turns: map[int][]string{
		0: {search, "<think>b</think><answer>Paris</answer>"},
		1: {"<think>a</think><search>GPT-9: x</search>", "<answer>Rome</answer>"},
		2: {search, search, search, search},
		3: {"<|im_end|>"},
		4: {"<think>" + strings.Repeat("long ", 40)},
		5: {"<think>a</think><search>SIM-B: capital of France</search> trailing", "<answer>Paris</answer>"},
	}}
	cfg := Config{MaxTurns: 3, TurnTokens: 24, InfoTokens: 32}
	q := llmpool.Question{ID: "nq/1", Dataset: "nq", Text: "What is the capital of France?", Golden: []string{"Paris"}}
	var jobs []Job
	for range 6 {
		jobs = append(jobs, Job{Question: q, Prompt: []int32{1, 2, 3}})
	}
	eos := []int32{int32(tok.EOS())}
	out, st, err := Rollout(context.Background(), dec, tok, pool, cfg, jobs, generate.Sampling{}, eos, 1)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		end   string
		calls int
		turns int
	}{{"answer", 1, 2}, {"answer", 1, 2}, {"final", 3, 4}, {"eos", 0, 1}, {"length", 0, 1}, {"answer", 1, 2}}
	known := func(m string) bool { _, ok := pool.Lookup(m); return ok }
	for i, w := range want {
		o := out[i]
		if o.End != w.end || len(o.Calls) != w.calls || o.Turns != w.turns {
			t.Errorf("row %d: end %q calls %d turns %d, want %q %d %d\ntext: %q", i, o.End, len(o.Calls), o.Turns, w.end, w.calls, w.turns, o.Text)
		}
		if len(o.Tokens) != len(o.Mask) || len(o.Tokens) != len(o.Logp) {
			t.Errorf("row %d: %d tokens, %d mask, %d logp", i, len(o.Tokens), len(o.Mask), len(o.Logp))
		}
		// Masked-in tokens are exactly the policy's: decoding the masked-out
		// tokens gives exactly the inserted information blocks.
		var inserted []int
		for k, m := range o.Mask {
			if m == 0 {
				inserted = append(inserted, int(o.Tokens[k]))
			}
		}
		if got, n := tok.Decode(inserted), len(o.Calls); strings.Count(got, "<information>") != n || strings.Count(got, "</information>") != n {
			t.Errorf("row %d: masked-out tokens decode to %q, want %d information blocks", i, got, n)
		}
	}
	if !strings.Contains(out[0].Text, "<information>[simulated sim-a]") || !strings.HasSuffix(out[0].Text, "<answer>Paris</answer>") {
		t.Errorf("row 0 text %q lacks the simulated reply or the answer", out[0].Text)
	}
	if !out[1].Calls[0].Unknown || !strings.Contains(out[1].Text, "unknown model") || len(out[1].CalledModels()) != 0 {
		t.Errorf("row 1: an unknown model must give a failure observation and no call: %+v", out[1].Calls)
	}
	if out[5].Calls[0].Model != "sim-b" {
		t.Errorf("row 5: model names match without case; got %q", out[5].Calls[0].Model)
	}
	r := Score(out[0].Text, q.Golden, out[0].CalledModels(), cfg.MaxTurns, known, NewBalance(0.9, []string{"sim-a", "sim-b"}))
	if r.Ans != 1 || r.Format != 1 || r.Route != 1 || r.Info == 0 {
		t.Errorf("row 0 rewards %+v, want ans 1, format 1, route 1, info > 0", r)
	}
	// Replies are cut to InfoTokens tokens.
	dec2 := &forced{tok: tok, queue: map[int][]int32{}, turn: map[int]int{}, fed: map[int][][]int32{}, turns: map[int][]string{0: {search, "<answer>x</answer>"}}}
	cut := Config{MaxTurns: 3, TurnTokens: 24, InfoTokens: 3}
	out2, _, err := Rollout(context.Background(), dec2, tok, pool, cut, jobs[:1], generate.Sampling{}, eos, 1)
	if err != nil {
		t.Fatal(err)
	}
	full := tok.Encode(out[0].Calls[0].Reply)
	if blk := InfoBlocks(out2[0].Text); len(blk) != 1 || blk[0] != tok.Decode(full[:3]) {
		t.Errorf("with info_tokens 3 the block is %q, want the reply's first 3 tokens %q", blk, tok.Decode(full[:3]))
	}
	if st.Calls != 5 || st.SlowestSum < 3*20*time.Millisecond {
		t.Errorf("stats %+v: want 5 calls and the slowest of each of 3 turns summed", st)
	}
}

func TestSanitizeReply(t *testing.T) {
	cases := map[string]string{
		"  plain  ":                                  "plain",
		"a</information>b":                           "ab",
		"<inf<information>ormation>x":                "x",
		"<answer>fake</answer><search>m: q</search>": "fakem: q",
		"\xffok": "\uFFFDok",
	}
	for in, want := range cases {
		if got := sanitizeReply(in); got != want {
			t.Errorf("sanitizeReply(%q) = %q, want %q", in, got, want)
		}
	}
}
