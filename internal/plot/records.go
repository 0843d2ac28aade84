package plot

import (
	"fmt"
	"log/slog"
	"sort"
)

// metricsRecord is the part of a metrics.jsonl line that the figures use.
// Pointer and map fields stay nil when the line lacks them (or holds null),
// so a missing value is never drawn as zero.
type metricsRecord struct {
	Step             *float64            `json:"step"`
	Reward           map[string]*float64 `json:"reward"`
	CallsPerQuestion *float64            `json:"calls_per_question"`
	ModelShare       map[string]*float64 `json:"model_share"`
	Entropy          *float64            `json:"entropy"`
	KL               *float64            `json:"kl"`
}

// validationRecord is the part of a validation.jsonl line that the figures
// use.
type validationRecord struct {
	Step     *float64                `json:"step"`
	Datasets map[string]*scoreRecord `json:"datasets"`
	Avg      *scoreRecord            `json:"avg"`
}

// scoreRecord holds the scores of one dataset, or their average.
type scoreRecord struct {
	EM *float64 `json:"em"`
	F1 *float64 `json:"f1"`
}

// stepped is a record placed on the step axis.
type stepped[T any] struct {
	step float64
	rec  T
}

// readMetrics reads path as metrics.jsonl and returns its records on the step
// axis (see placeSteps). A file without records is an error wrapping
// ErrNoRecords.
func readMetrics(path string, log *slog.Logger) ([]stepped[metricsRecord], error) {
	recs, err := readJSONL[metricsRecord](path, log)
	if err != nil {
		return nil, err
	}
	if len(recs) == 0 {
		return nil, fmt.Errorf("plot: %s: %w", path, ErrNoRecords)
	}
	return placeSteps(recs, func(r metricsRecord) *float64 { return r.Step }), nil
}

// readValidation reads path as validation.jsonl; an empty file gives no
// records and no error.
func readValidation(path string, log *slog.Logger) ([]stepped[validationRecord], error) {
	recs, err := readJSONL[validationRecord](path, log)
	if err != nil {
		return nil, err
	}
	return placeSteps(recs, func(r validationRecord) *float64 { return r.Step }), nil
}

// placeSteps gives every record its step: its "step" field, or the previous
// record's step plus one when the field is missing (the first record then
// gets step 1). A record whose step is not after the previous one comes from
// a resumed run that logs those steps again, so it replaces the kept records
// from its step on; the result is sorted by strictly increasing step.
func placeSteps[T any](recs []T, stepOf func(T) *float64) []stepped[T] {
	out := make([]stepped[T], 0, len(recs))
	prev := 0.0
	for _, r := range recs {
		step := prev + 1
		if s := stepOf(r); s != nil {
			step = *s
		}
		if n := len(out); n > 0 && step <= out[n-1].step {
			cut := sort.Search(n, func(i int) bool { return out[i].step >= step })
			out = out[:cut]
		}
		out = append(out, stepped[T]{step: step, rec: r})
		prev = step
	}
	return out
}
