package router

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/recal-project/recal/internal/generate"
	"github.com/recal-project/recal/internal/tokenizer"
	"github.com/recal-project/recal/llmpool"
)

// promptBase is where the scripted decoder's prompt ids start: prompt k is
// [promptBase+k, 1, 2]. They are no ids of the vocabulary, so a feed that
// starts with one is a prompt, never an <information> block.
const promptBase = 1 << 20

// scripted is a Decoder that writes the turns of a script chosen by the
// prompt it is fed: each multi-token feed (the prompt or an <information>
// block) starts the next turn, whose text is then emitted token by token.
// Unlike forced it follows responses rather than rows, and it records what
// a KV cache would get wrong: a prompt appended to a row that still holds
// an earlier response (no Reset in between), or a chosen token that is not
// the next one fed to its row (the cache would lack a token of the response
// the policy is trained on).
type scripted struct {
	tok     *tokenizer.Tokenizer
	scripts map[int32][]string

	mu         sync.Mutex
	rows       map[int]*scriptRow
	resets     [][]int
	steps      []scriptStep
	violations []string
}

type scriptRow struct {
	held   int // tokens the row holds
	script []string
	turn   int
	queue  []int32
	chosen int32 // the token last returned for the row; -1 when none
}

type scriptStep struct {
	rows []int
	s    generate.Sampling
	seed uint64
}

func newScripted(tok *tokenizer.Tokenizer, scripts ...[]string) *scripted {
	d := &scripted{tok: tok, scripts: map[int32][]string{}, rows: map[int]*scriptRow{}}
	for k, s := range scripts {
		d.scripts[int32(promptBase+k)] = s
	}
	return d
}

func scriptPrompt(k int) []int32 { return []int32{int32(promptBase + k), 1, 2} }

func (d *scripted) Extend(_ context.Context, rows []int, toks [][]int32, s generate.Sampling, seed uint64) ([]int32, []float32, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.steps = append(d.steps, scriptStep{slices.Clone(rows), s, seed})
	next := make([]int32, len(rows))
	for k, r := range rows {
		st := d.rows[r]
		if st == nil {
			st = &scriptRow{chosen: -1}
			d.rows[r] = st
		}
		feed := toks[k]
		script, isPrompt := d.scripts[feed[0]]
		if st.chosen >= 0 && feed[0] != st.chosen {
			d.violations = append(d.violations, fmt.Sprintf("row %d: chosen token %d was never fed (the next feed is %v)", r, st.chosen, feed))
		}
		switch {
		case st.held == 0 && !isPrompt:
			d.violations = append(d.violations, fmt.Sprintf("row %d: an empty row was fed %v, not a prompt", r, feed))
		case st.held > 0 && isPrompt:
			d.violations = append(d.violations, fmt.Sprintf("row %d: a prompt was appended to %d tokens of an earlier response (no reset)", r, st.held))
		}
		if isPrompt {
			st.script, st.turn = script, 0
		}
		st.held += len(feed)
		if len(feed) > 1 {
			text := "<|im_end|>"
			if st.turn < len(st.script) {
				text = st.script[st.turn]
			}
			st.turn++
			st.queue = toInt32(d.tok.Encode(text))
		}
		if len(st.queue) == 0 { // past the script: keep writing filler
			st.queue = []int32{int32(d.tok.Encode(" x")[0])}
		}
		next[k] = st.queue[0]
		st.chosen = next[k]
		st.queue = st.queue[1:]
	}
	return next, make([]float32, len(rows)), nil
}

func (d *scripted) Reset(_ context.Context, rows ...int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.resets = append(d.resets, slices.Clone(rows))
	for _, r := range rows {
		delete(d.rows, r)
	}
	return nil
}

func (d *scripted) checkClean(t *testing.T) {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, v := range d.violations {
		t.Errorf("decoder: %s", v)
	}
}

