package eval

import (
	"encoding/csv"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/recal-project/recal/internal/rollout"
)

// The ReCal paper's Table 1 (EM; its appendix repeats it in F1): every
// method in three groups, the seven datasets as columns (NQ and HotpotQA
// in-domain), Avg last. recal table1 evaluates each row through this
// package's harness and writes the table with PaperTable.

// Groups of Table 1, in the paper's order.
const (
	GroupNoRouting = "No routing"
	GroupRouting   = "Heuristic & discriminative routing"
	GroupRL        = "RL-based routing"
)

// Which policy a row's router runs (the rows that run one).
const (
	PolicyBase     = "base"      // policy.checkpoint: the starting model
	PolicyReCal    = "recal"     // the ReCal checkpoint evaluated
	PolicyRouterR1 = "router-r1" // the policy trained with train.algorithm = "ppo"
)

// Table1Row is a row of Table 1.
type Table1Row struct {
	Group string
	Label string // the paper's name
	// Router is the registered router that makes the row ("" for rows
	// recal does not run); Policy is the checkpoint it runs ("" for
	// routers that use no policy).
	Router string
	Policy string
	// NotRun says why recal does not run the row.
	NotRun string
}

// noCorpus is why the retrieval rows are not run.
const noCorpus = "needs the Wikipedia-18 corpus and the E5 retriever (FlashRAG), which these machines cannot reach and recal does not implement"

// Table1Rows are the rows in the paper's order. Vanilla and CoT are the
// starting model (policy.checkpoint) answering alone, as the paper's
// no-routing rows are its base model; eval's direct router on the trained
// checkpoint is another row of recal eval, not of Table 1.
var Table1Rows = []Table1Row{
	{Group: GroupNoRouting, Label: "Vanilla", Router: "direct", Policy: PolicyBase},
	{Group: GroupNoRouting, Label: "CoT", Router: "cot", Policy: PolicyBase},
	{Group: GroupNoRouting, Label: "SFT", Router: "sft"},
	{Group: GroupNoRouting, Label: "RAG", NotRun: noCorpus},
	{Group: GroupNoRouting, Label: "Search-R1", NotRun: noCorpus + "; Search-R1 is trained to search that corpus"},
	{Group: GroupRouting, Label: "Largest LLM", Router: "largest"},
	{Group: GroupRouting, Label: "Prompt LLM", Router: "prompt"},
	{Group: GroupRouting, Label: "Prompt LLM*", Router: "prompt-decomp"},
	{Group: GroupRouting, Label: "KNN Router", Router: "knn"},
	{Group: GroupRouting, Label: "KNN Router*", Router: "knn-decomp"},
	{Group: GroupRouting, Label: "MLP Router", Router: "mlp"},
	{Group: GroupRouting, Label: "RouteLLM", Router: "routellm-mf"},
	{Group: GroupRouting, Label: "RouterDC", Router: "routerdc"},
	{Group: GroupRouting, Label: "GraphRouter", Router: "graphrouter"},
	{Group: GroupRL, Label: "Router-R1", Router: "policy", Policy: PolicyRouterR1},
	{Group: GroupRL, Label: "ReCal", Router: "policy", Policy: PolicyReCal},
}

// Slug is a row's file-system name (its results folder).
func (r Table1Row) Slug() string {
	s := strings.ToLower(r.Label)
	s = strings.ReplaceAll(s, "*", "-decomp")
	return strings.ReplaceAll(s, " ", "-")
}

// PaperRow is a row of PaperTable: its scores, or why it has none.
type PaperRow struct {
	Group  string `json:"group"`
	Label  string `json:"label"`
	Router string `json:"router,omitempty"`
	Policy string `json:"policy,omitempty"` // the checkpoint folder the row's policy ran
	// Status is "" for an evaluated row, else why it has no scores
	// ("not run: …").
	Status string `json:"status,omitempty"`
	Scores *Row   `json:"scores,omitempty"`
}

// PaperTable is Table 1 as recal table1 evaluated it.
type PaperTable struct {
	Split    string     `json:"split"`
	Datasets []string   `json:"datasets"`
	InDomain []string   `json:"in_domain,omitempty"` // the datasets trained on; the others are out of domain
	Rows     []PaperRow `json:"rows"`
	// References are the oracle, best and cheapest single-model rows
	// (References), below the paper's rows.
	References []Row `json:"references,omitempty"`
}

// GroupReference is the heading of the reference rows.
const GroupReference = "Reference (not routers)"

// allRows are the paper's rows, then the reference rows in group
// GroupReference.
func (t PaperTable) allRows() []PaperRow {
	rows := slices.Clone(t.Rows)
	for _, r := range t.References {
		rows = append(rows, PaperRow{Group: GroupReference, Label: r.Label(), Scores: &r})
	}
	return rows
}

func (t PaperTable) datasetHeader(d string) string {
	if slices.Contains(t.InDomain, d) {
		return d + "†"
	}
	return d
}

