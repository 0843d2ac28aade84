package router

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/recal-project/recal/internal/generate"
	"github.com/recal-project/recal/llmpool"
)

func TestRepeatBan(t *testing.T) {
	for _, c := range []struct {
		name string
		turn []int32
		n    int
		want []int32
	}{
		{"off", []int32{1, 2, 1, 2}, 0, nil},
		{"shorter than n", []int32{1, 2}, 3, nil},
		{"no earlier match", []int32{1, 2, 3, 4}, 3, nil},
		{"loop", []int32{5, 6, 7, 5, 6}, 3, []int32{7}},
		{"two continuations", []int32{5, 6, 7, 5, 6, 8, 5, 6}, 3, []int32{7, 8}},
		{"same continuation twice listed once", []int32{5, 6, 7, 5, 6, 7, 5, 6}, 3, []int32{7}},
		{"bigram", []int32{4, 9, 4}, 2, []int32{9}},
		{"self-overlap", []int32{3, 3, 3}, 3, []int32{3}},
		{"4-gram needs three tokens to match", []int32{1, 2, 3, 9, 2, 3}, 4, nil},
		{"4-gram", []int32{1, 2, 3, 9, 1, 2, 3}, 4, []int32{9}},
	} {
		if got := RepeatBan(c.turn, c.n); !slices.Equal(got, c.want) {
			t.Errorf("%s: RepeatBan(%v, %d) = %v, want %v", c.name, c.turn, c.n, got, c.want)
		}
	}
}

func TestNoRepeatNGramValidate(t *testing.T) {
	for n, ok := range map[int]bool{-1: false, 0: true, 1: false, 2: true, 3: true} {
		c := DefaultConfig()
		c.NoRepeatNGram = n
		if err := c.Validate(); (err == nil) != ok {
			t.Errorf("no_repeat_ngram = %d: error %v", n, err)
		}
	}
}

// looping writes "<think>a</think><answer> foo bar" and then repeats
// " foo bar" forever, as a copy that lost its place does; when the next
// token it wants is banned it closes the answer instead. It records every
// ban it was given.
type looping struct {
	tok   Tokenizer
	queue map[int][]int32
	bans  [][]int32
}

func (l *looping) Extend(ctx context.Context, rows []int, toks [][]int32, s generate.Sampling, seed uint64) ([]int32, []float32, error) {
	return l.ExtendBanned(ctx, rows, toks, s, seed, make([][]int32, len(rows)))
}

func (l *looping) ExtendBanned(_ context.Context, rows []int, toks [][]int32, _ generate.Sampling, _ uint64, ban [][]int32) ([]int32, []float32, error) {
	enc := func(s string) []int32 { return toInt32(l.tok.Encode(s)) }
	next := make([]int32, len(rows))
	for k, r := range rows {
		if len(toks[k]) > 1 { // the prompt
			l.queue[r] = enc("<think>a</think><answer> foo bar")
		}
		if len(l.queue[r]) == 0 {
			l.queue[r] = enc(" foo bar")
		}
		if slices.Contains(ban[k], l.queue[r][0]) {
			l.queue[r] = enc("</answer>")
		}
		l.bans = append(l.bans, ban[k])
		next[k] = l.queue[r][0]
		l.queue[r] = l.queue[r][1:]
	}
	return next, make([]float32, len(rows)), nil
}

