package eval

import (
	"bufio"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/atomicfile"
	"github.com/recal-project/recal/internal/procgroup"
	"github.com/recal-project/recal/internal/rollout"
)

// Row is one router's line of the table, or one reference row's
// (Table.References, reference.go).
type Row struct {
	Router   string                   `json:"router,omitempty"` // the router's name; none for a reference row
	Datasets map[string]rollout.Score `json:"datasets"`
	Avg      rollout.Score            `json:"avg"` // mean over the table's datasets; Cost and N are totals
	// CostPerQuestion is Avg.Cost / Avg.N: USD per question, over all the
	// table's questions.
	CostPerQuestion float64 `json:"cost_per_question"`
	// Reference is the kind of a reference row (RefOracle, RefBest,
	// RefCheapest); "" for a router.
	Reference string `json:"reference,omitempty"`
	// Model is the pool model of a single-model reference row.
	Model string `json:"model,omitempty"`
	// Routing is where a router's calls went (routing.go); nil for a
	// reference row.
	Routing *Routing `json:"routing,omitempty"`
}

// Label is the row's name in the rendered tables: the router, or the
// reference row's kind and model.
func (r Row) Label() string {
	switch r.Reference {
	case "":
		return r.Router
	case RefOracle:
		return "oracle"
	}
	return strings.TrimSuffix(r.Reference, "-single") + " (" + r.Model + ")"
}

// Table is an evaluation's result: routers as rows, datasets as columns,
// then the reference rows (oracle, best and cheapest single model) when
// References computed them.
type Table struct {
	Datasets   []string `json:"datasets"`
	InDomain   []string `json:"in_domain,omitempty"` // the datasets trained on (Setup.InDomain); the others are out of domain
	Rows       []Row    `json:"rows"`
	References []Row    `json:"references,omitempty"`
	// results are the routers' per-question results of this run, by
	// router (Run), for AddReferences' Routing rates.
	results map[string][]rollout.QuestionResult
}

func (t Table) inDomain(d string) bool { return slices.Contains(t.InDomain, d) }

// Run evaluates each router on qs, appending per-question results to
// outDir/results-<router>.jsonl; questions already there are not asked again,
// so an interrupted run resumes where it stopped. A file is resumed only when
// it holds the answers of the same inputs (checkpoint contents, pool, …; see
// identity.go); otherwise it is moved aside and the router starts afresh.
// progress, if not nil, is called after each batch.
func Run(ctx context.Context, s Setup, qs []data.Example, routers []string, outDir string, log *slog.Logger,
	progress func(router string, done, total int)) (Table, error) {
	if s.Group == nil || s.Group.Rank() == 0 {
		if err := os.MkdirAll(outDir, 0o755); err != nil {
			return Table{}, fmt.Errorf("eval: %w", err)
		}
	}
	t := Table{Datasets: datasetsOf(qs), InDomain: s.InDomain}
	memo := map[string]json.RawMessage{}
	for _, name := range routers {
		r, err := NewRouter(name, s)
		if err != nil {
			return Table{}, err
		}
		if c, ok := r.(io.Closer); ok {
			defer c.Close() // a router holding its own policy (sft)
		}
		res, err := answerFile(ctx, s, qs, name, r, func() (identity, error) { return identityOf(name, s, memo) },
			filepath.Join(outDir, "results-"+name+".jsonl"), log, progress)
		if err != nil {
			return Table{}, err
		}
		if res == nil {
			continue // the table is rank 0's
		}
		row := rowOf(res, t.Datasets)
		row.Router = name
		row.Routing = routingOf(res, s.Env.Pool.Models())
		if t.results == nil {
			t.results = map[string][]rollout.QuestionResult{}
		}
		t.results[name] = res
		t.Rows = append(t.Rows, row)
	}
	return t, nil
}

