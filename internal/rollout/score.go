package rollout

import (
	"context"

	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/generate"
	"github.com/recal-project/recal/router"
)

// Score of a set of questions.
type Score struct {
	EM         float64 `json:"em"`
	F1         float64 `json:"f1"`
	N          int     `json:"n"`
	Calls      float64 `json:"calls_per_question,omitempty"`
	Cost       float64 `json:"cost,omitempty"`
	WellFormed float64 `json:"well_formed"`
	// F1WellFormed is the mean F1 with every response that is not well
	// formed scored 0: what checkpoints/best is chosen by (train.keep_best),
	// so that a policy whose format collapsed is not kept for its answers.
	F1WellFormed float64 `json:"f1_well_formed"`
	// Closed is the share of responses with a tag that router.on_repeat =
	// "close" closed when the policy's copy began to loop.
	Closed float64 `json:"closed,omitempty"`
}

// ValidationResult is one line of validation.jsonl.
type ValidationResult struct {
	Step     int              `json:"step"`
	Datasets map[string]Score `json:"datasets"`
	Avg      Score            `json:"avg"` // mean over datasets
}

// QuestionResult is the outcome of one question under greedy decoding.
type QuestionResult struct {
	ID         string        `json:"id"`
	Dataset    string        `json:"dataset"`
	Question   string        `json:"question"`
	Golden     []string      `json:"golden_answers"`
	Answer     string        `json:"answer"`
	EM         float64       `json:"em"`
	F1         float64       `json:"f1"`
	WellFormed bool          `json:"well_formed"`
	Closed     int           `json:"closed,omitempty"` // tags router.on_repeat = "close" closed
	Calls      []router.Call `json:"calls"`
	Cost       float64       `json:"cost"`
	Response   string        `json:"response"`
}

// Answer runs the policy greedily (one response per question) over qs in
// batches and scores each answer.
func Answer(ctx context.Context, env *Env, qs []data.Example, batch int) ([]QuestionResult, error) {
	var out []QuestionResult
	for lo := 0; lo < len(qs); lo += batch {
		part := qs[lo:min(lo+batch, len(qs))]
		samples, _, err := env.Roll(ctx, part, 1, generate.Sampling{}, 0, false)
		if err != nil {
			return nil, err
		}
		for i, s := range samples {
			q := part[i]
			ans, _ := router.LastAnswer(s.Text)
			r := QuestionResult{ID: q.ID, Dataset: q.Dataset, Question: q.Question, Golden: q.Golden, Answer: ans,
				EM: data.ExactMatch(ans, q.Golden), F1: data.F1(ans, q.Golden), WellFormed: router.WellFormed(s.Text, env.Known),
				Closed: s.Closed, Calls: s.Calls, Response: s.Text}
			for _, c := range s.Calls {
				r.Cost += c.Cost
			}
			out = append(out, r)
		}
	}
	return out, nil
}

// Summarize groups results by dataset; Avg is the mean over datasets.
func Summarize(results []QuestionResult) (map[string]Score, Score) {
	per := map[string]Score{}
	for _, r := range results {
		s := per[r.Dataset]
		s.N++
		s.EM += r.EM
		s.F1 += r.F1
		if r.WellFormed {
			s.F1WellFormed += r.F1
		}
		s.Cost += r.Cost
		s.Calls += float64(len(r.Calls))
		if r.WellFormed {
			s.WellFormed++
		}
		if r.Closed > 0 {
			s.Closed++
		}
		per[r.Dataset] = s
	}
	var avg Score
	for k, s := range per {
		n := float64(s.N)
		s.EM, s.F1, s.Calls, s.WellFormed, s.F1WellFormed, s.Closed = s.EM/n, s.F1/n, s.Calls/n, s.WellFormed/n, s.F1WellFormed/n, s.Closed/n
		per[k] = s
		avg.EM += s.EM
		avg.F1 += s.F1
		avg.F1WellFormed += s.F1WellFormed
		avg.Calls += s.Calls
		avg.Cost += s.Cost
		avg.WellFormed += s.WellFormed
		avg.Closed += s.Closed
		avg.N += s.N
	}
	if d := float64(len(per)); d > 0 {
		avg.EM, avg.F1, avg.Calls, avg.WellFormed, avg.F1WellFormed, avg.Closed = avg.EM/d, avg.F1/d, avg.Calls/d, avg.WellFormed/d, avg.F1WellFormed/d, avg.Closed/d
	}
	return per, avg
}

// Validate answers the held-out questions greedily and scores them.
func Validate(ctx context.Context, env *Env, val []data.Example, batch, step int) (ValidationResult, error) {
	res, err := Answer(ctx, env, val, batch)
	if err != nil {
		return ValidationResult{}, err
	}
	per, avg := Summarize(res)
	return ValidationResult{Step: step, Datasets: per, Avg: avg}, nil
}
