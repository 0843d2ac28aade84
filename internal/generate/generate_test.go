package generate_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/recal-project/recal/internal/generate"
)

// scripted is a Decoder that replays fixed continuations per row, recording
// what it was fed, so Run's stopping and feeding logic can be checked exactly.
type scripted struct {
	script map[int][]int32
	fed    map[int][][]int32
	pos    map[int]int
	seeds  []uint64
}

func (s *scripted) Extend(_ context.Context, rows []int, toks [][]int32, _ generate.Sampling, seed uint64) ([]int32, []float32, error) {
	s.seeds = append(s.seeds, seed)
	next := make([]int32, len(rows))
	lp := make([]float32, len(rows))
	for j, r := range rows {
		s.fed[r] = append(s.fed[r], toks[j])
		k := s.pos[r]
		if k >= len(s.script[r]) {
			return nil, nil, fmt.Errorf("row %d asked for token %d beyond its script", r, k)
		}
		next[j] = s.script[r][k]
		lp[j] = -float32(k)
		s.pos[r] = k + 1
	}
	return next, lp, nil
}

// letters maps token i to the i-th byte of the alphabet below.
type letters string

func (l letters) TokenBytes(id int) []byte { return []byte{l[id]} }

func TestRunStops(t *testing.T) {
	const alpha = "abcdefghijklmnopqrstuvwxyz<>/ "
	tok := letters(alpha)
	enc := func(s string) []int32 {
		out := make([]int32, len(s))
		for i := range s {
			for j := range alpha {
				if alpha[j] == s[i] {
					out[i] = int32(j)
				}
			}
		}
		return out
	}
	dec := &scripted{
		script: map[int][]int32{
			0: enc("hi </s> more"),         // stop string inside
			1: append(enc("ab"), 25, 1, 1), // EOS (token 25 = 'z')
			2: enc("abcdefgh"),             // token limit
		},
		fed: map[int][][]int32{}, pos: map[int]int{},
	}
	reqs := []generate.Request{
		{Row: 0, Prompt: enc("p"), MaxNewTokens: 50, Stop: []string{"</s>", "</x>"}},
		{Row: 1, Prompt: enc("qq"), MaxNewTokens: 50, EOS: []int32{25}},
		{Row: 2, Prompt: enc("r"), MaxNewTokens: 5},
	}
	out, err := generate.Run(context.Background(), dec, tok, reqs, generate.Sampling{}, 100)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		row    int
		text   string
		reason string
		ntok   int
	}{
		{0, "hi </s>", generate.StopString, 7},
		{1, "ab", generate.StopEOS, 3},
		{2, "abcde", generate.StopLength, 5},
	}
	for _, c := range cases {
		o := out[c.row]
		if string(o.Text) != c.text || o.Reason != c.reason || len(o.Tokens) != c.ntok || len(o.Logp) != c.ntok {
			t.Errorf("row %d: text %q reason %s tokens %d, want %q %s %d", c.row, o.Text, o.Reason, len(o.Tokens), c.text, c.reason, c.ntok)
		}
	}
	// The prompt goes in first, then each sampled token is fed back once.
	if got := dec.fed[1]; len(got) != 3 || len(got[0]) != 2 || got[1][0] != enc("a")[0] || got[2][0] != enc("b")[0] {
		t.Errorf("row 1 was fed %v, want prompt then a, b", got)
	}
	// Seeds advance per step so that sampling differs between steps.
	for i, s := range dec.seeds {
		if s != 100+uint64(i) {
			t.Fatalf("step %d used seed %d, want %d", i, s, 100+i)
		}
	}
}

func TestRunRejectsEmptyPrompt(t *testing.T) {
	_, err := generate.Run(context.Background(), &scripted{}, letters("a"), []generate.Request{{MaxNewTokens: 3}}, generate.Sampling{}, 0)
	if err == nil {
		t.Fatal("want an error for an empty prompt")
	}
}
