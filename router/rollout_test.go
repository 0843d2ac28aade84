package router

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/generate"
	"github.com/recal-project/recal/internal/tokenizer"
	"github.com/recal-project/recal/llmpool"
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
	var models []llmpool.ModelConfig
	for _, name := range []string{"sim-a", "sim-b"} {
		models = append(models, llmpool.ModelConfig{Name: name, Description: "a simulated model", Provider: "sim",
			Sim: &llmpool.SimConfig{DefaultAccuracy: 1, Latency: latency}})
	}
	return poolOf(t, models...)
}

// poolOf is a pool of models with the cache off, closed when the test ends.
func poolOf(t *testing.T, models ...llmpool.ModelConfig) *llmpool.Pool {
	t.Helper()
	cfg := llmpool.Defaults()
	cfg.Cache = "off"
	cfg.Models = models
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
	r := Score(&out[0], q.Golden, cfg.MaxTurns, 0, known, NewBalance(0.9, []string{"sim-a", "sim-b"}))
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
	if c := out2[0].Calls[0]; c.Reply != tok.Decode(full[:3]) || c.ReplyBytes != len(out[0].Calls[0].Reply) {
		t.Errorf("with info_tokens 3 the call records reply %q of %d bytes, want what the policy was shown, %q, and the reply's length %d",
			c.Reply, c.ReplyBytes, tok.Decode(full[:3]), len(out[0].Calls[0].Reply))
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

// A policy that writes <information> itself ends its response there: it is
// never shown the block it wrote, earns no information reward for it, and
// is not well formed.
func TestRolloutPolicyInformation(t *testing.T) {
	tok := loadTok(t)
	pool := simPool(t, 0)
	fake := "<think>I know</think><information>Paris</information><answer>Paris</answer>"
	dec := &forced{tok: tok, queue: map[int][]int32{}, turn: map[int]int{}, fed: map[int][][]int32{}, turns: map[int][]string{
		0: {fake, "<answer>Paris</answer>"},
		1: {"<think>a</think><search>sim-a: capital of Spain</search>", fake},
	}}
	cfg := Config{MaxTurns: 3, TurnTokens: 48, InfoTokens: 32}
	q := llmpool.Question{ID: "nq/1", Dataset: "nq", Text: "What is the capital of France?", Golden: []string{"Paris"}}
	jobs := []Job{{Question: q, Prompt: []int32{1, 2, 3}}, {Question: q, Prompt: []int32{1, 2, 3}}}
	out, _, err := Rollout(context.Background(), dec, tok, pool, cfg, jobs, generate.Sampling{}, []int32{int32(tok.EOS())}, 1)
	if err != nil {
		t.Fatal(err)
	}
	known := func(m string) bool { _, ok := pool.Lookup(m); return ok }
	for i, w := range []struct{ calls, turns int }{{0, 1}, {1, 2}} {
		o := out[i]
		if o.End != "information" || len(o.Calls) != w.calls || o.Turns != w.turns {
			t.Errorf("row %d: end %q, %d calls, %d turns; want \"information\", %d, %d: a policy-written <information> ends the response\ntext: %q",
				i, o.End, len(o.Calls), o.Turns, w.calls, w.turns, o.Text)
		}
		if strings.Contains(o.Text, "Paris</information>") || strings.Contains(o.Text, "<answer>") {
			t.Errorf("row %d: text %q goes on past the policy's <information>", i, o.Text)
		}
		// Row 1's real reply, "[simulated sim-a] The answer is Paris.", earns
		// its own F1 (1/3), not the 1 of the policy's "Paris".
		wantInfo := 0.0
		if len(o.Calls) > 0 {
			wantInfo = data.F1(o.Calls[0].Reply, q.Golden)
		}
		if r := Score(&o, q.Golden, cfg.MaxTurns, 0, known, NewBalance(0.9, []string{"sim-a", "sim-b"})); r.Info != wantInfo || r.Info == 1 || r.Format != 0 {
			t.Errorf("row %d: info %v, format %v; want info %v (the pool's replies only) and format 0: the policy wrote <information>", i, r.Info, r.Format, wantInfo)
		}
	}
}

// countingTok is the real tokenizer, noting the longest text it was asked
// to encode.
type countingTok struct {
	*tokenizer.Tokenizer
	longest atomic.Int64
}

func (c *countingTok) note(s string) {
	for n := int64(len(s)); ; {
		m := c.longest.Load()
		if n <= m || c.longest.CompareAndSwap(m, n) {
			return
		}
	}
}

func (c *countingTok) Encode(s string) []int      { c.note(s); return c.Tokenizer.Encode(s) }
func (c *countingTok) EncodePlain(s string) []int { c.note(s); return c.Tokenizer.EncodePlain(s) }

// hugePool is the sim pool with every reply replaced by one text. The real
// pool caps a provider's body at 8 MiB; the router must hold up whatever a
// Pool returns.
type hugePool struct {
	*llmpool.Pool
	text string
}

func (h hugePool) Call(ctx context.Context, req llmpool.Request) llmpool.Response {
	r := h.Pool.Call(ctx, req)
	r.Text = h.text
	return r
}

// A 10 MiB reply is cut by bytes before it is encoded: the tokenizer never
// sees more than InfoTokens × ReplyBytesPerToken bytes of it, the call
// records a bounded reply and the reply's real length, and the policy is
// shown the same block as from the reply's first 64 KiB.
func TestRolloutHugeReply(t *testing.T) {
	tok := loadTok(t)
	counting := &countingTok{Tokenizer: tok}
	text := strings.Repeat("The capital of France is Paris, écrit-on. ", 10<<20/43+1)
	pool := hugePool{simPool(t, 0), text}
	dec := &forced{tok: tok, queue: map[int][]int32{}, turn: map[int]int{}, fed: map[int][][]int32{}, turns: map[int][]string{
		0: {"<think>a</think><search>sim-a: capital of France</search>", "<think>b</think><answer>Paris</answer>"},
	}}
	cfg := Config{MaxTurns: 3, TurnTokens: 24, InfoTokens: 600}
	bound := cfg.InfoTokens * ReplyBytesPerToken
	q := llmpool.Question{ID: "nq/1", Dataset: "nq", Text: "What is the capital of France?", Golden: []string{"Paris"}}
	out, _, err := Rollout(context.Background(), dec, counting, pool, cfg, []Job{{Question: q, Prompt: []int32{1, 2, 3}}},
		generate.Sampling{}, []int32{int32(tok.EOS())}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if n := counting.longest.Load(); n > int64(bound) {
		t.Errorf("the tokenizer was asked to encode %d bytes; want at most %d (info_tokens × %d): a huge reply must not be tokenised whole", n, bound, ReplyBytesPerToken)
	}
	o := out[0]
	if len(o.Calls) != 1 || o.End != "answer" {
		t.Fatalf("%d calls, end %q; want 1 call and an answer", len(o.Calls), o.End)
	}
	c := o.Calls[0]
	if c.ReplyBytes != len(text) || len(c.Reply) > bound || !strings.HasPrefix(text, c.Reply) {
		t.Errorf("call records %d reply bytes of %d; want the text's length %d and a prefix of at most %d bytes", len(c.Reply), c.ReplyBytes, len(text), bound)
	}
	want, wantBody := InfoBlock(tok, text[:64<<10], cfg.InfoTokens)
	var shown []int32
	for k, m := range o.Mask {
		if m == 0 {
			shown = append(shown, o.Tokens[k])
		}
	}
	if !slices.Equal(shown, want) || c.Reply != wantBody {
		t.Errorf("the block shown (%d tokens) differs from the block of the reply's first 64 KiB (%d tokens): the byte cut must not change what the policy sees", len(shown), len(want))
	}
	if len(want) < cfg.InfoTokens {
		t.Errorf("the block holds %d tokens; want the full %d (the test needs a reply longer than the cut)", len(want), cfg.InfoTokens)
	}
}

// A Job's Models restrict what Rollout lets its response call, as
// RowOptions.Models does for Scheduler.Submit (train.model_subsets): a
// <search> naming a pool model outside them is an unknown model, with no
// pool call.
func TestRolloutJobModels(t *testing.T) {
	tok := loadTok(t)
	q := llmpool.Question{ID: "nq/1", Dataset: "nq", Text: "What is the capital of France?", Golden: []string{"Paris"}}
	cases := []struct {
		name    string
		models  []string
		calls   []string // pool models called
		unknown bool     // the <search> got the unknown-model observation
	}{
		{"every model", nil, []string{"sim-b"}, false},
		{"the model written listed", []string{"sim-b"}, []string{"sim-b"}, false},
		{"listed in another spelling", []string{"SIM-B", "sim-a"}, []string{"sim-b"}, false},
		{"the model written not listed", []string{"sim-a"}, nil, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pool := simPool(t, 0)
			dec := &forced{tok: tok, queue: map[int][]int32{}, turn: map[int]int{}, fed: map[int][][]int32{}, turns: map[int][]string{
				0: {"<think>a</think><search>sim-b: capital of France</search>", "<think>b</think><answer>Paris</answer>"},
			}}
			jobs := []Job{{Question: q, Prompt: []int32{1, 2, 3}, Models: c.models}}
			out, _, err := Rollout(context.Background(), dec, tok, pool, Config{MaxTurns: 2, TurnTokens: 24, InfoTokens: 32}, jobs,
				generate.Sampling{}, []int32{int32(tok.EOS())}, 1)
			if err != nil {
				t.Fatal(err)
			}
			s := out[0]
			if !slices.Equal(s.CalledModels(), c.calls) {
				t.Errorf("called %v, want %v: a response may call only its job's models", s.CalledModels(), c.calls)
			}
			var made int64
			for _, u := range pool.Usage() {
				made += u.Calls
			}
			if want := int64(len(c.calls)); made != want {
				t.Errorf("%d pool calls, want %d: an unlisted model must not be called", made, want)
			}
			if len(s.Calls) != 1 || s.Calls[0].Unknown != c.unknown || c.unknown && !strings.Contains(s.Calls[0].Reply, "unknown model") {
				t.Errorf("call records %+v, want one with Unknown %v", s.Calls, c.unknown)
			}
		})
	}
}

// With router.agreement each observation after the first ends with which
// earlier replies state its answer, computed from the replies alone; the
// call records the reply without the note. Off, no block holds a note.
func TestRolloutAgreement(t *testing.T) {
	tok := loadTok(t)
	var models []llmpool.ModelConfig
	for name, acc := range map[string]float64{"sim-a": 1, "sim-b": 1, "sim-w": 0} {
		models = append(models, llmpool.ModelConfig{Name: name, Description: "a simulated model", Provider: "sim",
			Sim: &llmpool.SimConfig{DefaultAccuracy: acc}})
	}
	pool := poolOf(t, models...)
	ask := func(m string) string { return "<think>a</think><search>" + m + ": capital of France</search>" }
	scripts := map[int][]string{
		0: {ask("sim-a"), ask("sim-b"), "<answer>Paris</answer>"},
		1: {ask("sim-a"), ask("sim-w"), ask("sim-b"), "<answer>Paris</answer>"},
		2: {ask("GPT-9"), ask("sim-a"), "<answer>Paris</answer>"},
	}
	want := map[int][]string{ // each block's note
		0: {"", " Agrees with: sim-a."},
		1: {"", " Agrees with: none.", " Agrees with: sim-a."},
		2: {"", " Agrees with: none."}, // a failed call agrees with nothing
	}
	q := llmpool.Question{ID: "nq/1", Dataset: "nq", Text: "What is the capital of France?", Golden: []string{"Paris"}}
	jobs := []Job{{Question: q, Prompt: []int32{1, 2, 3}}, {Question: q, Prompt: []int32{1, 2, 3}}, {Question: q, Prompt: []int32{1, 2, 3}}}
	for _, on := range []bool{false, true} {
		dec := &forced{tok: tok, queue: map[int][]int32{}, turn: map[int]int{}, fed: map[int][][]int32{}, turns: scripts}
		cfg := Config{MaxTurns: 3, TurnTokens: 24, InfoTokens: 32, Agreement: on}
		out, _, err := Rollout(context.Background(), dec, tok, pool, cfg, jobs, generate.Sampling{}, []int32{int32(tok.EOS())}, 1)
		if err != nil {
			t.Fatal(err)
		}
		for i, notes := range want {
			o := out[i]
			blocks := InfoBlocks(o.Text)
			if len(blocks) != len(notes) || len(o.Calls) != len(notes) {
				t.Fatalf("agreement %v, row %d: %d blocks, %d calls, want %d: %q", on, i, len(blocks), len(o.Calls), len(notes), o.Text)
			}
			for k, b := range blocks {
				note := notes[k]
				if !on {
					note = ""
				}
				if b != o.Calls[k].Reply+note {
					t.Errorf("agreement %v, row %d, block %d: %q, want the reply %q then %q", on, i, k, b, o.Calls[k].Reply, note)
				}
			}
		}
	}
}

// On a replayed world rendered from judgments the note reads what the
// models wrote (the logged replies), not the rendered replies the policy
// sees: two right replies in prose that state no short answer render
// alike but do not agree; a wrong reply whose prose names the right
// answer renders apart but agrees. The call records keep the logged text.
func TestRolloutAgreementReadsEvidence(t *testing.T) {
	tok := loadTok(t)
	row := func(model, reply string, right bool) string {
		return fmt.Sprintf(`{"dataset":"nq","question_id":"nq/1","question":"capital of france","golden_answers":["Paris"],"model":%q,"reply":%q,"correct":%v}`, model, reply, right)
	}
	log := filepath.Join(t.TempDir(), "log.jsonl")
	text := strings.Join([]string{
		row("short", "Paris", true),
		row("prose1", "The capital of France is Paris, of course, as everyone knows.", true),
		row("prose2", "France has long been governed from Paris, by the Seine.", true),
		row("hedge", "Lyon is my guess, though Paris is often named.", false),
	}, "\n") + "\n"
	if err := os.WriteFile(log, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	var models []llmpool.ModelConfig
	for _, m := range []string{"short", "prose1", "prose2", "hedge"} {
		models = append(models, llmpool.ModelConfig{Name: m, Description: "a replayed model", Provider: "replay",
			Replay: &llmpool.ReplayConfig{Log: log, Render: llmpool.RenderJudgment}})
	}
	pool := poolOf(t, models...)
	ask := func(m string) string { return "<think>a</think><search>" + m + ": capital of France</search>" }
	scripts := map[int][]string{
		0: {ask("prose1"), ask("prose2"), "<answer>Paris</answer>"}, // rendered alike ("The answer is Paris."), written apart
		1: {ask("short"), ask("hedge"), "<answer>Paris</answer>"},   // rendered apart ("Lyon"), but hedge wrote "Paris"
	}
	want := map[int][]string{0: {"", " Agrees with: none."}, 1: {"", " Agrees with: short."}}
	q := llmpool.Question{ID: "nq/1", Dataset: "nq", Text: "capital of france", Golden: []string{"Paris"}}
	jobs := []Job{{Question: q, Prompt: []int32{1, 2, 3}}, {Question: q, Prompt: []int32{1, 2, 3}}}
	dec := &forced{tok: tok, queue: map[int][]int32{}, turn: map[int]int{}, fed: map[int][][]int32{}, turns: scripts}
	cfg := Config{MaxTurns: 3, TurnTokens: 24, InfoTokens: 64, Agreement: true}
	out, _, err := Rollout(context.Background(), dec, tok, pool, cfg, jobs, generate.Sampling{}, []int32{int32(tok.EOS())}, 1)
	if err != nil {
		t.Fatal(err)
	}
	for i, notes := range want {
		blocks := InfoBlocks(out[i].Text)
		if len(blocks) != len(notes) || len(out[i].Calls) != len(notes) {
			t.Fatalf("row %d: %d blocks, %d calls, want %d: %q", i, len(blocks), len(out[i].Calls), len(notes), out[i].Text)
		}
		for k, b := range blocks {
			c := out[i].Calls[k]
			if !strings.HasPrefix(c.Reply, "The answer is ") || c.Evidence == "" || c.Evidence == c.Reply {
				t.Errorf("row %d, call %d: reply %q, evidence %q: want the rendered reply and the logged text", i, k, c.Reply, c.Evidence)
			}
			if b != c.Reply+notes[k] {
				t.Errorf("row %d, block %d: %q, want the rendered reply %q then %q", i, k, b, c.Reply, notes[k])
			}
		}
	}
}

func TestAgreementNote(t *testing.T) {
	earlier := []Call{
		{Model: "fid", Reply: "The answer is Lagos State."},
		{Model: "gpt35", Reply: "[pool error: model gpt35 unavailable]", Failed: true},
		{Model: "chatgpt", Reply: "Lagos, I think. The answer is Lagos."},
		// a replayed reply rendered from its judgment: agreement reads what the model wrote
		{Model: "gpt4", Reply: "The answer is Ibadan.", Evidence: "Most sources name Ibadan, though some say Abuja."},
	}
	cases := []struct {
		c    Call
		want string
	}{
		{Call{Reply: "The answer is Lagos."}, " Agrees with: fid, chatgpt."},      // whole words inside a longer answer
		{Call{Reply: "The answer is lagos state"}, " Agrees with: fid, chatgpt."}, // chatgpt's "Lagos" is in this one: either way round
		{Call{Reply: "The answer is Abuja."}, " Agrees with: gpt4."},              // gpt4 wrote it, though its rendered reply says Ibadan
		{Call{Reply: "The answer is Ibadan."}, " Agrees with: gpt4."},
		{Call{Reply: "Lagos"}, " Agrees with: fid, chatgpt."},                                               // a short reply is its own answer
		{Call{Reply: "Lagos is a state of Nigeria and its largest city by far."}, " Agrees with: chatgpt."}, // a long one states none, but may mention another's
		{Call{Reply: "The answer is Abuja.", Evidence: "Lagos State"}, " Agrees with: fid, chatgpt."},       // read on the evidence, not the rendered text
		{Call{Reply: "The answer is pool error."}, " Agrees with: none."},                                   // failed calls agree with nothing
		{Call{Reply: "The answer is Lagos.", Failed: true}, " Agrees with: none."},                          // nor does a failed reply itself
		{Call{Reply: "The answer is ."}, " Agrees with: none."},
	}
	for _, c := range cases {
		if got := AgreementNote(c.c, earlier); got != c.want {
			t.Errorf("AgreementNote(%+v) = %q, want %q", c.c, got, c.want)
		}
	}
}

// A Job's MaxCostUSD is its response's budget, as RowOptions.MaxCostUSD
// is for Scheduler.Submit: once spent, a search makes no call.
func TestRolloutJobBudget(t *testing.T) {
	tok := loadTok(t)
	pool := pricedPool(t, nil, "sim-a")
	ask := "<think>a</think><search>sim-a: capital of France</search>"
	q := llmpool.Question{ID: "nq/1", Dataset: "nq", Text: "What is the capital of France?", Golden: []string{"Paris"}}
	for _, c := range []struct {
		budget  float64
		made    int // calls made of the two asked
		refused int
	}{{0, 2, 0}, {1e-12, 1, 1}, {1, 2, 0}} {
		dec := &forced{tok: tok, queue: map[int][]int32{}, turn: map[int]int{}, fed: map[int][][]int32{}, turns: map[int][]string{0: {ask, ask, "<answer>Paris</answer>"}}}
		cfg := Config{MaxTurns: 3, TurnTokens: 24, InfoTokens: 32}
		out, _, err := Rollout(context.Background(), dec, tok, pool, cfg, []Job{{Question: q, Prompt: []int32{1, 2, 3}, MaxCostUSD: c.budget}}, generate.Sampling{}, []int32{int32(tok.EOS())}, 1)
		if err != nil {
			t.Fatal(err)
		}
		made, refused := 0, 0
		for _, call := range out[0].Calls {
			if call.Refused {
				refused++
			} else {
				made++
			}
		}
		if made != c.made || refused != c.refused {
			t.Errorf("budget %g USD: %d calls made, %d refused; want %d, %d", c.budget, made, refused, c.made, c.refused)
		}
	}
}
