package router

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/recal-project/recal/internal/generate"
	"github.com/recal-project/recal/llmpool"
)

// wishful writes a search turn, then (after the reply) the answer turn it
// wants. A token it wants that is banned is replaced by the closing tag
// when that is allowed, else the lowest allowed id goes before it. It records the bans
// of every step after the reply.
type wishful struct {
	tok          Tokenizer
	vocab        int
	first, later string
	second       string // when set: written after the first reply, later after the next
	queue        map[int][]int32
	fed          map[int]int
	bans         [][]int32
}

func (w *wishful) enc(s string) []int32 { return toInt32(w.tok.Encode(s)) }

func (w *wishful) Vocab() int { return w.vocab }

func (w *wishful) Extend(ctx context.Context, rows []int, toks [][]int32, s generate.Sampling, seed uint64) ([]int32, []float32, error) {
	return w.ExtendBanned(ctx, rows, toks, s, seed, make([][]int32, len(rows)))
}

func (w *wishful) ExtendBanned(_ context.Context, rows []int, toks [][]int32, _ generate.Sampling, _ uint64, ban [][]int32) ([]int32, []float32, error) {
	next := make([]int32, len(rows))
	for k, r := range rows {
		switch {
		case w.fed[r] == 0:
			w.queue[r] = w.enc(w.first)
		case len(toks[k]) > 1 && w.second != "": // the first reply's block
			w.queue[r], w.second = w.enc(w.second), ""
		case len(toks[k]) > 1: // the reply's block
			w.queue[r] = w.enc(w.later)
		}
		w.fed[r] += len(toks[k])
		if len(w.queue[r]) == 0 {
			w.queue[r] = w.enc(" x")
		}
		if w.fed[r] > 3 && len(toks[k]) > 0 {
			w.bans = append(w.bans, ban[k])
		}
		if slices.Contains(ban[k], w.queue[r][0]) {
			if c := w.enc(AnswerClose); !slices.Contains(ban[k], c[0]) {
				w.queue[r] = c
			} else {
				for id := range w.vocab { // the lowest allowed, then what it wanted
					if !slices.Contains(ban[k], int32(id)) {
						w.queue[r] = append([]int32{int32(id)}, w.queue[r]...)
						break
					}
				}
			}
		}
		next[k] = w.queue[r][0]
		w.queue[r] = w.queue[r][1:]
	}
	return next, make([]float32, len(rows)), nil
}

// router.answer_span: after a reply, the answer is cut to the longest span
// of the reply the policy's wished answer starts with, then closed; the
// first token of a word the reply lacks is banned, the reply's are not;
// without a reply, or with the setting off, the answer is the policy's own.
func TestAnswerSpan(t *testing.T) {
	tok := loadTok(t)
	pool := simPool(t, 0)
	q := llmpool.Question{ID: "nq/1", Dataset: "nq", Text: "capital of France?", Golden: []string{"Paris"}}
	eos := []int32{int32(tok.EOS())}
	search := "<think>a</think><search>sim-a: capital of France?</search>"
	for _, c := range []struct {
		name         string
		span         bool
		first, later string
		answer       string
	}{
		{"off: the policy's miscopy", false, search, "<answer> Parisian Paris</answer>", "Parisian Paris"},
		{"on: cut to the reply's span", true, search, "<answer> Parisian Paris</answer>", "Paris"},
		{"on: a right copy is kept", true, search, "<answer> Paris</answer>", "Paris"},
		{"on: no reply, no constraint", true, "<think>a</think><answer> Lyon</answer>", "", "Lyon"},
	} {
		dec := &wishful{tok: tok, vocab: tok.VocabSize(), first: c.first, later: c.later, queue: map[int][]int32{}, fed: map[int]int{}}
		cfg := Config{MaxTurns: 1, TurnTokens: 40, InfoTokens: 32, AnswerSpan: c.span}
		out, _, err := Rollout(context.Background(), dec, tok, pool, cfg, []Job{{Question: q, Prompt: []int32{1, 2, 3}}}, generate.Sampling{}, eos, 1)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		a, _ := LastAnswer(out[0].Text)
		if strings.TrimSpace(a) != c.answer {
			t.Errorf("%s: answer %q (response %q), want %q", c.name, a, out[0].Text, c.answer)
		}
		if !c.span || c.later == "" {
			for _, b := range dec.bans {
				if len(b) > 0 {
					t.Errorf("%s: %d tokens banned", c.name, len(b))
				}
			}
			continue
		}
		// The answer's first step: " Paris" allowed, " London" and the
		// closing tag (no word yet) banned.
		var firstBan []int32
		for _, b := range dec.bans {
			if len(b) > 0 {
				firstBan = b
				break
			}
		}
		paris, london, closing := tok.Encode(" Paris")[0], tok.Encode(" London")[0], tok.Encode(AnswerClose)[0]
		if firstBan == nil || slices.Contains(firstBan, int32(paris)) || !slices.Contains(firstBan, int32(london)) || !slices.Contains(firstBan, int32(closing)) {
			t.Errorf("%s: first answer step bans %d tokens: \" Paris\" %v, \" London\" %v, closing %v", c.name, len(firstBan),
				slices.Contains(firstBan, int32(paris)), slices.Contains(firstBan, int32(london)), slices.Contains(firstBan, int32(closing)))
		}
	}
	// A decoder that cannot ban, or does not know its vocabulary, is
	// refused up front.
	_, _, err := Rollout(context.Background(), &forced{tok: tok}, tok, pool, Config{MaxTurns: 1, TurnTokens: 8, InfoTokens: 8, AnswerSpan: true},
		[]Job{{Question: q, Prompt: []int32{1, 2, 3}}}, generate.Sampling{}, eos, 1)
	if err == nil || !strings.Contains(err.Error(), "answer_span") {
		t.Fatalf("a decoder without bans: error %v", err)
	}
}