// router.no_repeat_ngram breaks a loop inside a tag at its first repeated
// n-gram and leaves the protocol's own tags alone (a ban there would close
// the answer before " foo"); without it the loop runs to the turn's limit.
func TestNoRepeatNGramEndsLoops(t *testing.T) {
	tok := loadTok(t)
	pool := simPool(t, 0)
	q := llmpool.Question{ID: "nq/1", Dataset: "nq", Text: "q?", Golden: []string{"foo"}}
	eos := []int32{int32(tok.EOS())}
	for _, c := range []struct {
		n      int
		end    string
		text   string
		anyBan bool
	}{
		{0, "length", "", false},
		{3, "answer", "<think>a</think><answer> foo bar foo bar</answer>", true},
		{4, "answer", "<think>a</think><answer> foo bar foo bar foo</answer>", true},
	} {
		dec := &looping{tok: tok, queue: map[int][]int32{}}
		cfg := Config{MaxTurns: 1, TurnTokens: 40, InfoTokens: 32, NoRepeatNGram: c.n}
		out, _, err := Rollout(context.Background(), dec, tok, pool, cfg, []Job{{Question: q, Prompt: []int32{1, 2, 3}}}, generate.Sampling{}, eos, 1)
		if err != nil {
			t.Fatal(err)
		}
		o := out[0]
		if o.End != c.end || (c.text != "" && o.Text != c.text) {
			t.Errorf("n=%d: end %q text %q, want %q %q", c.n, o.End, o.Text, c.end, c.text)
		}
		var banned int
		for _, b := range dec.bans {
			banned += len(b)
		}
		if (banned > 0) != c.anyBan {
			t.Errorf("n=%d: %d banned tokens over the turn", c.n, banned)
		}
	}
	// A decoder that cannot ban is refused up front, not ignored.
	_, _, err := Rollout(context.Background(), &forced{tok: tok}, tok, pool, Config{MaxTurns: 1, TurnTokens: 8, InfoTokens: 8, NoRepeatNGram: 3},
		[]Job{{Question: q, Prompt: []int32{1, 2, 3}}}, generate.Sampling{}, eos, 1)
	if err == nil || !strings.Contains(err.Error(), "no_repeat_ngram") {
		t.Fatalf("a decoder without bans: error %v", err)
	}
}

// stubborn writes prefix, then loop forever; it cannot ban tokens. After a
// feed of several tokens that is not the prompt (an <information> block,
// or a tag the scheduler closed) it writes after instead. It records every
// token each row was fed.
type stubborn struct {
	tok                 Tokenizer
	prefix, loop, after string
	queue               map[int][]int32
	fed                 map[int][]int32
}

func (d *stubborn) enc(s string) []int32 { return toInt32(d.tok.Encode(s)) }

func (d *stubborn) Extend(_ context.Context, rows []int, toks [][]int32, _ generate.Sampling, _ uint64) ([]int32, []float32, error) {
	next := make([]int32, len(rows))
	for k, r := range rows {
		switch {
		case len(d.fed[r]) == 0:
			d.queue[r] = d.enc(d.prefix)
		case len(toks[k]) > 1:
			d.queue[r] = d.enc(d.after)
		}
		d.fed[r] = append(d.fed[r], toks[k]...)
		if len(d.queue[r]) == 0 {
			d.queue[r] = d.enc(d.loop)
		}
		next[k] = d.queue[r][0]
		d.queue[r] = d.queue[r][1:]
	}
	return next, make([]float32, len(rows)), nil
}