// pricedPool is a sim pool whose models answer correctly after latency and
// cost $0.002 a call (1,000 tokens in and out at $1 per million).
func pricedPool(t *testing.T, latency map[string]time.Duration, names ...string) *llmpool.Pool {
	t.Helper()
	var models []llmpool.ModelConfig
	for _, name := range names {
		models = append(models, llmpool.ModelConfig{Name: name, Description: "a simulated model", Provider: "sim",
			PriceIn: 1, PriceOut: 1, Sim: &llmpool.SimConfig{DefaultAccuracy: 1, Latency: latency[name], TokensIn: 1000, TokensOut: 1000}})
	}
	return poolOf(t, models...)
}

// runScheduler runs e until the test ends.
func runScheduler(t *testing.T, e *Scheduler) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

var testQuestion = llmpool.Question{ID: "nq/1", Dataset: "nq", Text: "What is the capital of France?", Golden: []string{"Paris"}}

// sameSample compares what a response is, not when it happened.
func sameSample(a, b Sample) bool {
	strip := func(cs []Call) []Call {
		out := slices.Clone(cs)
		for i := range out {
			out[i].Latency = 0
		}
		return out
	}
	return a.Text == b.Text && a.End == b.End && a.Turns == b.Turns && slices.Equal(a.Tokens, b.Tokens) &&
		slices.Equal(a.Mask, b.Mask) && slices.Equal(strip(a.Calls), strip(b.Calls))
}

