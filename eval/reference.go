package eval

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"regexp"

	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/llmpool"
)

// The reference rows of a table are not routers: they say what the pool
// itself can do on the evaluated questions, so that a router's accuracy
// can be read against its cost. References asks every pool model every
// question directly (as the largest router asks its one model: the
// question as the query, the answer extracted from the reply), keeping
// each model's answers in results-model-<model>.jsonl beside the routers'
// files, resumed and keyed like theirs (identity.go: the pool and the
// model's name). From those answers:
//
//   - oracle: per question, a model that answered it right (exact match),
//     the cheapest of them by the cost of its reply to that question; when
//     no model answered it right, the cheapest model's reply. So the
//     oracle's EM is the share of questions some model answers right, its
//     cost the least a router could pay for that EM, and its F1 the F1 of
//     those replies (not the best F1 of any model).
//   - best single: the model of the highest Avg EM (ties: higher Avg F1,
//     then lower cost per question, then pool order).
//   - cheapest single: the model of the lowest cost per question on these
//     questions (ties: lower price_in + price_out, then pool order).

// Kinds of reference row (Row.Reference).
const (
	RefOracle   = "oracle"
	RefBest     = "best-single"
	RefCheapest = "cheapest-single"
)

// modelRouter names a pool model's reference answers (their identity's
// router and the progress display).
func modelRouter(m string) string { return "model:" + m }

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]`)

// ModelResultsFile is the results file of pool model m's reference
// answers: results-model-<m>.jsonl, with a name that is not a plain file
// name made safe and suffixed with 8 hex digits of its sha256.
func ModelResultsFile(m string) string {
	safe := unsafeName.ReplaceAllString(m, "_")
	if safe != m {
		sum := sha256.Sum256([]byte(m))
		safe += "-" + hex.EncodeToString(sum[:4])
	}
	return "results-model-" + safe + ".jsonl"
}

// References computes the reference rows of qs (oracle, best single
// model, cheapest single model, in that order) from every pool model's
// answers, asked of s.Env.Pool into outDir (see above); only the pool of
// s.Env is used, so an Env without a policy will do. Every rank of
// s.Group calls it; rank 0 gets the rows, the others nil.
func References(ctx context.Context, s Setup, qs []data.Example, outDir string, log *slog.Logger,
	progress func(router string, done, total int)) ([]Row, error) {
	rows, _, err := references(ctx, s, qs, outDir, log, progress)
	return rows, err
}

// SingleRows is one row per pool model (Model set, in pool order), each
// model answering every question alone, and the reference rows, from the
// answers References keeps (asked once, reused after).
func SingleRows(ctx context.Context, s Setup, qs []data.Example, outDir string, log *slog.Logger,
	progress func(router string, done, total int)) (singles, refs []Row, err error) {
	refs, per, err := references(ctx, s, qs, outDir, log, progress)
	if err != nil || refs == nil {
		return nil, nil, err
	}
	for i, m := range s.Env.Pool.Models() {
		r := rowOf(per[i], datasetsOf(qs))
		r.Model = m.Name
		singles = append(singles, r)
	}
	return singles, refs, nil
}

// references is References, with every model's answers (per model, in qs's
// order; rank 0 only).
func references(ctx context.Context, s Setup, qs []data.Example, outDir string, log *slog.Logger,
	progress func(router string, done, total int)) ([]Row, [][]rollout.QuestionResult, error) {
	models := s.Env.Pool.Models()
	memo := map[string]json.RawMessage{}
	per := make([][]rollout.QuestionResult, len(models))
	for i, m := range models {
		name := modelRouter(m.Name)
		r := fixedRouter{s: s, pick: func(data.Example) string { return m.Name }}
		res, err := answerFile(ctx, s, qs, name, r, func() (identity, error) { return modelIdentity(m.Name, s, memo) },
			filepath.Join(outDir, ModelResultsFile(m.Name)), log, progress)
		if err != nil {
			return nil, nil, err
		}
		per[i] = res // nil on a rank other than 0, which answers every model's share all the same
	}
	if s.Group != nil && s.Group.Rank() != 0 {
		return nil, nil, nil
	}
	rows, err := referenceRows(models, per, datasetsOf(qs))
	return rows, per, err
}

// referenceRows builds the reference rows from per[i], model i's result
// for each question (every model in the same question order).
func referenceRows(models []llmpool.ModelInfo, per [][]rollout.QuestionResult, datasets []string) ([]Row, error) {
	if len(models) == 0 || len(per) != len(models) {
		return nil, fmt.Errorf("eval: reference rows need every pool model's answers (%d models, %d answer sets)", len(models), len(per))
	}
	n := len(per[0])
	rows := make([]Row, len(models))
	for i, res := range per {
		if len(res) != n {
			return nil, fmt.Errorf("eval: reference rows: model %s answered %d questions, model %s %d", models[i].Name, len(res), models[0].Name, n)
		}
		rows[i] = rowOf(res, datasets)
	}
	oracle := make([]rollout.QuestionResult, n)
	for q := range n {
		pick := -1
		for i, res := range per {
			if res[q].ID != per[0][q].ID {
				return nil, fmt.Errorf("eval: reference rows: question %d is %s for model %s but %s for model %s", q, res[q].ID, models[i].Name, per[0][q].ID, models[0].Name)
			}
			right := res[q].EM > 0
			switch {
			case pick < 0:
				pick = i
			case right && per[pick][q].EM <= 0: // the first right answer
				pick = i
			case right == (per[pick][q].EM > 0) && res[q].Cost < per[pick][q].Cost:
				pick = i // as right, and cheaper
			}
		}
		oracle[q] = per[pick][q]
	}
	or := rowOf(oracle, datasets)
	or.Reference = RefOracle
	best, cheapest := 0, 0
	for i := 1; i < len(models); i++ {
		a, b := rows[i], rows[best]
		if a.Avg.EM > b.Avg.EM || a.Avg.EM == b.Avg.EM && (a.Avg.F1 > b.Avg.F1 || a.Avg.F1 == b.Avg.F1 && a.CostPerQuestion < b.CostPerQuestion) {
			best = i
		}
		c := rows[cheapest]
		price := func(k int) float64 { return models[k].PriceIn + models[k].PriceOut }
		if a.CostPerQuestion < c.CostPerQuestion || a.CostPerQuestion == c.CostPerQuestion && price(i) < price(cheapest) {
			cheapest = i
		}
	}
	b, c := rows[best], rows[cheapest]
	b.Reference, b.Model = RefBest, models[best].Name
	c.Reference, c.Model = RefCheapest, models[cheapest].Name
	return []Row{or, b, c}, nil
}
