package data

import (
	"errors"
	"strings"
)

// Example is one QA item.
type Example struct {
	ID       string   `json:"id"`             // globally unique: "<dataset>/<source id>", e.g. "nq/nq-open-dev-0"
	SourceID string   `json:"source_id"`      // id in the source file, or the 0-based row index when the file has none
	Dataset  string   `json:"dataset"`        // canonical dataset name (see Known)
	Question string   `json:"question"`       // trimmed, ending with "?"
	Golden   []string `json:"golden_answers"` // golden answers: trimmed, none empty, at least one
}

// rawExample is a record as read from a file, before cleaning.
type rawExample struct {
	sourceID string
	dataset  string // canonical
	question string
	golden   []string
}

// newExample cleans a raw record into an Example: the question is trimmed
// and gets a final "?" when it has none (as Search-R1 and Router-R1 do);
// golden answers are trimmed and empties dropped. Invalid UTF-8 (Parquet
// strings are bytes) becomes U+FFFD, so that an example reads the same after
// a JSON round trip through results and outcome files. It returns the name
// of the offending field with the error.
func newExample(r rawExample) (Example, string, error) {
	r.sourceID = strings.ToValidUTF8(r.sourceID, "\uFFFD")
	q := strings.TrimSpace(strings.ToValidUTF8(r.question, "\uFFFD"))
	if q == "" {
		return Example{}, "question", errors.New("empty")
	}
	if !strings.HasSuffix(q, "?") {
		q += "?"
	}
	golden := make([]string, 0, len(r.golden))
	for _, g := range r.golden {
		if g = strings.TrimSpace(strings.ToValidUTF8(g, "\uFFFD")); g != "" {
			golden = append(golden, g)
		}
	}
	if len(golden) == 0 {
		return Example{}, "golden_answers", ErrNoGolden
	}
	if strings.TrimSpace(r.sourceID) == "" {
		return Example{}, "id", errors.New("empty")
	}
	return Example{
		ID:       r.dataset + "/" + r.sourceID,
		SourceID: r.sourceID,
		Dataset:  r.dataset,
		Question: q,
		Golden:   golden,
	}, "", nil
}

// GroupByDataset splits examples by dataset, keeping their order within each.
func GroupByDataset(examples []Example) map[string][]Example {
	out := make(map[string][]Example)
	for _, ex := range examples {
		out[ex.Dataset] = append(out[ex.Dataset], ex)
	}
	return out
}