// router.on_repeat = "close": a loop inside a tag ends with the tag closed
// by the environment (mask 0, counted in Closed) and the turn acts on what
// was written before the loop; the cache is fed every token of the
// response, the closing tags included; a loop outside every tag ends the
// turn early; the decoder need not ban tokens.
func TestOnRepeatClose(t *testing.T) {
	tok := loadTok(t)
	pool := simPool(t, 0)
	q := llmpool.Question{ID: "nq/1", Dataset: "nq", Text: "q?", Golden: []string{"foo"}}
	eos := []int32{int32(tok.EOS())}
	for _, c := range []struct {
		name                string
		prefix, loop, after string
		onRepeat            string
		end, text, query    string
		closed              int
	}{
		{"answer", "<think>a</think><answer> foo bar", " foo bar", "", OnRepeatClose,
			"answer", "<think>a</think><answer> foo bar foo bar</answer>", "", 1},
		{"search, then an answer", "<think>a</think><search>sim-a: foo bar", " foo bar", "<answer> foo</answer>", OnRepeatClose,
			"answer", "<think>a</think><search>sim-a: foo bar foo bar</search>", "foo bar foo bar", 1},
		{"think, and the turn goes on", "<think> a b", " a b", "<answer> foo</answer>", OnRepeatClose,
			"answer", "<think> a b a b</think><answer> foo</answer>", "", 1},
		{"outside every tag", "<think>a</think>", " x y", "", OnRepeatClose,
			"length", "<think>a</think> x y x y", "", 0},
		{"ban (a decoder that ignores bans loops on)", "<think>a</think><answer> foo bar", " foo bar", "", "",
			"length", "", "", 0},
	} {
		dec := &stubborn{tok: tok, prefix: c.prefix, loop: c.loop, after: c.after, queue: map[int][]int32{}, fed: map[int][]int32{}}
		cfg := Config{MaxTurns: 1, TurnTokens: 40, InfoTokens: 32, NoRepeatNGram: 3, OnRepeat: c.onRepeat}
		var d Decoder = freshRows{dec}
		if c.onRepeat != OnRepeatClose {
			d = freshRows{&banIgnored{dec}}
		}
		e, err := NewScheduler(d, tok, pool, cfg, SchedulerOptions{Rows: 1, EOS: eos, Seed: 1})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		p, err := e.Submit(context.Background(), Job{Question: q, Prompt: []int32{1, 2, 3}}, RowOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.drain(context.Background()); err != nil {
			t.Fatal(err)
		}
		o, err := p.Result()
		if err != nil {
			t.Fatal(err)
		}
		if o.End != c.end || !strings.HasPrefix(o.Text, c.text) || o.Closed != c.closed {
			t.Errorf("%s: end %q closed %d text %q, want %q %d %q…", c.name, o.End, o.Closed, o.Text, c.end, c.closed, c.text)
		}
		if c.query != "" && (len(o.Calls) != 1 || o.Calls[0].Query != c.query) {
			t.Errorf("%s: calls %+v, want one with query %q", c.name, o.Calls, c.query)
		}
		if c.end == "length" && c.onRepeat == OnRepeatClose && len(o.Tokens) >= cfg.TurnTokens {
			t.Errorf("%s: the loop ran to the turn's limit (%d tokens)", c.name, len(o.Tokens))
		}
		// Policy tokens are the decoder's choices, closing tags are not.
		var inserted int
		for _, m := range o.Mask {
			if m == 0 {
				inserted++
			}
		}
		if c.closed > 0 && inserted < len(tok.Encode(ThinkClose)) {
			t.Errorf("%s: %d inserted tokens, want the closing tag's at least", c.name, inserted)
		}
		// The cache holds the prompt and the response in order, at least
		// up to its last policy token (the closing tags before it included).
		all := append([]int32{1, 2, 3}, o.Tokens...)
		last := slices.Index(o.Mask, 1)
		for k, m := range o.Mask {
			if m == 1 {
				last = k
			}
		}
		if got := dec.fed[0]; len(got) < 3+last || !slices.Equal(got, all[:len(got)]) {
			t.Errorf("%s: the row was fed %v, want the prompt and the response %v up to token %d", c.name, got, all, last)
		}
	}
}

// banIgnored takes bans and ignores them, as a looping policy whose every
// alternative continues the loop would.
type banIgnored struct{ *stubborn }

func (b *banIgnored) ExtendBanned(ctx context.Context, rows []int, toks [][]int32, s generate.Sampling, seed uint64, _ [][]int32) ([]int32, []float32, error) {
	return b.Extend(ctx, rows, toks, s, seed)
}

func TestOnRepeatValidate(t *testing.T) {
	for v, ok := range map[string]bool{"": true, "ban": true, "close": true, "stop": false} {
		c := DefaultConfig()
		c.OnRepeat = v
		if err := c.Validate(); (err == nil) != ok {
			t.Errorf("on_repeat = %q: error %v", v, err)
		}
	}
}
