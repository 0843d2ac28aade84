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
	"strings"

	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/dist"
	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/rollout"
)

// Row is one router's line of the table.
type Row struct {
	Router   string                   `json:"router"`
	Datasets map[string]rollout.Score `json:"datasets"`
	Avg      rollout.Score            `json:"avg"` // mean over the table's datasets
}

// Table is an evaluation's result: routers as rows, datasets as columns.
type Table struct {
	Datasets []string `json:"datasets"`
	Rows     []Row    `json:"rows"`
}

// Run evaluates each router on qs, appending per-question results to
// outDir/results-<router>.jsonl; questions already there are not asked again,
// so an interrupted run resumes where it stopped. A file is resumed only when
// it holds the answers of the same inputs (checkpoint contents, pool, …; see
// identity.go); otherwise it is moved aside and the router starts afresh.
// progress, if not nil, is called after each batch.
func Run(ctx context.Context, s Setup, qs []data.Example, routers []string, outDir string, log *slog.Logger,
	progress func(router string, done, total int)) (Table, error) {
	if log == nil {
		log = slog.Default()
	}
	g := s.Group
	if g == nil {
		g = dist.Single()
	}
	if g.Rank() == 0 {
		if err := os.MkdirAll(outDir, 0o755); err != nil {
			return Table{}, fmt.Errorf("eval: %w", err)
		}
	}
	t := Table{Datasets: datasetsOf(qs)}
	memo := map[string]json.RawMessage{}
	for _, name := range routers {
		r, err := NewRouter(name, s)
		if err != nil {
			return Table{}, err
		}
		if c, ok := r.(io.Closer); ok {
			defer c.Close() // a router holding its own policy (sft)
		}
		path := filepath.Join(outDir, "results-"+name+".jsonl")
		// Rank 0 alone takes, reads and appends to the results file; every
		// rank answers its share of what is left (shard.go).
		var done map[string]rollout.QuestionResult
		var f *os.File
		todo, err := sharedTodo(ctx, g, qs, func() ([]data.Example, error) {
			id, err := identityOf(name, s, memo)
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
			return Table{}, err
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
		if err != nil {
			return Table{}, err
		}
		if g.Rank() != 0 {
			continue // the table is rank 0's
		}
		var mine []rollout.QuestionResult
		for _, q := range qs {
			mine = append(mine, done[q.ID])
		}
		per, _ := rollout.Summarize(mine)
		row := Row{Router: name, Datasets: per}
		for _, d := range t.Datasets { // the average over the table's columns
			sc := per[d]
			row.Avg.EM += sc.EM / float64(len(t.Datasets))
			row.Avg.F1 += sc.F1 / float64(len(t.Datasets))
			row.Avg.Calls += sc.Calls / float64(len(t.Datasets))
			row.Avg.WellFormed += sc.WellFormed / float64(len(t.Datasets))
			row.Avg.F1WellFormed += sc.F1WellFormed / float64(len(t.Datasets))
			row.Avg.Closed += sc.Closed / float64(len(t.Datasets))
			row.Avg.Cost += sc.Cost
			row.Avg.N += sc.N
		}
		t.Rows = append(t.Rows, row)
	}
	return t, nil
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

// Text renders the table as the paper does: datasets as columns, Avg last,
// one block per metric.
func (t Table) Text(w io.Writer) {
	header := func(title string) {
		fmt.Fprintf(w, "\n%s\n%-10s", title, "router")
		for _, d := range t.Datasets {
			name := d
			if data.IsInDomain(d) {
				name += "*"
			}
			fmt.Fprintf(w, " %9s", name)
		}
		fmt.Fprintf(w, " %9s\n", "Avg")
	}
	for _, metric := range []struct {
		title string
		get   func(rollout.Score) float64
	}{{"EM", func(s rollout.Score) float64 { return s.EM }}, {"F1", func(s rollout.Score) float64 { return s.F1 }}} {
		header(metric.title)
		for _, r := range t.Rows {
			fmt.Fprintf(w, "%-10s", r.Router)
			for _, d := range t.Datasets {
				fmt.Fprintf(w, " %9.3f", metric.get(r.Datasets[d]))
			}
			fmt.Fprintf(w, " %9.3f\n", metric.get(r.Avg))
		}
	}
	fmt.Fprintf(w, "\n%-10s %14s %12s %12s %8s\n", "router", "calls/question", "cost (USD)", "well-formed", "n")
	closed := false
	for _, r := range t.Rows {
		fmt.Fprintf(w, "%-10s %14.2f %12.4f %12.3f %8d\n", r.Router, r.Avg.Calls, r.Avg.Cost, r.Avg.WellFormed, r.Avg.N)
		closed = closed || r.Avg.Closed > 0
	}
	fmt.Fprintln(w, "\n* in-domain (trained on); the other datasets are out-of-domain")
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

// Markdown renders the EM and F1 tables as Markdown.
func (t Table) Markdown(w io.Writer) {
	for _, metric := range []string{"EM", "F1"} {
		fmt.Fprintf(w, "### %s\n\n| router |", metric)
		for _, d := range t.Datasets {
			if data.IsInDomain(d) {
				d += "†"
			}
			fmt.Fprintf(w, " %s |", d)
		}
		fmt.Fprint(w, " Avg | calls/q | cost | well-formed |\n|---|")
		for range t.Datasets {
			fmt.Fprint(w, "---|")
		}
		fmt.Fprint(w, "---|---|---|---|\n")
		for _, r := range t.Rows {
			fmt.Fprintf(w, "| %s |", r.Router)
			for _, d := range t.Datasets {
				sc := r.Datasets[d]
				fmt.Fprintf(w, " %.3f |", pick(metric, sc))
			}
			fmt.Fprintf(w, " **%.3f** | %.2f | %.4f | %.3f |\n", pick(metric, r.Avg), r.Avg.Calls, r.Avg.Cost, r.Avg.WellFormed)
		}
		fmt.Fprint(w, "\n† in-domain\n\n")
	}
}

func pick(metric string, s rollout.Score) float64 {
	if metric == "EM" {
		return s.EM
	}
	return s.F1
}

// CSV writes one line per router and dataset (and "avg").
func (t Table) CSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	cw.Write([]string{"router", "dataset", "em", "f1", "calls_per_question", "cost", "well_formed", "n"})
	for _, r := range t.Rows {
		for _, d := range append(append([]string{}, t.Datasets...), "avg") {
			sc := r.Avg
			if d != "avg" {
				sc = r.Datasets[d]
			}
			cw.Write([]string{r.Router, d, fmt.Sprintf("%.4f", sc.EM), fmt.Sprintf("%.4f", sc.F1), fmt.Sprintf("%.4f", sc.Calls),
				fmt.Sprintf("%.6f", sc.Cost), fmt.Sprintf("%.4f", sc.WellFormed), fmt.Sprint(sc.N)})
		}
	}
	cw.Flush()
	return cw.Error()
}

// Write saves table.json, table.csv and table.md in dir, each atomically.
func (t Table) Write(dir string) error {
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
		if err := hfmodel.WriteAtomic(filepath.Join(dir, name), fn); err != nil {
			return err
		}
	}
	return nil
}