// Text renders the table for a terminal: one block per metric (EM, F1),
// rows grouped, then calls per question, cost and well-formed rate, then
// the rows without scores and why.
func (t PaperTable) Text(w io.Writer) {
	lw := 13
	for _, r := range t.allRows() {
		lw = max(lw, len([]rune(r.Label)))
	}
	for _, metric := range []string{"EM", "F1"} {
		fmt.Fprintf(w, "\n%s (split %s)\n%-*s", metric, t.Split, lw, "method")
		for _, d := range t.Datasets {
			fmt.Fprintf(w, " %9s", t.datasetHeader(d))
		}
		fmt.Fprintf(w, " %9s\n", "Avg")
		group := ""
		for _, r := range t.allRows() {
			if r.Group != group {
				group = r.Group
				fmt.Fprintf(w, "-- %s\n", group)
			}
			fmt.Fprintf(w, "%-*s", lw, r.Label)
			for _, d := range t.Datasets {
				fmt.Fprintf(w, " %9s", cell(r, func(row *Row) rollout.Score { return row.Datasets[d] }, metric))
			}
			fmt.Fprintf(w, " %9s\n", cell(r, func(row *Row) rollout.Score { return row.Avg }, metric))
		}
	}
	fmt.Fprintf(w, "\n%-*s %14s %12s %13s %12s %8s\n", lw, "method", "calls/question", "cost (USD)", "cost/question", "well-formed", "n")
	for _, r := range t.allRows() {
		if r.Scores == nil {
			continue
		}
		a := r.Scores.Avg
		fmt.Fprintf(w, "%-*s %14.2f %12.4f %13.6f %12.3f %8d\n", lw, r.Label, a.Calls, a.Cost, r.Scores.CostPerQuestion, a.WellFormed, a.N)
	}
	fmt.Fprintln(w, "\n† in-domain (trained on); the other datasets are out-of-domain")
	if len(t.References) > 0 {
		fmt.Fprintln(w, ReferenceNote)
	}
	for _, r := range t.Rows {
		if r.Status != "" {
			fmt.Fprintf(w, "%s: %s\n", r.Label, r.Status)
		}
	}
}

// cell is a row's score as text, "—" when the row has none.
func cell(r PaperRow, get func(*Row) rollout.Score, metric string) string {
	if r.Scores == nil {
		return "—"
	}
	return fmt.Sprintf("%.3f", pick(metric, get(r.Scores)))
}

// Markdown renders one table per metric, rows grouped, with calls per
// question, cost and well-formed rate; rows without scores show "—" and a
// note says why.
func (t PaperTable) Markdown(w io.Writer) {
	cols := len(t.Datasets) + 6
	for _, metric := range []string{"EM", "F1"} {
		fmt.Fprintf(w, "### %s (split %s)\n\n| method |", metric, t.Split)
		for _, d := range t.Datasets {
			fmt.Fprintf(w, " %s |", t.datasetHeader(d))
		}
		fmt.Fprint(w, " Avg | calls/q | cost (USD) | cost/q | well-formed |\n|---|")
		for range cols - 1 {
			fmt.Fprint(w, "---|")
		}
		fmt.Fprintln(w)
		group := ""
		for _, r := range t.allRows() {
			if r.Group != group {
				group = r.Group
				fmt.Fprintf(w, "| ***%s*** |%s\n", group, strings.Repeat(" |", cols-1))
			}
			fmt.Fprintf(w, "| %s |", r.Label)
			for _, d := range t.Datasets {
				fmt.Fprintf(w, " %s |", cell(r, func(row *Row) rollout.Score { return row.Datasets[d] }, metric))
			}
			if r.Scores == nil {
				fmt.Fprint(w, " — | — | — | — | — |\n")
				continue
			}
			a := r.Scores.Avg
			fmt.Fprintf(w, " **%.3f** | %.2f | %.4f | %.6f | %.3f |\n", pick(metric, a), a.Calls, a.Cost, r.Scores.CostPerQuestion, a.WellFormed)
		}
		fmt.Fprint(w, "\n† in-domain\n\n")
		if len(t.References) > 0 {
			fmt.Fprintf(w, "Reference %s.\n\n", strings.TrimPrefix(ReferenceNote, "reference "))
		}
	}
	for _, r := range t.Rows {
		if r.Status != "" {
			fmt.Fprintf(w, "- %s: %s\n", r.Label, r.Status)
		}
	}
}

// CSV writes one line per row and dataset (and "avg"), and one line with
// the status for a row without scores.
func (t PaperTable) CSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	cw.Write([]string{"group", "method", "router", "status", "dataset", "em", "f1", "calls_per_question", "cost", "cost_per_question", "well_formed", "n"})
	for _, r := range t.allRows() {
		if r.Scores == nil {
			cw.Write([]string{r.Group, r.Label, r.Router, r.Status, "", "", "", "", "", "", "", ""})
			continue
		}
		for _, d := range append(append([]string{}, t.Datasets...), "avg") {
			sc, cpq := r.Scores.Avg, r.Scores.CostPerQuestion
			if d != "avg" {
				sc = r.Scores.Datasets[d]
				cpq = 0
				if sc.N > 0 {
					cpq = sc.Cost / float64(sc.N)
				}
			}
			cw.Write([]string{r.Group, r.Label, r.Router, "", d, fmt.Sprintf("%.4f", sc.EM), fmt.Sprintf("%.4f", sc.F1),
				fmt.Sprintf("%.4f", sc.Calls), fmt.Sprintf("%.6f", sc.Cost), fmt.Sprintf("%.8f", cpq), fmt.Sprintf("%.4f", sc.WellFormed), fmt.Sprint(sc.N)})
		}
	}
	cw.Flush()
	return cw.Error()
}

// Write saves table.json, table.csv and table.md in dir, each atomically.
func (t PaperTable) Write(dir string) error { return writeTable(dir, t) }
