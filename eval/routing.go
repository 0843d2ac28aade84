package eval

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/llmpool"
)

// Routing says where a router's calls went: the signs of routing collapse
// (a router that sends nearly every question to one model, usually the
// dearest, whatever the question).
type Routing struct {
	// CallShare is each pool model's share of the router's calls.
	CallShare map[string]float64 `json:"call_share"`
	// Top is the pool's most expensive model: the highest price_in +
	// price_out (ties: pool order).
	Top string `json:"top"`
	// TopShare is Top's share of the router's calls.
	TopShare float64 `json:"top_share"`
	// Overpaid is the share of questions on which the router paid more
	// than a pool model that answered right (exact match) alone cost, by
	// the reference answers; absent without them.
	Overpaid *float64 `json:"overpaid,omitempty"`
	// Missed is the share of questions the router answered wrong although
	// some pool model answered right alone; absent without the reference
	// answers.
	Missed *float64 `json:"missed,omitempty"`
}

// routingOf counts the calls of results by model.
func routingOf(results []rollout.QuestionResult, models []llmpool.ModelInfo) *Routing {
	r := &Routing{CallShare: map[string]float64{}}
	if len(models) > 0 {
		top := models[0]
		for _, m := range models[1:] {
			if m.PriceIn+m.PriceOut > top.PriceIn+top.PriceOut {
				top = m
			}
		}
		r.Top = top.Name
	}
	calls := 0
	for _, q := range results {
		for _, c := range q.Calls {
			if c.Model == "" {
				continue
			}
			r.CallShare[c.Model]++
			calls++
		}
	}
	for m := range r.CallShare {
		r.CallShare[m] /= float64(calls)
	}
	r.TopShare = r.CallShare[r.Top]
	return r
}

// collapse sets Overpaid and Missed of each router row whose results the
// table holds, against per (each pool model's answers, by question).
func (t *Table) collapse(per [][]rollout.QuestionResult) {
	type best struct {
		right bool
		cost  float64 // the cheapest right model's cost
	}
	byID := map[string]best{}
	for _, res := range per {
		for _, q := range res {
			b := byID[q.ID]
			if q.EM > 0 && (!b.right || q.Cost < b.cost) {
				b = best{true, q.Cost}
			}
			byID[q.ID] = b
		}
	}
	for i := range t.Rows {
		res, ok := t.results[t.Rows[i].Router]
		if !ok || len(res) == 0 || t.Rows[i].Routing == nil {
			continue
		}
		over, missed := 0, 0
		for _, q := range res {
			b := byID[q.ID]
			if !b.right {
				continue
			}
			if q.Cost > b.cost {
				over++
			}
			if q.EM <= 0 {
				missed++
			}
		}
		o, m := float64(over)/float64(len(res)), float64(missed)/float64(len(res))
		t.Rows[i].Routing.Overpaid, t.Rows[i].Routing.Missed = &o, &m
	}
}

// AddReferences computes the reference rows (References) into t and, from
// the same answers, each router row's Overpaid and Missed. On a rank other
// than 0 it leaves t as it is.
func (t *Table) AddReferences(ctx context.Context, s Setup, qs []data.Example, outDir string, log *slog.Logger,
	progress func(router string, done, total int)) error {
	rows, per, err := references(ctx, s, qs, outDir, log, progress)
	if err != nil || rows == nil {
		return err
	}
	t.References = rows
	t.collapse(per)
	return nil
}

// routingText writes the routing block of the text table.
func (t Table) routingText(w io.Writer, lw int) {
	if !slices.ContainsFunc(t.Rows, func(r Row) bool { return r.Routing != nil }) {
		return
	}
	fmt.Fprintf(w, "\n%-*s %10s %9s %9s  %s\n", lw, "routing", "top share", "overpaid", "missed", "calls by model")
	for _, r := range t.Rows {
		if r.Routing == nil {
			continue
		}
		fmt.Fprintf(w, "%-*s %10.3f %9s %9s  %s\n", lw, r.Label(), r.Routing.TopShare, optRate(r.Routing.Overpaid), optRate(r.Routing.Missed), r.Routing.shares())
	}
	fmt.Fprintf(w, "top share: calls to the dearest pool model; overpaid: questions that cost more than a pool model right on them alone; missed: answered wrong when some pool model was right\n")
}

// routingMarkdown writes the routing table of table.md.
func (t Table) routingMarkdown(w io.Writer) {
	if !slices.ContainsFunc(t.Rows, func(r Row) bool { return r.Routing != nil }) {
		return
	}
	fmt.Fprint(w, "### Routing\n\n| router | top share | overpaid | missed | calls by model |\n|---|---|---|---|---|\n")
	for _, r := range t.Rows {
		if r.Routing != nil {
			fmt.Fprintf(w, "| %s | %.3f | %s | %s | %s |\n", r.Label(), r.Routing.TopShare, optRate(r.Routing.Overpaid), optRate(r.Routing.Missed), r.Routing.shares())
		}
	}
	fmt.Fprint(w, "\nTop share: calls to the dearest pool model; overpaid: questions that cost more than a pool model right on them alone; missed: answered wrong when some pool model was right.\n\n")
}

func (r *Routing) shares() string {
	var parts []string
	for _, m := range slices.Sorted(maps.Keys(r.CallShare)) {
		parts = append(parts, fmt.Sprintf("%s %.3f", m, r.CallShare[m]))
	}
	if len(parts) == 0 {
		return "no calls"
	}
	return strings.Join(parts, ", ")
}

func optRate(p *float64) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf("%.3f", *p)
}