// router.search_names: a search naming a model the pool lacks is written
// as one it has (the name is built of allowed tokens up to the colon, the
// sub-query is the policy's); without it the call goes to the unknown name.
// router.answer_whole: a reply that states a short answer offers only
// that answer, whole. The answer's first token must start it (the reply's
// other words, " answer", are banned, which plain answer_span allows), and
// the closing tag waits for its last word (after " Gerald" it is banned,
// which answer_span allows at any word's end).
func TestAnswerWhole(t *testing.T) {
	tok := loadTok(t)
	pool := simPool(t, 0)
	q := llmpool.Question{ID: "nq/1", Dataset: "nq", Text: "which president pardoned Nixon?", Golden: []string{"Gerald R. Ford"}}
	eos := []int32{int32(tok.EOS())}
	search := "<think>a</think><search>sim-a: which president pardoned Nixon?</search>"
	answer, gerald, closing := int32(tok.Encode(" answer")[0]), int32(tok.Encode(" Gerald")[0]), int32(tok.Encode(AnswerClose)[0])
	for _, whole := range []bool{false, true} {
		dec := &wishful{tok: tok, vocab: tok.VocabSize(), first: search, later: "<answer> Gerald R. Ford</answer>", queue: map[int][]int32{}, fed: map[int]int{}}
		cfg := Config{MaxTurns: 1, TurnTokens: 40, InfoTokens: 32, AnswerSpan: true, AnswerWhole: whole}
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		out, _, err := Rollout(context.Background(), dec, tok, pool, cfg, []Job{{Question: q, Prompt: []int32{1, 2, 3}}}, generate.Sampling{}, eos, 1)
		if err != nil {
			t.Fatal(err)
		}
		if a, _ := LastAnswer(out[0].Text); strings.TrimSpace(a) != "Gerald R. Ford" {
			t.Errorf("whole %v: answer %q (response %q), want the whole answer copied", whole, a, out[0].Text)
		}
		var bans [][]int32 // the answer's steps: before " Gerald", after it
		for _, b := range dec.bans {
			if len(b) > 0 {
				bans = append(bans, b)
			}
		}
		if len(bans) < 2 {
			t.Fatalf("whole %v: %d constrained steps, want the answer's", whole, len(bans))
		}
		if slices.Contains(bans[0], gerald) || slices.Contains(bans[0], answer) != whole || slices.Contains(bans[1], closing) != whole {
			t.Errorf("whole %v: first step bans \" Gerald\" %v, \" answer\" %v; after \" Gerald\" the closing tag %v: want %v, %v, %v",
				whole, slices.Contains(bans[0], gerald), slices.Contains(bans[0], answer), slices.Contains(bans[1], closing), false, whole, whole)
		}
	}
	if err := (Config{MaxTurns: 1, TurnTokens: 8, InfoTokens: 8, AnswerWhole: true}).Validate(); err == nil || !strings.Contains(err.Error(), "router.answer_whole") {
		t.Errorf("answer_whole without answer_span: %v, want an error naming router.answer_whole", err)
	}
}