// Nine responses through two rows, submitted concurrently: each is exactly
// what Rollout gives for it alone, rows are reset before reuse, and no step
// decodes more than two rows.
func TestEngineContinuousBatching(t *testing.T) {
	tok := loadTok(t)
	pool := simPool(t, 15*time.Millisecond)
	scripts := [][]string{
		{"<think>a</think><search>sim-a: capital of France</search>", "<answer>Paris</answer>"},
		{"<think>b</think><answer>Rome</answer>"},
		{"<search>sim-b: q</search>", "<search>sim-a: q</search>", "<answer>two</answer>"},
		{"<|im_end|>"},
		{"<think>" + strings.Repeat("long ", 40)},
		{"<search>GPT-9: x</search>", "<answer>none</answer>"},
		{"<search>sim-a: 1</search>", "<search>sim-a: 2</search>", "<search>sim-a: 3</search>", "<search>sim-a: 4</search>"},
		{"<think>I know</think><information>Paris</information>"},
		{"<search>sim-b: capital</search>", "<answer>Paris</answer>"},
	}
	cfg := Config{MaxTurns: 3, TurnTokens: 24, InfoTokens: 16}
	eos := []int32{int32(tok.EOS())}
	want := make([]Sample, len(scripts))
	for k := range scripts {
		out, _, err := Rollout(context.Background(), newScripted(tok, scripts...), tok, pool, cfg,
			[]Job{{Question: testQuestion, Prompt: scriptPrompt(k)}}, generate.Sampling{}, eos, 1)
		if err != nil {
			t.Fatal(err)
		}
		want[k] = out[0]
	}
	dec := newScripted(tok, scripts...)
	e, err := NewScheduler(dec, tok, pool, cfg, SchedulerOptions{Rows: 2, EOS: eos, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	runScheduler(t, e)
	got := make([]Sample, len(scripts))
	var wg sync.WaitGroup
	for k := range scripts {
		wg.Go(func() {
			s, err := e.Do(context.Background(), Job{Question: testQuestion, Prompt: scriptPrompt(k)}, RowOptions{})
			if err != nil {
				t.Errorf("response %d: %v", k, err)
			}
			got[k] = s
		})
	}
	wg.Wait()
	for k := range scripts {
		if !sameSample(got[k], want[k]) {
			t.Errorf("response %d through the shared scheduler: end %q, %d calls, text %q\nwant what Rollout gives it alone: end %q, %d calls, text %q",
				k, got[k].End, len(got[k].Calls), got[k].Text, want[k].End, len(want[k].Calls), want[k].Text)
		}
	}
	if want[0].End != "answer" || len(want[0].Calls) != 1 || want[6].End != "final" || want[7].End != "information" {
		t.Errorf("the scripts did not play as intended: %q %d %q %q", want[0].End, len(want[0].Calls), want[6].End, want[7].End)
	}
	dec.checkClean(t)
	dec.mu.Lock()
	defer dec.mu.Unlock()
	resets := 0
	for _, r := range dec.resets {
		resets += len(r)
	}
	if resets != len(scripts)-2 {
		t.Errorf("%d rows reset; want %d: every response after the first two reuses a row", resets, len(scripts)-2)
	}
	for _, s := range dec.steps {
		if len(s.rows) > 2 || slices.ContainsFunc(s.rows, func(r int) bool { return r < 0 || r > 1 }) {
			t.Errorf("a step decoded rows %v; want at most rows 0 and 1", s.rows)
		}
	}
	if a, w := e.Load(); a != 0 || w != 0 {
		t.Errorf("after every response ended: %d active, %d waiting; want 0, 0", a, w)
	}
}

// Each row option changes only its own response, and exactly as documented.
func TestEngineRowOptions(t *testing.T) {
	tok := loadTok(t)
	search := func(m string) string { return "<think>t</think><search>" + m + ": capital of France</search>" }
	cases := []struct {
		name    string
		script  []string
		opt     RowOptions
		end     string
		calls   []string // the pool models called
		records int      // Calls entries
		check   func(t *testing.T, s Sample)
	}{
		{name: "defaults", script: []string{search("sim-a"), search("sim-b"), "<answer>Paris</answer>"},
			end: "answer", calls: []string{"sim-a", "sim-b"}, records: 2},
		{name: "model subset", script: []string{search("sim-b"), search("SIM-A"), "<answer>Paris</answer>"},
			opt: RowOptions{Models: []string{"sim-a"}}, end: "answer", calls: []string{"sim-a"}, records: 2,
			check: func(t *testing.T, s Sample) {
				if c := s.Calls[0]; !c.Unknown || !c.Failed || c.Model != "sim-b" || !strings.Contains(c.Reply, "unknown model") {
					t.Errorf("a search for sim-b outside the subset gave %+v; want an unknown-model observation and no call", c)
				}
			}},
		{name: "max turns", script: []string{search("sim-a"), search("sim-b"), "<answer>Paris</answer>"},
			opt: RowOptions{MaxTurns: 1}, end: "final", calls: []string{"sim-a"}, records: 1},
		{name: "max cost", script: []string{search("sim-a"), search("sim-b"), "<answer>Paris</answer>"},
			opt: RowOptions{MaxCostUSD: 0.001}, end: "answer", calls: []string{"sim-a"}, records: 2,
			check: func(t *testing.T, s Sample) {
				c := s.Calls[1]
				if !c.Refused || !c.Failed || c.Unknown || c.Model != "sim-b" || c.Cost != 0 || c.Reply != BudgetText {
					t.Errorf("the search after the budget was spent gave %+v; want a refused call to sim-b with the budget observation", c)
				}
				if blk := InfoBlocks(s.Text); len(blk) != 2 || !strings.Contains(blk[1], "budget") {
					t.Errorf("information blocks %q; want the budget observation second", blk)
				}
			}},
		{name: "max cost not reached", script: []string{search("sim-a"), search("sim-b"), "<answer>Paris</answer>"},
			opt: RowOptions{MaxCostUSD: 0.0041}, end: "answer", calls: []string{"sim-a", "sim-b"}, records: 2},
		{name: "max tokens", script: []string{"<think>" + strings.Repeat("long ", 40)},
			opt: RowOptions{MaxTokens: 5}, end: "length",
			check: func(t *testing.T, s Sample) {
				if len(s.Tokens) != 5 || s.Turns != 1 {
					t.Errorf("%d tokens in %d turns; want exactly max tokens, 5, in 1", len(s.Tokens), s.Turns)
				}
			}},
		{name: "max tokens counts policy tokens only", script: []string{search("sim-a"), "<answer>Paris</answer>"},
			opt: RowOptions{MaxTokens: len(tok.Encode(search("sim-a"))) + len(tok.Encode("<answer>Paris</answer>"))}, end: "answer", calls: []string{"sim-a"}, records: 1},
		{name: "max tokens ends a search turn", script: []string{search("sim-a"), "<answer>Paris</answer>"},
			opt: RowOptions{MaxTokens: len(tok.Encode(search("sim-a")))}, end: "length", records: 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pool := pricedPool(t, nil, "sim-a", "sim-b")
			e, err := NewScheduler(newScripted(tok, c.script), tok, pool, Config{MaxTurns: 3, TurnTokens: 24, InfoTokens: 32},
				SchedulerOptions{Rows: 1, EOS: []int32{int32(tok.EOS())}})
			if err != nil {
				t.Fatal(err)
			}
			runScheduler(t, e)
			var mu sync.Mutex
			var streamed []Call
			c.opt.OnCall = func(call Call) {
				mu.Lock()
				defer mu.Unlock()
				streamed = append(streamed, call)
			}
			s, err := e.Do(context.Background(), Job{Question: testQuestion, Prompt: scriptPrompt(0)}, c.opt)
			if err != nil {
				t.Fatal(err)
			}
			if s.End != c.end || !slices.Equal(s.CalledModels(), c.calls) || len(s.Calls) != c.records {
				t.Errorf("end %q, called %v, %d call records; want %q, %v, %d\ntext %q", s.End, s.CalledModels(), len(s.Calls), c.end, c.calls, c.records, s.Text)
			}
			var billed int64
			for _, u := range pool.Usage() {
				billed += u.Calls
			}
			if billed != int64(len(c.calls)) {
				t.Errorf("the pool got %d calls; want %d", billed, len(c.calls))
			}
			mu.Lock()
			if !slices.EqualFunc(streamed, s.Calls, func(a, b Call) bool { return a == b }) {
				t.Errorf("OnCall saw %d calls; want the response's %d, in order, before Do returned", len(streamed), len(s.Calls))
			}
			mu.Unlock()
			for _, call := range s.Calls {
				if made := !call.Unknown && !call.Refused; made && (call.PromptTokens != 1000 || call.CompletionTokens != 1000) {
					t.Errorf("call %+v: want the pool's token counts, 1000 and 1000", call)
				}
			}
			if c.check != nil {
				c.check(t, s)
			}
		})
	}
}

// Rows with different sampling never share a decode step's Extend call;
// Rollout keeps one seed, a server's scheduler advances it per step.
func TestEngineSamplingAndSeeds(t *testing.T) {
	tok := loadTok(t)
	pool := simPool(t, 0)
	script := []string{"<think>" + strings.Repeat("word ", 10) + "</think><answer>a</answer>"}
	for _, stepSeeds := range []bool{false, true} {
		dec := newScripted(tok, script)
		e, err := NewScheduler(dec, tok, pool, Config{MaxTurns: 3, TurnTokens: 48, InfoTokens: 32},
			SchedulerOptions{Rows: 4, EOS: []int32{int32(tok.EOS())}, Seed: 7, StepSeeds: stepSeeds})
		if err != nil {
			t.Fatal(err)
		}
		samplings := []generate.Sampling{{}, {Temperature: 1}, {}, {Temperature: 0.5, TopK: 3}}
		var ps []*Pending
		for _, s := range samplings {
			p, err := e.Submit(context.Background(), Job{Question: testQuestion, Prompt: scriptPrompt(0)}, RowOptions{Sampling: s})
			if err != nil {
				t.Fatal(err)
			}
			ps = append(ps, p)
		}
		if err := e.drain(context.Background()); err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			if s, err := p.Result(); err != nil || s.End != "answer" {
				t.Fatalf("end %q, %v; want an answer", s.End, err)
			}
		}
		seeds := map[uint64]bool{}
		for _, st := range dec.steps {
			seeds[st.seed] = true
			for _, r := range st.rows {
				if want := samplings[r]; st.s != want {
					t.Errorf("row %d (sampling %+v) decoded in a call with sampling %+v", r, want, st.s)
				}
			}
		}
		switch {
		case !stepSeeds && (len(seeds) != 1 || !seeds[7]):
			t.Errorf("without StepSeeds the seeds were %v; want 7 only (a rollout's draws must not depend on timing)", seeds)
		case stepSeeds && len(seeds) < 10:
			t.Errorf("with StepSeeds, %d distinct seeds over %d Extend calls; want one per step", len(seeds), len(dec.steps))
		}
	}
}

