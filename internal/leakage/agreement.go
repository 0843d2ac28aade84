package leakage

import (
	"fmt"
	"io"
	"strings"

	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/outcomes"
	"github.com/recal-project/recal/llmpool"
)

// A policy that calls two models sees two replies, and whether they agree
// is evidence of its own: a cascade stops when they do. A renderer can leak
// through agreement while each reply alone hides the judgment: if a wrong
// reply never states the right answer, a right and a wrong reply never
// agree, where real replies sometimes do. Agreement measures it.

// Agreement is how often model A's answer occurs in model B's reply, per
// pair of judgments, on the questions where both are judged and have reply
// text.
type Agreement struct {
	A, B string
	// Cells are (A right, B right) = (true, true), (true, false),
	// (false, true), (false, false).
	Cells [4]AgreementCell `json:"cells"`
}

// AgreementCell is one pair of judgments.
type AgreementCell struct {
	ARight, BRight bool
	N              int     `json:"n"`
	Rendered       float64 `json:"rendered"` // share of the N where A's rendered answer occurs in B's rendered reply
	Logged         float64 `json:"logged"`   // the same on the logged replies
}

// CheckAgreement measures Agreement of models a and b of log l under
// render. A's answer is, rendered, the text after the last "answer is" of
// its rendered reply (as eval extracts it); logged, its first stated answer
// (llmpool.StatedAnswers), or its whole reply when it states none. It
// "occurs" in B's reply when its normalised text is found there as whole
// words (data.Mentions).
func CheckAgreement(l *outcomes.Log, render func(outcomes.Row) string, a, b string) (Agreement, error) {
	ag := Agreement{A: a, B: b}
	for c := range ag.Cells {
		ag.Cells[c].ARight, ag.Cells[c].BRight = c < 2, c%2 == 0
	}
	var agreeR, agreeL [4]int
	for _, q := range l.Questions() {
		x, ok1 := l.Lookup(q, a)
		y, ok2 := l.Lookup(q, b)
		if !ok1 || !ok2 || x.Correct == nil || y.Correct == nil || x.Reply == nil || y.Reply == nil {
			continue
		}
		c := 0
		if !*x.Correct {
			c += 2
		}
		if !*y.Correct {
			c++
		}
		ag.Cells[c].N++
		if data.Mentions(render(y), afterAnswerIs(render(x))) {
			agreeR[c]++
		}
		stated := *x.Reply
		if s := llmpool.StatedAnswers(*x.Reply, x.Question); len(s) > 0 {
			stated = s[0]
		}
		if data.Mentions(*y.Reply, stated) {
			agreeL[c]++
		}
	}
	total := 0
	for c := range ag.Cells {
		if n := ag.Cells[c].N; n > 0 {
			ag.Cells[c].Rendered, ag.Cells[c].Logged = float64(agreeR[c])/float64(n), float64(agreeL[c])/float64(n)
		}
		total += ag.Cells[c].N
	}
	if total == 0 {
		return ag, fmt.Errorf("%w in %s: no question where %s and %s are both judged and have reply text", ErrTooFew, l.Name, a, b)
	}
	return ag, nil
}

// afterAnswerIs is the text after the last "answer is" of s, without a
// final period (eval.ExtractAnswer's reading of a template reply).
func afterAnswerIs(s string) string {
	if k := strings.LastIndex(strings.ToLower(s), "answer is"); k >= 0 {
		s = s[k+len("answer is"):]
	}
	return strings.TrimSuffix(strings.TrimSpace(s), ".")
}

// Format writes the agreement table.
func (ag Agreement) Format(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s's answer in %s's reply\n", ag.A, ag.B)
	fmt.Fprintf(&b, "%-22s %6s %10s %8s\n", "judged", "n", "rendered", "logged")
	for _, c := range ag.Cells {
		fmt.Fprintf(&b, "%-22s %6d %10.3f %8.3f\n", fmt.Sprintf("%s %s, %s %s", ag.A, rw(c.ARight), ag.B, rw(c.BRight)), c.N, c.Rendered, c.Logged)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func rw(right bool) string {
	if right {
		return "right"
	}
	return "wrong"
}