func TestSearchNames(t *testing.T) {
	tok := loadTok(t)
	pool := simPool(t, 0)
	q := llmpool.Question{ID: "nq/1", Dataset: "nq", Text: "capital of France?", Golden: []string{"Paris"}}
	eos := []int32{int32(tok.EOS())}
	for _, on := range []bool{false, true} {
		dec := &wishful{tok: tok, vocab: tok.VocabSize(), first: "<think>a</think><search>sim-c: capital of France?</search>",
			later: "<answer> Paris</answer>", queue: map[int][]int32{}, fed: map[int]int{}}
		cfg := Config{MaxTurns: 1, TurnTokens: 40, InfoTokens: 32, SearchNames: on}
		out, _, err := Rollout(context.Background(), dec, tok, pool, cfg, []Job{{Question: q, Prompt: []int32{1, 2, 3}}}, generate.Sampling{}, eos, 1)
		if err != nil {
			t.Fatal(err)
		}
		calls := out[0].Calls
		if len(calls) != 1 {
			t.Fatalf("search_names=%v: %d calls, want 1 (response %q)", on, len(calls), out[0].Text)
		}
		if known := calls[0].Model == "sim-a" || calls[0].Model == "sim-b"; known != on || calls[0].Unknown == on {
			t.Errorf("search_names=%v: the call went to %q (unknown %v); response %q", on, calls[0].Model, calls[0].Unknown, out[0].Text)
		}
		// The name's tokens, and no others, are listed as constrained.
		var name string
		for _, j := range out[0].Constrained {
			if out[0].Mask[j] != 1 {
				t.Errorf("search_names=%v: constrained token %d has mask %v, want a policy token", on, j, out[0].Mask[j])
			}
			name += string(tok.TokenBytes(int(out[0].Tokens[j])))
		}
		if want := calls[0].Model; on && !strings.Contains(name, strings.TrimPrefix(want, "sim-")) {
			t.Errorf("search_names=%v: the constrained tokens spell %q, want the name %q", on, name, want)
		}
		if !on && len(out[0].Constrained) != 0 {
			t.Errorf("search_names=%v: %d tokens listed as constrained, want none", on, len(out[0].Constrained))
		}
	}
	// A pool that cannot list its models is refused up front.
	if _, err := NewScheduler(freshRows{&wishful{tok: tok, vocab: 10}}, tok, struct{ Pool }{pool}, Config{MaxTurns: 1, TurnTokens: 8, InfoTokens: 8, SearchNames: true},
		SchedulerOptions{Rows: 1, EOS: eos}); err == nil || !strings.Contains(err.Error(), "search_names") {
		t.Fatalf("a pool without Models: error %v", err)
	}
}

func TestWordSpan(t *testing.T) {
	for _, c := range []struct {
		text, span  string
		whole, want bool
	}{
		{"The answer is Mercedes-Benz.", "Mer", false, true},
		{"The answer is Mercedes-Benz.", "Mer", true, false},
		{"The answer is Mercedes-Benz.", "Mercedes", true, true},
		{"The answer is Mercedes-Benz.", "Mercedes-Benz", true, true},
		{"The answer is Mercedes-Benz.", "ercedes", false, false},
		{"The answer is Czech.", "he", false, false},
		{"The answer is Czech.", "Czech.", true, true},
		{"in the southeastern United States", "theastern", false, false},
		{"the east, then theastern", "theastern", true, true}, // a later occurrence at a word start
		{"Hugh S. Johnson", "Hugh S", true, true},
		{"Français", "Fran", true, false},
		{"Français", "Français", true, true},
		{"1812", "18", true, false},
		{"thirty-three thousand", "thirty-", true, false},
		{"thirty-three thousand", "thirty-three", true, true},
		{"", "x", false, false},
		{"The answer is Irān.", "Ir\xc4", false, true}, // a token may end inside "ā" while the span goes on
		{"The answer is Irān.", "Ir\xc4", true, false}, // but the answer may not
		{"The answer is Irān.", "Irān", true, true},
		{"The answer is Irān.", "\x81n", false, false}, // nor start inside it
	} {
		if got := wordSpan(c.text, c.span, c.whole); got != c.want {
			t.Errorf("wordSpan(%q, %q, %v) = %v, want %v", c.text, c.span, c.whole, got, c.want)
		}
	}
}