// With SchedulerOptions.MaxSamplings, no decode step holds more distinct
// samplings than the bound (each is Extend calls of its own), every
// response still ends, and settings that draw alike share a call (greedy
// whatever its top_p; top_p 1 and 0). Without the bound, the same
// responses decode four samplings in one step.
func TestEngineMaxSamplings(t *testing.T) {
	tok := loadTok(t)
	pool := simPool(t, 0)
	var scripts [][]string
	for k := range 6 {
		scripts = append(scripts, []string{"<think>" + strings.Repeat("word ", 3+4*k) + "</think><answer>a</answer>"})
	}
	samplings := []generate.Sampling{
		{Temperature: 0.7}, {Temperature: 0.9}, {Temperature: 1.1}, {Temperature: 0.7},
		{Temperature: 1.3}, {TopP: 0.5}, {Temperature: 0.9, TopP: 1}, {},
	}
	for _, c := range []struct {
		name      string
		max       int
		wantSteps func(most int) bool
		want      string
	}{
		{"bound 2", 2, func(most int) bool { return most <= 2 }, "at most 2"},
		{"bound 1", 1, func(most int) bool { return most == 1 }, "1"},
		{"no bound", 0, func(most int) bool { return most >= 4 }, "4 or more (all rows' settings differ)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dec := newScripted(tok, scripts...)
			e, err := NewScheduler(dec, tok, pool, Config{MaxTurns: 1, TurnTokens: 64, InfoTokens: 8},
				SchedulerOptions{Rows: 4, EOS: []int32{int32(tok.EOS())}, Seed: 3, StepSeeds: true, MaxSamplings: c.max})
			if err != nil {
				t.Fatal(err)
			}
			var ps []*Pending
			for k, s := range samplings {
				p, err := e.Submit(context.Background(), Job{Question: testQuestion, Prompt: scriptPrompt(k % len(scripts))}, RowOptions{Sampling: s})
				if err != nil {
					t.Fatal(err)
				}
				ps = append(ps, p)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := e.drain(ctx); err != nil {
				t.Fatalf("drain: %v (a response waited forever?)", err)
			}
			for k, p := range ps {
				if s, err := p.Result(); err != nil || s.End != "answer" {
					t.Errorf("response %d (sampling %+v): end %q, %v; want an answer", k, samplings[k], s.End, err)
				}
			}
			perStep := map[uint64][]generate.Sampling{} // StepSeeds: one seed per step
			var unnormal []generate.Sampling
			for _, st := range dec.steps {
				if !slices.Contains(perStep[st.seed], st.s) {
					perStep[st.seed] = append(perStep[st.seed], st.s)
				}
				if (st.s.Temperature == 0 && st.s != generate.Sampling{} || st.s.TopP == 1) && !slices.Contains(unnormal, st.s) {
					unnormal = append(unnormal, st.s)
				}
			}
			if len(unnormal) > 0 {
				t.Errorf("Extend calls with samplings %+v; want greedy as {} and top_p 1 as 0 (they draw alike: one call)", unnormal)
			}
			most := 0
			for _, ss := range perStep {
				most = max(most, len(ss))
			}
			if !c.wantSteps(most) {
				t.Errorf("a decode step held %d distinct samplings with MaxSamplings %d; want %s", most, c.max, c.want)
			}
			dec.checkClean(t)
		})
	}
	if _, err := NewScheduler(newScripted(tok), tok, pool, Config{MaxTurns: 1, TurnTokens: 8, InfoTokens: 8},
		SchedulerOptions{Rows: 1, MaxSamplings: -1}); err == nil || !strings.Contains(err.Error(), "samplings") {
		t.Errorf("NewScheduler with MaxSamplings -1: %v; want an error naming the samplings bound", err)
	}
}

