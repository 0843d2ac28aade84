package ablate

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/recal-project/recal/eval"
	"github.com/recal-project/recal/internal/atomicfile"
)

// Full is the ablation name (calibration.Ablation) of full ReCal.
const Full = "recal"

// Variant is one row of the study: an ablation name of
// calibration.Ablation and the paper's label for it.
type Variant struct {
	Name  string `json:"variant"`
	Label string `json:"label"`
}

// Variants are the study's rows in the order of the paper's Table 3: the
// most ablated first, full ReCal last. LSC is learning-signal clarity
// calibration (gating and CAE), CAE component-wise advantage estimation,
// DAO distribution-aware optimisation (variance reweighting and dataset
// normalisation).
var Variants = []Variant{
	{"wo_both", "w/o both"},
	{"wo_lsc", "w/o LSC"},
	{"wo_cae", "w/o CAE"},
	{"wo_dao", "w/o DAO"},
	{Full, "ReCal (full)"},
}

// Names of the average columns, after the datasets'.
const (
	ColInDomain    = "id_avg"  // mean over the in-domain datasets (data.train's)
	ColOutOfDomain = "ood_avg" // mean over the out-of-domain datasets
	ColAverage     = "avg"     // mean over every dataset of the table
	// ColCost is the cost per question in USD (all the table's questions),
	// the last column, so that exact match can be read against cost.
	ColCost = "cost_per_q"
)

// StdKind says which standard deviation the table's ± is.
const StdKind = "sample standard deviation over seeds (n-1 denominator); no ± with one seed"

// Result is one evaluated run: a variant trained with one seed, its exact
// match per test dataset.
type Result struct {
	Variant string             `json:"variant"`
	Seed    int64              `json:"seed"`
	EM      map[string]float64 `json:"em"`
	// CostPerQuestion is the pool's cost per question in USD, over every
	// dataset's questions.
	CostPerQuestion float64 `json:"cost_per_question"`
}

// Stat is a mean over seeds and its sample standard deviation (Bessel's
// n-1 denominator), 0 when N = 1.
type Stat struct {
	Mean float64 `json:"mean"`
	Std  float64 `json:"std"`
	N    int     `json:"n"`
}

// MeanStd is the mean of xs and their sample standard deviation
// sqrt(Σ(x-mean)²/(n-1)); with one value the deviation is 0. xs must not be
// empty.
func MeanStd(xs []float64) Stat {
	s := Stat{N: len(xs)}
	for _, x := range xs {
		s.Mean += x
	}
	s.Mean /= float64(len(xs))
	if len(xs) > 1 {
		var ss float64
		for _, x := range xs {
			ss += (x - s.Mean) * (x - s.Mean)
		}
		s.Std = math.Sqrt(ss / float64(len(xs)-1))
	}
	return s
}

// String is "mean ± std" with three decimals, or the mean alone for one
// seed.
func (s Stat) String() string { return s.format(3) }

func (s Stat) format(decimals int) string {
	if s.N < 2 {
		return fmt.Sprintf("%.*f", decimals, s.Mean)
	}
	return fmt.Sprintf("%.*f ± %.*f", decimals, s.Mean, decimals, s.Std)
}

// cell is a column's cell as text: three decimals, six for the cost.
func cell(col string, s Stat) string {
	if col == ColCost {
		return s.format(6)
	}
	return s.String()
}

// Row is one variant's line of the table.
type Row struct {
	Variant
	Cells   map[string]Stat `json:"cells"` // by column
	PerSeed []SeedRow       `json:"per_seed"`
}

// SeedRow is one seed's values of a row, by column (datasets, averages and
// cost).
type SeedRow struct {
	Seed   int64              `json:"seed"`
	Values map[string]float64 `json:"em"`
}

// Table is the study's result, shaped like the paper's Table 3: a row per
// variant, exact match per dataset, then the in-domain, out-of-domain and
// overall averages, each cell a mean ± std over seeds, and the cost per
// question; then the reference rows (oracle, best and cheapest single
// model: eval.References), one value each.
type Table struct {
	Datasets   []string `json:"datasets"`
	InDomain   []string `json:"in_domain"` // the datasets trained on (data.train); the others are out of domain
	Columns    []string `json:"columns"`   // Datasets, then the averages that have datasets, then ColCost
	Seeds      []int64  `json:"seeds"`
	Std        string   `json:"std"`
	Notes      []string `json:"notes,omitempty"` // said under the table (steps, split, …)
	Rows       []Row    `json:"rows"`
	References []Row    `json:"references,omitempty"` // no per-seed values: the pool's answers do not depend on the seed
}