// wordSpan reads pool replies and what the policy wrote: any bytes. It
// ends, finds only substrings, and a span that ends at a word's end
// (whole) also starts at a word's start (not whole).
func FuzzWordSpan(f *testing.F) {
	f.Add("The answer is Mercedes-Benz.", "Mer", false)
	f.Add("Hugh S. Johnson", "Hugh S", true)
	f.Add("Français", "Fran", true)
	f.Add("", "", true)
	f.Add("ab\xffcd", "\xff", false)
	f.Fuzz(func(t *testing.T, text, span string, whole bool) {
		got := wordSpan(text, span, whole)
		if got && !strings.Contains(text, span) {
			t.Fatalf("wordSpan(%q, %q, %v): true for a span the text does not hold", text, span, whole)
		}
		if whole && got && !wordSpan(text, span, false) {
			t.Fatalf("wordSpan(%q, %q): a whole-word span that does not start at a word", text, span)
		}
		if whole && got && utf8.ValidString(text) && !utf8.ValidString(span) {
			t.Fatalf("wordSpan(%q, %q): a whole-word span that cuts a character", text, span)
		}
	})
}

// preferring follows the first of its scripts that the tokens written so
// far begin and whose next token is not banned (a policy's first choice,
// then its next), and after a reply its answer script. Its first choice
// has probability 0.99; a token chosen because a ban took the first
// choice away, 0.01 (skipped counts those per row).
type preferring struct {
	tok     Tokenizer
	vocab   int
	eos     int32
	scripts []string
	answer  string
	written map[int][]int32
	replied map[int]bool
	queue   map[int][]int32
	skipped map[int]int
}

func (p *preferring) Vocab() int { return p.vocab }

func (p *preferring) Extend(ctx context.Context, rows []int, toks [][]int32, s generate.Sampling, seed uint64) ([]int32, []float32, error) {
	return p.ExtendBanned(ctx, rows, toks, s, seed, make([][]int32, len(rows)))
}

func (p *preferring) ExtendBanned(_ context.Context, rows []int, toks [][]int32, _ generate.Sampling, _ uint64, ban [][]int32) ([]int32, []float32, error) {
	next := make([]int32, len(rows))
	logp := make([]float32, len(rows))
	if p.skipped == nil {
		p.skipped = map[int]int{}
	}
	for k, r := range rows {
		logp[k] = float32(math.Log(0.99))
		if len(toks[k]) > 1 && p.written[r] != nil { // the reply's block
			p.replied[r] = true
			p.queue[r] = toInt32(p.tok.Encode(p.answer))
		}
		if p.written[r] == nil {
			p.written[r] = []int32{}
		}
		next[k] = p.eos
		switch {
		case p.replied[r]:
			if len(p.queue[r]) > 0 {
				next[k], p.queue[r] = p.queue[r][0], p.queue[r][1:]
			}
		default:
			w := p.written[r]
			banned := false // a script of higher preference was banned
			for _, sc := range p.scripts {
				ids := toInt32(p.tok.Encode(sc))
				if len(ids) <= len(w) || !slices.Equal(ids[:len(w)], w) {
					continue
				}
				if slices.Contains(ban[k], ids[len(w)]) {
					banned = true
					continue
				}
				next[k] = ids[len(w)]
				if banned {
					logp[k] = float32(math.Log(0.01))
					p.skipped[r]++
				}
				break
			}
			p.written[r] = append(w, next[k])
		}
	}
	return next, logp, nil
}

