package leakage

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/recal-project/recal/internal/outcomes"
	"github.com/recal-project/recal/llmpool"
)

const evounaLog = "../../data/outcomes/evouna/outcomes.jsonl.gz"

// renderV2 is the replay rule of llmpool.ReplayVersion 2, kept here to show
// that the check catches it: a right reply became "The answer is G.", a
// wrong one kept the model's prose, or read "I don't know." without it.
func renderV2(row outcomes.Row) string {
	if row.Reply != nil && (row.Correct == nil || !*row.Correct) {
		return *row.Reply
	}
	if row.Correct != nil && *row.Correct {
		reply := ""
		if row.Reply != nil {
			reply = *row.Reply
		}
		return "The answer is " + llmpool.SpokenGolden(row.Golden, reply) + "."
	}
	return "I don't know."
}

func readEVOUNA(t *testing.T) *outcomes.Log {
	t.Helper()
	if testing.Short() {
		t.Skip("reads and classifies the 27,547 rows of the EVOUNA log (seconds)")
	}
	l, err := outcomes.ReadFile(evounaLog)
	if err != nil {
		t.Fatalf("the vendored EVOUNA log: %v", err)
	}
	return l
}

// On the EVOUNA world the rendered replies tell the classifier no more
// about the judgment than the logged replies do, while the rule of replay
// version 2 gave the judgment away.
func TestEVOUNARendersWithoutLeaking(t *testing.T) {
	l := readEVOUNA(t)
	r := llmpool.NewReplayRenderer(l)
	now, err := Check(l, func(row outcomes.Row) string { return r.Text(row, llmpool.RenderJudgment) }, Options{})
	if err != nil {
		t.Fatal(err)
	}
	old, err := Check(l, renderV2, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("rendered AUC %.3f, logged text AUC %.3f (%d held-out rows), rendered on those rows %.3f; replay version 2: %.3f",
		now.Rendered, *now.Logged, now.LoggedRows, *now.RenderedOnLogged, old.Rendered)
	if *now.RenderedOnLogged > *now.Logged+0.02 {
		t.Errorf("rendered replies' AUC %.3f is more than 0.02 above the logged text's %.3f: the rendering tells the policy the judgment",
			*now.RenderedOnLogged, *now.Logged)
	}
	if old.Rendered < 0.95 {
		t.Errorf("replay version 2's AUC %.3f, want near 1: the check must catch a renderer whose right replies read \"The answer is G.\" and wrong ones do not", old.Rendered)
	}
}

// A log of judgments only: right and wrong answers are both golden answers
// of the log, so their form says nothing. The AUC falls below 0.5, not to
// it: the classifier remembers strings that were right on training
// questions and meets them as other questions' wrong answers
// (docs/outcomes.md, "Leakage"); the acceptance bound is 0.55.
func TestJudgmentOnlyLog(t *testing.T) {
	l := readEVOUNA(t)
	var rows []outcomes.Row
	seen := map[string]bool{}
	for _, row := range l.Rows {
		if row.Correct == nil {
			continue
		}
		if !seen[row.QuestionID] && len(seen) == 800 {
			continue
		}
		seen[row.QuestionID] = true
		row.Reply = nil
		rows = append(rows, row)
	}
	var b strings.Builder
	if err := outcomes.Write(&b, rows); err != nil {
		t.Fatal(err)
	}
	small, err := outcomes.Read(strings.NewReader(b.String()), "judgment-only.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	r := llmpool.NewReplayRenderer(small)
	rep, err := Check(small, func(row outcomes.Row) string { return r.Text(row, llmpool.RenderJudgment) }, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("judgment-only log: %d rows, %d held out, AUC %.3f", rep.Rows, rep.Test, rep.Rendered)
	if rep.Rendered > 0.55 {
		t.Errorf("AUC %.3f on a log without reply text, want <= 0.55: a wrong answer must not be told from a right one by its form", rep.Rendered)
	}
	if rep.Logged != nil || rep.LoggedRows != 0 {
		t.Errorf("logged AUC %v over %d rows, want none: the log has no reply text", rep.Logged, rep.LoggedRows)
	}
	old, err := Check(small, renderV2, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if old.Rendered < 0.99 {
		t.Errorf("replay version 2 on a judgment-only log: AUC %.3f, want 1 (\"I don't know.\" marks every wrong reply)", old.Rendered)
	}
}

func TestAUC(t *testing.T) {
	cases := []struct {
		name   string
		scores []float64
		labels []bool
		want   float64
	}{
		{"perfect", []float64{0.1, 0.2, 0.8, 0.9}, []bool{false, false, true, true}, 1},
		{"reversed", []float64{0.9, 0.8, 0.2, 0.1}, []bool{false, false, true, true}, 0},
		{"all tied", []float64{1, 1, 1, 1}, []bool{false, true, false, true}, 0.5},
		{"one swap of four pairs", []float64{0.1, 0.5, 0.4, 0.9}, []bool{false, false, true, true}, 0.75},
		{"tie across classes", []float64{0.1, 0.5, 0.5}, []bool{false, false, true}, 0.75},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := AUC(c.scores, c.labels); math.Abs(got-c.want) > 1e-12 {
				t.Errorf("AUC = %v, want %v (Mann–Whitney, ties one half)", got, c.want)
			}
		})
	}
	if got := AUC([]float64{1, 2}, []bool{true, true}); !math.IsNaN(got) {
		t.Errorf("AUC of one class = %v, want NaN", got)
	}
}

// smallLog is a log whose right replies say "yes" and wrong ones "no": any
// classifier separates them.
func smallLog(t *testing.T, n int) *outcomes.Log {
	t.Helper()
	var b strings.Builder
	for i := range n {
		reply, correct := "no, it is not", "false"
		if i%2 == 0 {
			reply, correct = "yes indeed", "true"
		}
		b.WriteString(`{"dataset":"nq","question_id":"nq/` + itoa(i) + `","question":"q","golden_answers":["a"],"model":"m","reply":"` + reply + `","correct":` + correct + "}\n")
	}
	l, err := outcomes.Read(strings.NewReader(b.String()), "small.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestCheckSeparatesAndIsDeterministic(t *testing.T) {
	l := smallLog(t, 200)
	logged := func(row outcomes.Row) string { return *row.Reply }
	a, err := Check(l, logged, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if a.Rendered != 1 || a.Logged == nil || *a.Logged != 1 {
		t.Errorf("AUC %v / logged %v, want 1: \"yes\" and \"no\" replies are told apart by their text", a.Rendered, a.Logged)
	}
	if a.Test == 0 || a.Train == 0 || a.Test+a.Train != 200 {
		t.Errorf("split %d + %d, want every one of the 200 judged rows on one side", a.Train, a.Test)
	}
	constant := func(outcomes.Row) string { return "The answer is x." }
	b, err := Check(l, constant, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if b.Rendered != 0.5 {
		t.Errorf("AUC %v of a renderer that writes one text for every row, want 0.5", b.Rendered)
	}
	again, _ := Check(l, logged, Options{})
	if again.Rendered != a.Rendered || again.Test != a.Test {
		t.Errorf("two checks of one log differ: %+v vs %+v", again, a)
	}
}

func TestCheckErrors(t *testing.T) {
	one := smallLog(t, 1)
	logged := func(row outcomes.Row) string { return *row.Reply }
	cases := []struct {
		name string
		l    *outcomes.Log
		opt  Options
		want string
		is   error
	}{
		{"one row", one, Options{}, "small.jsonl", ErrTooFew},
		{"test share 1", smallLog(t, 50), Options{TestShare: 1}, "test share 1", nil},
		{"negative test share", smallLog(t, 50), Options{TestShare: -0.2}, "test share -0.2", nil},
		{"NaN test share", smallLog(t, 50), Options{TestShare: math.NaN()}, "test share NaN", nil},
		{"n-grams", smallLog(t, 50), Options{MinN: 3, MaxN: 2}, "n-gram lengths 3..2", nil},
		{"bits", smallLog(t, 50), Options{Bits: 40}, "feature bits 40", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Check(c.l, logged, c.opt)
			if err == nil || !strings.Contains(err.Error(), c.want) || (c.is != nil && !errors.Is(err, c.is)) {
				t.Fatalf("error %v, want one naming %q", err, c.want)
			}
		})
	}
}

// Agreement sees what one reply at a time cannot: a rendered wrong reply
// never states the golden answer, so it never agrees with a right one,
// while real wrong replies often name the right answer beside their own
// (docs/evaluation.md, "The cascade baseline").
func TestAgreementShowsWhatOneReplyHides(t *testing.T) {
	l := readEVOUNA(t)
	r := llmpool.NewReplayRenderer(l)
	ag, err := CheckAgreement(l, func(row outcomes.Row) string { return r.Text(row, llmpool.RenderJudgment) }, "chatgpt", "gpt4")
	if err != nil {
		t.Fatal(err)
	}
	rightWrong := ag.Cells[1]
	if !rightWrong.ARight || rightWrong.BRight || rightWrong.N < 100 {
		t.Fatalf("cell 1 is %+v, want chatgpt right and gpt4 wrong over 100+ questions", rightWrong)
	}
	if rightWrong.Rendered != 0 || rightWrong.Logged < 0.1 {
		t.Errorf("chatgpt right, gpt4 wrong: agreement rendered %.3f, logged %.3f; want 0 rendered (a wrong answer never matches a golden one) and at least 0.1 logged",
			rightWrong.Rendered, rightWrong.Logged)
	}
	if _, err := CheckAgreement(l, func(row outcomes.Row) string { return r.Text(row, llmpool.RenderJudgment) }, "chatgpt", "nobody"); !errors.Is(err, ErrTooFew) || !strings.Contains(err.Error(), "nobody") {
		t.Errorf("a model the log lacks: error %v, want ErrTooFew naming it", err)
	}
}