// answerFile has router r (named name) answer the questions of qs that
// path (a results file keyed by the identity id computes) lacks, appending
// them to it, and returns every question's result in qs's order: on rank
// 0; other ranks answer their share and get nil.
func answerFile(ctx context.Context, s Setup, qs []data.Example, name string, r Router, id func() (identity, error),
	path string, log *slog.Logger, progress func(router string, done, total int)) ([]rollout.QuestionResult, error) {
	if log == nil {
		log = slog.Default()
	}
	g := s.Group
	if g == nil {
		g = procgroup.Single()
	}
	// Rank 0 alone takes, reads and appends to the results file; every
	// rank answers its share of what is left (shard.go).
	var done map[string]rollout.QuestionResult
	var f *os.File
	todo, err := sharedTodo(ctx, g, qs, func() ([]data.Example, error) {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return nil, fmt.Errorf("eval: %w", err)
		}
		id, err := id()
		if err != nil {
			return nil, err
		}
		if err := claimResults(path, id, log); err != nil {
			return nil, err
		}
		if done, err = readResults(path); err != nil {
			return nil, err
		}
		var todo []data.Example
		for _, q := range qs {
			if _, ok := done[q.ID]; !ok {
				todo = append(todo, q)
			}
		}
		if len(done) > 0 && len(todo) < len(qs) {
			log.Info("resuming", "router", name, "done", len(qs)-len(todo), "left", len(todo))
		}
		if f, err = os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); err != nil {
			return nil, fmt.Errorf("eval: %w", err)
		}
		return todo, nil
	})
	if err != nil {
		return nil, err
	}
	answered := len(qs) - len(todo)
	err = answerShared(ctx, g, r, name, todo, s.Batch, func(res []rollout.QuestionResult) error {
		var buf strings.Builder
		for _, q := range res {
			b, err := json.Marshal(q)
			if err != nil {
				return fmt.Errorf("eval: router %s, question %s: result does not encode: %w", name, q.ID, err)
			}
			buf.Write(b)
			buf.WriteByte('\n')
			done[q.ID] = q
		}
		// One write per batch: a kill loses at most the batch in flight,
		// and a torn line is skipped on the next run.
		if _, err := f.WriteString(buf.String()); err != nil {
			return fmt.Errorf("eval: %w", err)
		}
		answered += len(res)
		if progress != nil {
			progress(name, answered, len(qs))
		}
		return nil
	})
	if f != nil {
		f.Close()
	}
	if err != nil || g.Rank() != 0 {
		return nil, err
	}
	out := make([]rollout.QuestionResult, len(qs))
	for i, q := range qs {
		out[i] = done[q.ID]
	}
	return out, nil
}

// rowOf scores results (one per question) per dataset and averages the
// datasets' scores over the table's columns; cost and question counts are
// totals, and CostPerQuestion their ratio.
func rowOf(results []rollout.QuestionResult, datasets []string) Row {
	per, _ := rollout.Summarize(results)
	row := Row{Datasets: per}
	for _, d := range datasets { // the average over the table's columns
		sc := per[d]
		row.Avg.EM += sc.EM / float64(len(datasets))
		row.Avg.F1 += sc.F1 / float64(len(datasets))
		row.Avg.Calls += sc.Calls / float64(len(datasets))
		row.Avg.WellFormed += sc.WellFormed / float64(len(datasets))
		row.Avg.F1WellFormed += sc.F1WellFormed / float64(len(datasets))
		row.Avg.Closed += sc.Closed / float64(len(datasets))
		row.Avg.Cost += sc.Cost
		row.Avg.N += sc.N
	}
	if row.Avg.N > 0 {
		row.CostPerQuestion = row.Avg.Cost / float64(row.Avg.N)
	}
	return row
}