// router.call_first: a policy that would answer at once calls first (its
// next choice after "<"), then answers; the tokens chosen under the ban
// are listed as constrained and come before the call's reply. Off, or
// with no call left to make (max_turns = 0), it answers directly.
func TestCallFirst(t *testing.T) {
	tok := loadTok(t)
	pool := simPool(t, 0)
	q := llmpool.Question{ID: "nq/1", Dataset: "nq", Text: "capital of France?", Golden: []string{"Paris"}}
	eos := []int32{int32(tok.EOS())}
	for _, c := range []struct {
		name      string
		on        bool
		maxTurns  int
		wantCalls int
		answer    string
	}{
		{"off", false, 1, 0, "Lyon"},
		{"on", true, 1, 1, "Paris"},
		{"on, no call left", true, 0, 0, "Lyon"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dec := &preferring{tok: tok, vocab: tok.VocabSize(), eos: eos[0],
				scripts: []string{"<think>a</think>\n<answer> Lyon</answer>", "<think>a</think>\n<search>sim-a: capital of France?</search>"},
				answer:  "<answer> Paris</answer>", written: map[int][]int32{}, replied: map[int]bool{}, queue: map[int][]int32{}}
			cfg := Config{MaxTurns: c.maxTurns, TurnTokens: 40, InfoTokens: 32, CallFirst: c.on}
			out, _, err := Rollout(context.Background(), dec, tok, pool, cfg, []Job{{Question: q, Prompt: []int32{1, 2, 3}}}, generate.Sampling{}, eos, 1)
			if err != nil {
				t.Fatal(err)
			}
			s := out[0]
			if len(s.Calls) != c.wantCalls {
				t.Fatalf("%d calls, want %d (response %q)", len(s.Calls), c.wantCalls, s.Text)
			}
			if a, _ := LastAnswer(s.Text); a != c.answer {
				t.Errorf("answer %q, want %q (response %q)", a, c.answer, s.Text)
			}
			if !c.on || c.wantCalls == 0 {
				if len(s.Constrained) != 0 {
					t.Errorf("%d tokens listed as constrained, want none", len(s.Constrained))
				}
				return
			}
			// The ban was on until the reply, and it mattered where it took
			// the policy's first choice away: those tokens, and no other,
			// are constrained, all before the reply's block.
			block := slices.Index(s.Mask, 0)
			want := dec.skipped[0]
			if want == 0 || len(s.Constrained) != want || s.Constrained[len(s.Constrained)-1] >= block {
				t.Errorf("constrained %v, want the %d tokens the ban changed, before the reply (at %d)", s.Constrained, want, block)
			}
			for _, j := range s.Constrained {
				if s.Logp[j] > -guardSlack {
					t.Errorf("token %d (log-prob %v) listed as constrained: its ban moved it by at most %v nats", j, s.Logp[j], guardSlack)
				}
			}
		})
	}
}

// router.final_answer: with no call left, a policy that would think a
// second time and search, or else search, answers after its </think>
// (its third choice), and one that would search without thinking answers
// (its next choice); off, the search ends the response unanswered. While
// a call is left it thinks twice and searches as before.
func TestFinalAnswer(t *testing.T) {
	tok := loadTok(t)
	pool := simPool(t, 0)
	q := llmpool.Question{ID: "nq/1", Dataset: "nq", Text: "capital of France?", Golden: []string{"Paris"}}
	eos := []int32{int32(tok.EOS())}
	thinking := []string{"<think>a</think>\n<think>b</think>\n<search>sim-a: capital of France?</search>",
		"<think>a</think>\n<search>sim-a: capital of France?</search>", "<think>a</think>\n<answer> Lyon</answer>"}
	direct := []string{"<search>sim-a: capital of France?</search>", "<answer> Lyon</answer>"}
	for _, c := range []struct {
		name      string
		on        bool
		maxTurns  int
		scripts   []string
		wantCalls int
		answer    string
		end       string
	}{
		{"off, no call left", false, 0, thinking, 0, "", "final"},
		{"on, no call left", true, 0, thinking, 0, "Lyon", "answer"},
		{"off, no call left, no thought", false, 0, direct, 0, "", "final"},
		{"on, no call left, no thought", true, 0, direct, 0, "Lyon", "answer"},
		{"on, a call left", true, 1, thinking, 1, "Paris", "answer"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dec := &preferring{tok: tok, vocab: tok.VocabSize(), eos: eos[0], scripts: c.scripts,
				answer: "<answer> Paris</answer>", written: map[int][]int32{}, replied: map[int]bool{}, queue: map[int][]int32{}}
			cfg := Config{MaxTurns: c.maxTurns, TurnTokens: 40, InfoTokens: 32, FinalAnswer: c.on}
			out, _, err := Rollout(context.Background(), dec, tok, pool, cfg, []Job{{Question: q, Prompt: []int32{1, 2, 3}}}, generate.Sampling{}, eos, 1)
			if err != nil {
				t.Fatal(err)
			}
			s := out[0]
			a, _ := LastAnswer(s.Text)
			if len(s.Calls) != c.wantCalls || a != c.answer || s.End != c.end {
				t.Errorf("%d calls, answer %q, end %q; want %d, %q, %q (response %q)", len(s.Calls), a, s.End, c.wantCalls, c.answer, c.end, s.Text)
			}
			if !c.on || c.maxTurns > 0 {
				if len(s.Constrained) != 0 || dec.skipped[0] != 0 {
					t.Errorf("constrained %v, %d choices taken away; want none", s.Constrained, dec.skipped[0])
				}
			} else if dec.skipped[0] == 0 || len(s.Constrained) == 0 {
				t.Errorf("constrained %v, %d choices taken away; want the ban's", s.Constrained, dec.skipped[0])
			}
		})
	}
}

