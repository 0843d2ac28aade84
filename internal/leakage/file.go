package leakage

import (
	"fmt"
	"io"
	"strings"

	"github.com/recal-project/recal/internal/outcomes"
	"github.com/recal-project/recal/llmpool"
)

// CheckFile reads the outcome log at path and checks the replies a
// replayed model renders from it under render mode render
// (llmpool.RenderJudgment or llmpool.RenderText), and the agreement of each
// pair of models of pairs (CheckAgreement).
func CheckFile(path, render string, opt Options, pairs [][2]string) (Report, error) {
	if render != llmpool.RenderJudgment && render != llmpool.RenderText {
		return Report{}, fmt.Errorf("leakage: render %q is not one of %s, %s", render, llmpool.RenderJudgment, llmpool.RenderText)
	}
	l, err := outcomes.ReadFile(path)
	if err != nil {
		return Report{}, err
	}
	r := llmpool.NewReplayRenderer(l)
	text := func(row outcomes.Row) string { return r.Text(row, render) }
	rep, err := Check(l, text, opt)
	rep.Render = render
	if err != nil {
		return rep, err
	}
	for _, p := range pairs {
		ag, err := CheckAgreement(l, text, p[0], p[1])
		if err != nil {
			return rep, err
		}
		rep.Agreement = append(rep.Agreement, ag)
	}
	return rep, nil
}

// Format writes the report as a table: the AUCs over every held-out row,
// then per model.
func (r Report) Format(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d judged rows (%.3f judged right), %d of held-out questions (%.0f%%)\n",
		r.Log, r.Rows, r.RightShare, r.Test, 100*r.Options.TestShare)
	fmt.Fprintf(&b, "AUC of predicting the judgment from the reply alone (0.5: chance)\n")
	fmt.Fprintf(&b, "%-12s %8s %8s %14s %12s\n", "rows", "held out", "right", "rendered AUC", "logged AUC")
	fmt.Fprintf(&b, "%-12s %8d %8.3f %14.3f %12s\n", "all", r.Test, r.RightShare, r.Rendered, "")
	if r.Logged != nil {
		fmt.Fprintf(&b, "%-12s %8d %8s %14.3f %12.3f\n", "with text", r.LoggedRows, "", *r.RenderedOnLogged, *r.Logged)
	}
	for _, m := range r.Models {
		fmt.Fprintf(&b, "%-12s %8d %8.3f %14s %12s\n", m.Model, m.Test, m.RightShare, opt(m.Rendered), opt(m.Logged))
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	for _, ag := range r.Agreement {
		if _, err := io.WriteString(w, "\n"); err != nil {
			return err
		}
		if err := ag.Format(w); err != nil {
			return err
		}
	}
	return nil
}

func opt(p *float64) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf("%.3f", *p)
}