// Summarize builds the table of results over seeds: for each variant and
// seed the exact match per dataset and its averages (each average taken
// within the seed's run; inDomain are the datasets trained on), and the
// cost per question, then per column the mean and sample standard
// deviation of those per-seed values. Every variant of variants needs a
// result for every seed with every dataset.
func Summarize(results []Result, datasets, inDomain []string, seeds []int64, variants []Variant) (Table, error) {
	var id, ood []string
	for _, d := range datasets {
		if slices.Contains(inDomain, d) {
			id = append(id, d)
		} else {
			ood = append(ood, d)
		}
	}
	groups := []struct {
		col string
		ds  []string
	}{{ColInDomain, id}, {ColOutOfDomain, ood}, {ColAverage, datasets}}
	t := Table{Datasets: datasets, InDomain: inDomain, Columns: slices.Clone(datasets), Seeds: seeds, Std: StdKind}
	for _, g := range groups {
		if len(g.ds) > 0 {
			t.Columns = append(t.Columns, g.col)
		}
	}
	t.Columns = append(t.Columns, ColCost)
	if len(datasets) == 0 || len(seeds) == 0 {
		return t, fmt.Errorf("ablate: a table needs datasets and seeds")
	}
	for _, v := range variants {
		row := Row{Variant: v, Cells: map[string]Stat{}}
		for _, seed := range seeds {
			i := slices.IndexFunc(results, func(r Result) bool { return r.Variant == v.Name && r.Seed == seed })
			if i < 0 {
				return t, fmt.Errorf("ablate: no result for variant %s, seed %d", v.Name, seed)
			}
			sr := SeedRow{Seed: seed, Values: map[string]float64{}}
			for _, d := range datasets {
				em, ok := results[i].EM[d]
				if !ok {
					return t, fmt.Errorf("ablate: variant %s, seed %d: no exact match on %s", v.Name, seed, d)
				}
				sr.Values[d] = em
			}
			for _, g := range groups {
				if len(g.ds) == 0 {
					continue
				}
				var sum float64
				for _, d := range g.ds {
					sum += sr.Values[d]
				}
				sr.Values[g.col] = sum / float64(len(g.ds))
			}
			sr.Values[ColCost] = results[i].CostPerQuestion
			row.PerSeed = append(row.PerSeed, sr)
		}
		for _, c := range t.Columns {
			xs := make([]float64, len(row.PerSeed))
			for k, sr := range row.PerSeed {
				xs[k] = sr.Values[c]
			}
			row.Cells[c] = MeanStd(xs)
		}
		t.Rows = append(t.Rows, row)
	}
	return t, nil
}

// AddReferences turns eval's reference rows (eval.References) into the
// table's: exact match per dataset, the averages as the variants' are
// taken, and the cost per question, each a single value.
func (t *Table) AddReferences(refs []eval.Row) {
	for _, r := range refs {
		row := Row{Variant: Variant{Name: r.Reference, Label: r.Label()}, Cells: map[string]Stat{}}
		vals := map[string]float64{ColCost: r.CostPerQuestion}
		var sum, sumID, sumOOD float64
		var nID, nOOD int
		for _, d := range t.Datasets {
			em := r.Datasets[d].EM
			vals[d], sum = em, sum+em
			if slices.Contains(t.InDomain, d) {
				sumID, nID = sumID+em, nID+1
			} else {
				sumOOD, nOOD = sumOOD+em, nOOD+1
			}
		}
		vals[ColAverage] = sum / float64(len(t.Datasets))
		if nID > 0 {
			vals[ColInDomain] = sumID / float64(nID)
		}
		if nOOD > 0 {
			vals[ColOutOfDomain] = sumOOD / float64(nOOD)
		}
		for _, c := range t.Columns {
			row.Cells[c] = Stat{Mean: vals[c], N: 1}
		}
		t.References = append(t.References, row)
	}
}

// header is a column's title: the dataset († when in-domain) or the
// average's name.
func (t Table) header(col string) string {
	switch col {
	case ColInDomain:
		return "ID avg"
	case ColOutOfDomain:
		return "OOD avg"
	case ColAverage:
		return "Avg"
	case ColCost:
		return "cost/q"
	}
	if slices.Contains(t.InDomain, col) {
		return col + "†"
	}
	return col
}

func (t Table) seedList() string {
	s := make([]string, len(t.Seeds))
	for i, v := range t.Seeds {
		s[i] = strconv.FormatInt(v, 10)
	}
	return strings.Join(s, ", ")
}