// router.match_close: a policy that would close <think> with </answer>
// writes </think> (its next choice) and goes on to call; off, its turn
// ends with no action. The guard leaves router.on_repeat = "close" its
// work: a sub-query that loops is still closed and called.
func TestMatchClose(t *testing.T) {
	tok := loadTok(t)
	pool := simPool(t, 0)
	q := llmpool.Question{ID: "nq/1", Dataset: "nq", Text: "capital of France?", Golden: []string{"Paris"}}
	eos := []int32{int32(tok.EOS())}
	search := "<think>a</think>\n<search>sim-a: capital of France?</search>"
	for _, c := range []struct {
		name      string
		on        bool
		scripts   []string
		ngram     int
		wantCalls int
		closed    int
	}{
		{"off", false, []string{"<think>a</answer>", search}, 0, 0, 0},
		{"on", true, []string{"<think>a</answer>", search}, 0, 1, 0},
		{"on, a looping sub-query", true, []string{"<think>a</think>\n<search>sim-a: la la la la la la la la la la la la"}, 3, 1, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			dec := &preferring{tok: tok, vocab: tok.VocabSize(), eos: eos[0], scripts: c.scripts,
				answer: "<answer> Paris</answer>", written: map[int][]int32{}, replied: map[int]bool{}, queue: map[int][]int32{}}
			cfg := Config{MaxTurns: 1, TurnTokens: 40, InfoTokens: 32, MatchClose: c.on, NoRepeatNGram: c.ngram, OnRepeat: OnRepeatClose}
			out, _, err := Rollout(context.Background(), dec, tok, pool, cfg, []Job{{Question: q, Prompt: []int32{1, 2, 3}}}, generate.Sampling{}, eos, 1)
			if err != nil {
				t.Fatal(err)
			}
			s := out[0]
			if len(s.Calls) != c.wantCalls || s.Closed != c.closed {
				t.Fatalf("%d calls and %d closed tags, want %d and %d (response %q)", len(s.Calls), s.Closed, c.wantCalls, c.closed, s.Text)
			}
			if c.wantCalls == 1 && !strings.Contains(s.Text, "<think>a</think>") {
				t.Errorf("response %q, want <think> closed by its own tag", s.Text)
			}
			if a, _ := LastAnswer(s.Text); c.wantCalls == 1 && a != "Paris" {
				t.Errorf("answer %q, want Paris (response %q)", a, s.Text)
			}
		})
	}
}

// A budget refusal's notice is no reply: with router.answer_span the
// answer is a span of the replies the policy was shown, never of the
// notice.
func TestAnswerSpanSkipsRefusals(t *testing.T) {
	tok := loadTok(t)
	pool := pricedPool(t, nil, "sim-a")
	q := llmpool.Question{ID: "nq/1", Dataset: "nq", Text: "capital of France?", Golden: []string{"Paris"}}
	search := "<think>a</think><search>sim-a: capital of France?</search>"
	dec := &wishful{tok: tok, vocab: tok.VocabSize(), first: search, second: search, later: "<answer> the cost budget is spent</answer>",
		queue: map[int][]int32{}, fed: map[int]int{}}
	cfg := Config{MaxTurns: 2, TurnTokens: 40, InfoTokens: 32, AnswerSpan: true}
	out, _, err := Rollout(context.Background(), dec, tok, pool, cfg, []Job{{Question: q, Prompt: []int32{1, 2, 3}, MaxCostUSD: 1e-12}},
		generate.Sampling{}, []int32{int32(tok.EOS())}, 1)
	if err != nil {
		t.Fatal(err)
	}
	o := out[0]
	if len(o.Calls) != 2 || o.Calls[0].Refused || !o.Calls[1].Refused {
		t.Fatalf("calls %+v, want one made and one refused", o.Calls)
	}
	a, _ := LastAnswer(o.Text)
	if a = strings.TrimSpace(a); a == "" || strings.Contains(a, "budget") || !strings.Contains(o.Calls[0].Reply, a) {
		t.Errorf("answer %q (response %q), want a span of the reply %q, none of the notice", a, o.Text, o.Calls[0].Reply)
	}
}