// A response whose sampling is one too many is not overtaken by later
// responses of a sampling already decoding (which could keep it waiting
// forever): the rows wait for it, first come, first served.
func TestEngineMaxSamplingsInOrder(t *testing.T) {
	tok := loadTok(t)
	short := []string{"<think>word</think><answer>a</answer>"}
	long := []string{"<think>" + strings.Repeat("word ", 12) + "</think><answer>a</answer>"}
	dec := newScripted(tok, short, long)
	e, err := NewScheduler(dec, tok, simPool(t, 0), Config{MaxTurns: 1, TurnTokens: 64, InfoTokens: 8},
		SchedulerOptions{Rows: 2, EOS: []int32{int32(tok.EOS())}, Seed: 3, StepSeeds: true, MaxSamplings: 1})
	if err != nil {
		t.Fatal(err)
	}
	// Were the third and fourth let past the second, they would keep its
	// sampling out until both had ended: the first ends early, then the
	// fourth would take its row beside the long third.
	a, b := generate.Sampling{Temperature: 0.5}, generate.Sampling{Temperature: 1}
	for k, s := range []generate.Sampling{a, b, a, a} {
		script := 0
		if k >= 2 {
			script = 1
		}
		if _, err := e.Submit(context.Background(), Job{Question: testQuestion, Prompt: scriptPrompt(script)}, RowOptions{Sampling: s}); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	var runs []generate.Sampling // the samplings of the Extend calls, repeats folded
	for _, st := range dec.steps {
		if len(runs) == 0 || runs[len(runs)-1] != st.s {
			runs = append(runs, st.s)
		}
	}
	if want := []generate.Sampling{a, b, a}; !slices.Equal(runs, want) {
		t.Errorf("decode calls by sampling %+v; want %+v: the second response (its own sampling) before the third and fourth", runs, want)
	}
}

// slowPool is the sim pool, noting each call's context error when the call
// returns.
type slowPool struct {
	*llmpool.Pool
	started chan string
	mu      sync.Mutex
	ended   []error
}

func (s *slowPool) Call(ctx context.Context, req llmpool.Request) llmpool.Response {
	s.started <- req.Model
	r := s.Pool.Call(ctx, req)
	s.mu.Lock()
	s.ended = append(s.ended, ctx.Err())
	s.mu.Unlock()
	return r
}

// Cancelling a response that waits on a slow pool call cancels the call,
// frees the row for the next response (reset first) and disturbs no one.
func TestEngineCancel(t *testing.T) {
	tok := loadTok(t)
	pool := &slowPool{Pool: pricedPool(t, map[string]time.Duration{"sim-slow": time.Minute}, "sim-slow", "sim-a"), started: make(chan string, 4)}
	scripts := [][]string{
		{"<search>sim-slow: q</search>", "<answer>never</answer>"},
		{"<search>sim-a: q</search>", "<answer>Paris</answer>"},
	}
	dec := newScripted(tok, scripts...)
	e, err := NewScheduler(dec, tok, pool, Config{MaxTurns: 3, TurnTokens: 24, InfoTokens: 32}, SchedulerOptions{Rows: 1, EOS: []int32{int32(tok.EOS())}})
	if err != nil {
		t.Fatal(err)
	}
	runScheduler(t, e)
	ctx, cancel := context.WithCancel(context.Background())
	slowDone := make(chan error, 1)
	go func() {
		_, err := e.Do(ctx, Job{Question: testQuestion, Prompt: scriptPrompt(0)}, RowOptions{OnCall: func(c Call) {
			t.Errorf("OnCall(%+v) after the response was cancelled", c)
		}})
		slowDone <- err
	}()
	if m := <-pool.started; m != "sim-slow" {
		t.Fatalf("first call to %s, want sim-slow", m)
	}
	next, err := e.Submit(context.Background(), Job{Question: testQuestion, Prompt: scriptPrompt(1)}, RowOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a, w := e.Load(); a != 1 || w != 1 {
		t.Errorf("while the only row waits on the pool: %d active, %d waiting; want 1, 1", a, w)
	}
	start := time.Now()
	cancel()
	if err := <-slowDone; !errors.Is(err, context.Canceled) {
		t.Errorf("the cancelled response returned %v; want context.Canceled", err)
	}
	s, err := next.Result()
	if err != nil || s.End != "answer" || len(s.CalledModels()) != 1 {
		t.Errorf("the next response: end %q, calls %v, %v; want an answer after one call", s.End, s.CalledModels(), err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("cancelling took %v; the minute-long call must be cancelled, not awaited", took)
	}
	pool.mu.Lock()
	if len(pool.ended) != 2 || !errors.Is(pool.ended[0], context.Canceled) || pool.ended[1] != nil {
		t.Errorf("pool calls ended with context errors %v; want the slow call cancelled and the next one not", pool.ended)
	}
	pool.mu.Unlock()
	if u := pool.Usage()["sim-slow"]; u.Failures != 1 {
		t.Errorf("sim-slow usage %+v: want one failed (cancelled) call", u)
	}
	dec.checkClean(t)
	if len(dec.resets) != 1 || !slices.Equal(dec.resets[0], []int{0}) {
		t.Errorf("resets %v; want row 0 once, before the next response", dec.resets)
	}
}

// When Run's context ends, responses in flight and waiting end with
// ErrStopped, their pool calls cancelled, and nothing more is accepted.
func TestEngineStop(t *testing.T) {
	tok := loadTok(t)
	pool := &slowPool{Pool: pricedPool(t, map[string]time.Duration{"sim-slow": time.Minute}, "sim-slow"), started: make(chan string, 4)}
	dec := newScripted(tok, []string{"<search>sim-slow: q</search>"})
	e, err := NewScheduler(dec, tok, pool, Config{MaxTurns: 3, TurnTokens: 24, InfoTokens: 32}, SchedulerOptions{Rows: 1, EOS: []int32{int32(tok.EOS())}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- e.Run(ctx) }()
	var ps []*Pending
	for range 2 {
		p, err := e.Submit(context.Background(), Job{Question: testQuestion, Prompt: scriptPrompt(0)}, RowOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	<-pool.started
	cancel()
	if err := <-ran; err != nil {
		t.Errorf("Run returned %v after its context ended; want nil", err)
	}
	for i, p := range ps {
		if _, err := p.Result(); !errors.Is(err, ErrStopped) {
			t.Errorf("response %d: %v; want ErrStopped", i, err)
		}
	}
	if len(pool.ended) != 1 || !errors.Is(pool.ended[0], context.Canceled) {
		t.Errorf("pool calls ended with %v; want the one in flight cancelled before Run returned", pool.ended)
	}
	if _, err := e.Submit(context.Background(), Job{Question: testQuestion, Prompt: scriptPrompt(0)}, RowOptions{}); !errors.Is(err, ErrStopped) {
		t.Errorf("Submit after Run: %v; want ErrStopped", err)
	}
}

func TestEngineSubmitErrors(t *testing.T) {
	tok := loadTok(t)
	e, err := NewScheduler(newScripted(tok), tok, simPool(t, 0), Config{MaxTurns: 2, TurnTokens: 8, InfoTokens: 8}, SchedulerOptions{Rows: 1})
	if err != nil {
		t.Fatal(err)
	}
	job := Job{Question: testQuestion, Prompt: scriptPrompt(0)}
	cases := []struct {
		name string
		job  Job
		opt  RowOptions
		want string
	}{
		{"empty prompt", Job{}, RowOptions{}, "empty prompt"},
		{"max turns above the config", job, RowOptions{MaxTurns: 3}, "max turns 3"},
		{"negative max turns", job, RowOptions{MaxTurns: -1}, "max turns -1"},
		{"negative cost", job, RowOptions{MaxCostUSD: -1}, "max cost"},
		{"unknown model", job, RowOptions{Models: []string{"sim-a", "gpt-9"}}, `"gpt-9" is not in the pool`},
		{"negative max tokens", job, RowOptions{MaxTokens: -2}, "max tokens"},
		{"negative temperature", job, RowOptions{Sampling: generate.Sampling{Temperature: -1}}, "sampling"},
		{"top p above 1", job, RowOptions{Sampling: generate.Sampling{Temperature: 1, TopP: 1.5}}, "sampling"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := e.Submit(context.Background(), c.job, c.opt); !errors.Is(err, ErrInvalidRow) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Submit: %v; want ErrInvalidRow mentioning %q", err, c.want)
			}
		})
	}
	if a, w := e.Load(); a != 0 || w != 0 {
		t.Errorf("rejected submissions left %d active, %d waiting", a, w)
	}
}