// caption says what a cell is.
func (t Table) caption() string {
	if len(t.Seeds) < 2 {
		return fmt.Sprintf("Exact match, seed %s (one seed: no ±).", t.seedList())
	}
	return fmt.Sprintf("Exact match, mean ± sample standard deviation (n−1) over seeds %s.", t.seedList())
}

// Text prints the table with aligned columns.
func (t Table) Text(w io.Writer) {
	rows := append(slices.Clone(t.Rows), t.References...)
	width, lw := 6, 14
	for _, r := range rows {
		lw = max(lw, len([]rune(r.Label)))
		for _, c := range t.Columns {
			width = max(width, len([]rune(cell(c, r.Cells[c]))))
		}
	}
	fmt.Fprintf(w, "\n%s\n%-*s", t.caption(), lw, "variant")
	for _, c := range t.Columns {
		fmt.Fprintf(w, " %*s", width, t.header(c))
	}
	fmt.Fprintln(w)
	for i, r := range rows {
		if i == len(t.Rows) {
			fmt.Fprintln(w, "-- reference")
		}
		fmt.Fprintf(w, "%-*s", lw, r.Label)
		for _, c := range t.Columns {
			s := cell(c, r.Cells[c])
			fmt.Fprintf(w, " %s%s", strings.Repeat(" ", width-len([]rune(s))), s)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "† in-domain (trained on); cost/q: USD per question")
	if len(t.References) > 0 {
		fmt.Fprintln(w, eval.ReferenceNote)
	}
	for _, n := range t.Notes {
		fmt.Fprintln(w, n)
	}
}

// Markdown renders the table as the paper lays it out.
func (t Table) Markdown(w io.Writer) {
	fmt.Fprint(w, "| Method |")
	for _, c := range t.Columns {
		fmt.Fprintf(w, " %s |", t.header(c))
	}
	fmt.Fprint(w, "\n|---|")
	for range t.Columns {
		fmt.Fprint(w, "---|")
	}
	fmt.Fprintln(w)
	for i, r := range append(slices.Clone(t.Rows), t.References...) {
		label := r.Label
		if i >= len(t.Rows) {
			label = "*" + label + "* (reference)"
		}
		fmt.Fprintf(w, "| %s |", label)
		for _, c := range t.Columns {
			fmt.Fprintf(w, " %s |", cell(c, r.Cells[c]))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "\n%s † in-domain. cost/q: USD per question.\n", t.caption())
	if len(t.References) > 0 {
		fmt.Fprintf(w, "Reference %s.\n", strings.TrimPrefix(eval.ReferenceNote, "reference "))
	}
	for _, n := range t.Notes {
		fmt.Fprintf(w, "%s\n", n)
	}
}

// CSV writes one line per variant and column: the mean, the standard
// deviation, the number of seeds and each seed's value (seed_<N>); then a
// line per reference row and column (n 1, no per-seed values).
func (t Table) CSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	head := []string{"variant", "label", "column", "mean", "std", "n"}
	for _, s := range t.Seeds {
		head = append(head, "seed_"+strconv.FormatInt(s, 10))
	}
	cw.Write(head)
	for _, r := range append(slices.Clone(t.Rows), t.References...) {
		for _, c := range t.Columns {
			st, f := r.Cells[c], "%.6f"
			if c == ColCost {
				f = "%.8f"
			}
			line := []string{r.Name, r.Label, c, fmt.Sprintf(f, st.Mean), fmt.Sprintf(f, st.Std), strconv.Itoa(st.N)}
			for _, sr := range r.PerSeed {
				line = append(line, fmt.Sprintf(f, sr.Values[c]))
			}
			for range len(t.Seeds) - len(r.PerSeed) { // a reference row has none
				line = append(line, "")
			}
			cw.Write(line)
		}
	}
	cw.Flush()
	return cw.Error()
}

// Write saves ablation.json, ablation.csv and ablation.md in dir, each
// atomically.
func (t Table) Write(dir string) error {
	for _, f := range []struct {
		name  string
		write func(io.Writer) error
	}{
		{"ablation.json", func(w io.Writer) error {
			e := json.NewEncoder(w)
			e.SetIndent("", "  ")
			return e.Encode(t)
		}},
		{"ablation.csv", t.CSV},
		{"ablation.md", func(w io.Writer) error { t.Markdown(w); return nil }},
	} {
		if err := atomicfile.Write(filepath.Join(dir, f.name), f.write); err != nil {
			return fmt.Errorf("ablate: %w", err)
		}
	}
	return nil
}
