package baselines

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"

	"github.com/recal-project/recal/internal/outcomes"
)

// ExportJudge is the Judge of the rows ExportLog writes: Correct is the
// exact match of eval's extracted answer with a golden answer.
const ExportJudge = "exact match (recal collect)"

// ExportStats counts what ExportLog wrote.
type ExportStats struct {
	Rows   int // rows written
	Failed int // failed calls left out (no reply to replay)
}

// ExportLog writes the outcomes of a collect folder as an outcome log
// (package outcomes) at path (replaced whole), so that a pool of provider "replay" answers as
// the collected models did: per (question, model) with a reply, the reply,
// its tokens, list-price cost and latency, and Correct = exact match of its extracted
// answer. Rows come by question id, then in pool order. Failed calls are
// left out and counted.
func ExportLog(dir, path string) (ExportStats, error) {
	pool, err := readPool(dir)
	if errors.Is(err, os.ErrNotExist) {
		return ExportStats{}, fmt.Errorf("%w in %s: make one with `recal collect --config recal.toml --out %s`", ErrNoOutcomes, dir, dir)
	}
	if err != nil {
		return ExportStats{}, err
	}
	outs, err := readOutcomes(dir)
	if err != nil {
		return ExportStats{}, fmt.Errorf("baselines: export: %w", err)
	}
	col := map[string]int{}
	for j, m := range pool.Models {
		col[m.Name] = j
	}
	keys := slices.SortedFunc(maps.Keys(outs), func(a, b [2]string) int {
		if a[0] != b[0] {
			if a[0] < b[0] {
				return -1
			}
			return 1
		}
		return col[a[1]] - col[b[1]]
	})
	var st ExportStats
	var rows []outcomes.Row
	for _, k := range keys {
		o := outs[k]
		if _, ok := col[o.Model]; !ok {
			continue
		}
		if o.Failed {
			st.Failed++
			continue
		}
		reply, correct := o.Reply, o.EM == 1
		in, out, cost, lat := o.InputTokens, o.OutputTokens, o.Cost, o.LatencyMS
		rows = append(rows, outcomes.Row{Dataset: o.Dataset, QuestionID: o.QuestionID, Question: o.Question, Golden: o.Golden,
			Model: o.Model, Reply: &reply, Correct: &correct, Judge: ExportJudge, InputTokens: &in, OutputTokens: &out, Cost: &cost,
			LatencyMS: &lat})
	}
	if len(rows) == 0 {
		return st, fmt.Errorf("%w in %s: no call with a reply", ErrNoOutcomes, dir)
	}
	st.Rows = len(rows)
	return st, outcomes.WriteFile(path, rows)
}