func datasetsOf(qs []data.Example) []string {
	var out []string
	seen := map[string]bool{}
	for _, k := range data.Known() { // the paper's column order
		for _, q := range qs {
			if q.Dataset == k && !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	return out
}

// readResults loads a results file, skipping a torn last line.
func readResults(path string) (map[string]rollout.QuestionResult, error) {
	out := map[string]rollout.QuestionResult{}
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("eval: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var r rollout.QuestionResult
		if json.Unmarshal(sc.Bytes(), &r) == nil && r.ID != "" {
			out[r.ID] = r
		}
	}
	return out, sc.Err()
}

// allRows are the routers' rows, then the reference rows.
func (t Table) allRows() []Row { return append(slices.Clone(t.Rows), t.References...) }

// labelWidth is the width of the rows' name column (at least min).
func labelWidth(rows []Row, min int) int {
	w := min
	for _, r := range rows {
		w = max(w, len([]rune(r.Label())))
	}
	return w
}

// ReferenceNote says what the reference rows are, under a table that has
// them.
const ReferenceNote = "reference rows, not routers: every pool model asked every question directly; " +
	"oracle = a question is right when any model's answer is (EM), at the cheapest right model's cost " +
	"(the cheapest model's when none is right); best = the model of the highest Avg EM; " +
	"cheapest = the model of the lowest cost per question"

// Text renders the table as the paper does: datasets as columns, Avg last,
// one block per metric; the reference rows below the routers'.
func (t Table) Text(w io.Writer) {
	lw := labelWidth(t.allRows(), 10)
	header := func(title string) {
		fmt.Fprintf(w, "\n%s\n%-*s", title, lw, "router")
		for _, d := range t.Datasets {
			name := d
			if t.inDomain(d) {
				name += "*"
			}
			fmt.Fprintf(w, " %9s", name)
		}
		fmt.Fprintf(w, " %9s\n", "Avg")
	}
	refHeader := func() {
		if len(t.References) > 0 {
			fmt.Fprintln(w, "-- reference")
		}
	}
	for _, metric := range []string{"EM", "F1"} {
		header(metric)
		for i, r := range t.allRows() {
			if i == len(t.Rows) {
				refHeader()
			}
			fmt.Fprintf(w, "%-*s", lw, r.Label())
			for _, d := range t.Datasets {
				fmt.Fprintf(w, " %9.3f", pick(metric, r.Datasets[d]))
			}
			fmt.Fprintf(w, " %9.3f\n", pick(metric, r.Avg))
		}
	}
	fmt.Fprintf(w, "\n%-*s %14s %12s %12s %12s %8s\n", lw, "router", "calls/question", "cost (USD)", "cost/question", "well-formed", "n")
	closed := false
	for i, r := range t.allRows() {
		if i == len(t.Rows) {
			refHeader()
		}
		fmt.Fprintf(w, "%-*s %14.2f %12.4f %12.6f %12.3f %8d\n", lw, r.Label(), r.Avg.Calls, r.Avg.Cost, r.CostPerQuestion, r.Avg.WellFormed, r.Avg.N)
		closed = closed || r.Avg.Closed > 0
	}
	t.routingText(w, lw)
	fmt.Fprintln(w, "\n* in-domain (trained on); the other datasets are out-of-domain")
	if len(t.References) > 0 {
		fmt.Fprintln(w, ReferenceNote)
	}
	if closed {
		fmt.Fprint(w, "responses with a looping tag closed by router.on_repeat = \"close\" (well-formed counts them):")
		sep := " "
		for _, r := range t.Rows {
			if r.Avg.Closed > 0 {
				fmt.Fprintf(w, "%s%s %.3f", sep, r.Router, r.Avg.Closed)
				sep = ", "
			}
		}
		fmt.Fprintln(w)
	}
}

// Markdown renders the EM and F1 tables as Markdown, the reference rows
// in italics below the routers'.
func (t Table) Markdown(w io.Writer) {
	for _, metric := range []string{"EM", "F1"} {
		fmt.Fprintf(w, "### %s\n\n| router |", metric)
		for _, d := range t.Datasets {
			if t.inDomain(d) {
				d += "†"
			}
			fmt.Fprintf(w, " %s |", d)
		}
		fmt.Fprint(w, " Avg | calls/q | cost | cost/q | well-formed |\n|---|")
		for range t.Datasets {
			fmt.Fprint(w, "---|")
		}
		fmt.Fprint(w, "---|---|---|---|---|\n")
		for i, r := range t.allRows() {
			label := r.Label()
			if i >= len(t.Rows) {
				label = "*" + label + "* (reference)"
			}
			fmt.Fprintf(w, "| %s |", label)
			for _, d := range t.Datasets {
				sc := r.Datasets[d]
				fmt.Fprintf(w, " %.3f |", pick(metric, sc))
			}
			fmt.Fprintf(w, " **%.3f** | %.2f | %.4f | %.6f | %.3f |\n", pick(metric, r.Avg), r.Avg.Calls, r.Avg.Cost, r.CostPerQuestion, r.Avg.WellFormed)
		}
		fmt.Fprint(w, "\n† in-domain\n\n")
		if len(t.References) > 0 {
			fmt.Fprintf(w, "Reference %s.\n\n", strings.TrimPrefix(ReferenceNote, "reference "))
		}
	}
	t.routingMarkdown(w)
}

func pick(metric string, s rollout.Score) float64 {
	if metric == "EM" {
		return s.EM
	}
	return s.F1
}

// CSV writes one line per row and dataset (and "avg"); a reference row's
// router column is empty and its reference and model columns say what it
// is.
func (t Table) CSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	cw.Write([]string{"router", "reference", "model", "dataset", "em", "f1", "calls_per_question", "cost", "cost_per_question", "well_formed", "n"})
	for _, r := range t.allRows() {
		for _, d := range append(append([]string{}, t.Datasets...), "avg") {
			sc, cpq := r.Avg, r.CostPerQuestion
			if d != "avg" {
				sc = r.Datasets[d]
				cpq = 0
				if sc.N > 0 {
					cpq = sc.Cost / float64(sc.N)
				}
			}
			cw.Write([]string{r.Router, r.Reference, r.Model, d, fmt.Sprintf("%.4f", sc.EM), fmt.Sprintf("%.4f", sc.F1), fmt.Sprintf("%.4f", sc.Calls),
				fmt.Sprintf("%.6f", sc.Cost), fmt.Sprintf("%.8f", cpq), fmt.Sprintf("%.4f", sc.WellFormed), fmt.Sprint(sc.N)})
		}
	}
	cw.Flush()
	return cw.Error()
}

// Write saves table.json, table.csv and table.md in dir, each atomically.
func (t Table) Write(dir string) error { return writeTable(dir, t) }

// writeTable saves t as table.json, table.csv and table.md in dir, each
// atomically.
func writeTable(dir string, t interface {
	CSV(io.Writer) error
	Markdown(io.Writer)
}) error {
	writers := map[string]func(io.Writer) error{
		"table.json": func(w io.Writer) error {
			e := json.NewEncoder(w)
			e.SetIndent("", "  ")
			return e.Encode(t)
		},
		"table.csv": t.CSV,
		"table.md":  func(w io.Writer) error { t.Markdown(w); return nil },
	}
	for name, fn := range writers {
		if err := atomicfile.Write(filepath.Join(dir, name), fn); err != nil {
			return err
		}
	}
	return nil
}
