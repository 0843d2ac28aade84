package baselines

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/recal-project/recal/internal/outcomes"
	"github.com/recal-project/recal/llmpool"
)

// ExportLog writes every collected (question, model) with a reply as an
// outcome log row carrying the reply, tokens, cost and exact match, in
// question then pool order, and leaves failed calls out.
func TestExportLog(t *testing.T) {
	pool, info := simPool(t, func(c *llmpool.Config) { c.Models[1].Sim.FailureRate = 1 })
	dir := t.TempDir()
	qs := questions(3)
	if _, err := Collect(context.Background(), dir, CollectOptions{Pool: pool, Info: info, Questions: qs, Extract: extract}); err != nil {
		t.Fatal(err)
	}
	outs, err := readOutcomes(dir)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "log.jsonl")
	st, err := ExportLog(dir, path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Rows != 3 || st.Failed != 3 {
		t.Fatalf("stats %+v, want 3 rows (model always) and 3 failed calls (model never) left out", st)
	}
	l, err := outcomes.ReadFile(path)
	if err != nil {
		t.Fatalf("the exported log does not read back: %v", err)
	}
	for i, r := range l.Rows {
		o := outs[[2]string{qs[i].ID, "always"}]
		if r.QuestionID != qs[i].ID || r.Model != "always" || r.Reply == nil || *r.Reply != o.Reply || r.Correct == nil || *r.Correct != (o.EM == 1) ||
			*r.InputTokens != o.InputTokens || *r.OutputTokens != o.OutputTokens || *r.Cost != o.Cost || r.Judge != ExportJudge {
			t.Errorf("row %d = %+v, want the collected outcome %+v", i, r, o)
		}
	}
	if _, err := ExportLog(t.TempDir(), path); !errors.Is(err, ErrNoOutcomes) {
		t.Errorf("export of an empty folder: %v, want ErrNoOutcomes", err)
	}
}
