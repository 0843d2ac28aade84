package eval

import (
	"math"
	"strings"
	"testing"

	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/llmpool"
	"github.com/recal-project/recal/router"
)

// A router that asks the dearest model for everything shows it: its top
// share, the questions it overpaid for while a cheap model was right, and
// those it missed while some model was right.
func TestRoutingDiagnostics(t *testing.T) {
	models := []llmpool.ModelInfo{{Name: "cheap", PriceIn: 1, PriceOut: 1}, {Name: "dear", PriceIn: 30, PriceOut: 60}}
	golden := []string{"paris"}
	q := func(id, answer string, cost float64, calls ...string) rollout.QuestionResult {
		r := rollout.QuestionResult{ID: id, Golden: golden, Answer: answer, Cost: cost, EM: data.ExactMatch(answer, golden)}
		for _, m := range calls {
			r.Calls = append(r.Calls, router.Call{Model: m})
		}
		return r
	}
	// Each model's own answers: cheap right on q1 (cost 1), dear right on
	// q1 and q2 (cost 10); nobody right on q3.
	per := [][]rollout.QuestionResult{
		{q("q1", "Paris", 1), q("q2", "Rome", 1), q("q3", "Oslo", 1)},
		{q("q1", "Paris", 10), q("q2", "Paris", 10), q("q3", "Bern", 10)},
	}
	collapsed := []rollout.QuestionResult{
		q("q1", "Paris", 10, "dear"),         // overpaid: cheap was right for 1
		q("q2", "Rome", 11, "cheap", "dear"), // missed: dear was right; overpaid: 11 > 10
		q("q3", "Bern", 10, "dear"),          // nobody right: neither
	}
	tab := Table{Rows: []Row{{Router: "r", Routing: routingOf(collapsed, models)}}, results: map[string][]rollout.QuestionResult{"r": collapsed}}
	tab.collapse(per)
	got := tab.Rows[0].Routing
	if got.Top != "dear" || math.Abs(got.TopShare-0.75) > 1e-12 || math.Abs(got.CallShare["cheap"]-0.25) > 1e-12 {
		t.Errorf("top %s share %v, shares %v; want dear at 0.75 (3 of 4 calls), cheap 0.25", got.Top, got.TopShare, got.CallShare)
	}
	if got.Overpaid == nil || math.Abs(*got.Overpaid-2.0/3) > 1e-12 {
		t.Errorf("overpaid %v, want 2/3 (q1 and q2 cost more than a right model alone)", got.Overpaid)
	}
	if got.Missed == nil || math.Abs(*got.Missed-1.0/3) > 1e-12 {
		t.Errorf("missed %v, want 1/3 (q2: wrong while dear was right)", got.Missed)
	}
	var b strings.Builder
	tab.Text(&b)
	if !strings.Contains(b.String(), "0.750") || !strings.Contains(b.String(), "cheap 0.250, dear 0.750") {
		t.Errorf("the text table lacks the routing block:\n%s", b.String())
	}
	none := routingOf([]rollout.QuestionResult{q("q1", "", 0)}, models)
	if none.TopShare != 0 || len(none.CallShare) != 0 {
		t.Errorf("a router with no calls: %+v, want empty shares (no division by zero)", none)
	}
}
