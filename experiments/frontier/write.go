package frontier

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/recal-project/recal/internal/atomicfile"
	"github.com/recal-project/recal/internal/plot"
)

// Write saves frontier.json, frontier.csv, frontier.md and the figure
// frontier.png and frontier.svg into dir, each atomically.
func (r Report) Write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("frontier: %w", err)
	}
	writers := []struct {
		name string
		fn   func(io.Writer) error
	}{
		{"frontier.json", func(w io.Writer) error {
			e := json.NewEncoder(w)
			e.SetIndent("", "  ")
			return e.Encode(r)
		}},
		{"frontier.csv", r.CSV},
		{"frontier.md", r.Markdown},
	}
	for _, wr := range writers {
		if err := atomicfile.Write(filepath.Join(dir, wr.name), wr.fn); err != nil {
			return err
		}
	}
	_, err := plot.Frontier("EM against cost per question", r.series(), dir, "frontier")
	return err
}

// series are the figure's: each family's points and hull, the single
// models labelled, the oracle as a reference mark.
func (r Report) series() []plot.FrontierSeries {
	var out []plot.FrontierSeries
	for _, f := range r.Families {
		s := plot.FrontierSeries{Name: f.Name, Reference: f.Name == FamilyOracle}
		for _, p := range r.Points {
			if p.Family != f.Name {
				continue
			}
			s.Points = append(s.Points, [2]float64{p.Cost, p.EM})
			if f.Name == FamilySingle {
				s.Labels = append(s.Labels, p.Label)
			}
		}
		if f.Name != FamilyOracle {
			for _, v := range f.Hull {
				s.Hull = append(s.Hull, [2]float64{v.Cost, v.EM})
			}
		}
		out = append(out, s)
	}
	return out
}

// CSV writes one line per point.
func (r Report) CSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	cw.Write([]string{"family", "label", "setting", "em", "f1", "cost_per_question", "calls_per_question", "vs_single_hull", "max_call_share", "max_call_share_model", "group"})
	for _, p := range r.Points {
		setting := ""
		if p.Setting != nil {
			setting = fmtSetting(*p.Setting)
		}
		share, model := "", ""
		if p.Shares != nil {
			m, s := p.MaxShare()
			share, model = fmt.Sprintf("%.4f", s), m
		}
		cw.Write([]string{p.Family, p.Label, setting, fmt.Sprintf("%.4f", p.EM), fmt.Sprintf("%.4f", p.F1),
			fmt.Sprintf("%.8f", p.Cost), fmt.Sprintf("%.4f", p.Calls), p.Mark, share, model, p.Group})
	}
	cw.Flush()
	return cw.Error()
}

// Markdown writes the points and the families as tables.
func (r Report) Markdown(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "### Operating points\n\n| family | point | EM | F1 | cost / question, USD | calls / question | vs single models' hull | largest share of calls |\n|---|---|---|---|---|---|---|---|\n")
	for _, p := range r.Points {
		share := "–"
		if p.Shares != nil {
			m, s := p.MaxShare()
			share = fmt.Sprintf("%.1f%% %s", 100*s, m)
		}
		fmt.Fprintf(&b, "| %s | %s | %.3f | %.3f | %.6f | %.2f | %s | %s |\n", p.Family, p.Label, p.EM, p.F1, p.Cost, p.Calls, p.Mark, share)
	}
	if len(r.Seeds) > 0 {
		fmt.Fprintf(&b, "\n### Seeds\n\nEach policy given as seeds (checkpoints joined with +): the mean of its seeds' points ± their sample standard deviation, and the single models' hull at the mean cost. Above: the mean EM exceeds the hull's by more than the EM's standard deviation.\n\n")
		fmt.Fprintf(&b, "| policy | seeds | EM | F1 | cost / question, USD | calls / question | hull's EM there | margin | above | largest share of calls (mean) |\n|---|---|---|---|---|---|---|---|---|---|\n")
		for _, s := range r.Seeds {
			fmt.Fprintf(&b, "| %s | %d | %.3f ± %.3f | %.3f | %.6f ± %.6f | %.2f | %s | %s | %s | %.1f%% %s |\n", s.Group, s.Seeds, s.EM, s.EMStd, s.F1, s.Cost, s.CostStd, s.Calls,
				opt(s.HullEM, "%.3f"), opt(s.Margin, "%+.3f"), map[bool]string{true: "yes", false: "no"}[s.Above], 100*s.MaxShare, s.MaxModel)
		}
	}
	fmt.Fprintf(&b, "\n### Families\n\nBest single model: %s, EM %.3f at %.6f USD per question. AIQ: the mean EM of a family's upper hull over the single models' cost range [%.6f, %.6f] (0 below its cheapest point).\n\n",
		r.Best, r.BestEM, r.BestCost, r.CostRange[0], r.CostRange[1])
	fmt.Fprintf(&b, "| family | points | above the hull | AIQ | cost to reach %.3f EM | EM at %.6f USD | hull (cost, EM) |\n|---|---|---|---|---|---|---|\n", r.BestEM, r.BestCost/2)
	for _, f := range r.Families {
		var hull []string
		for _, v := range f.Hull {
			hull = append(hull, fmt.Sprintf("(%.6f, %.3f)", v.Cost, v.EM))
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %s | %s | %s | %s |\n", f.Name, f.Points, f.Above, opt(f.AIQ, "%.3f"), opt(f.ReachCost, "%.6f"), opt(f.EMAtHalf, "%.3f"), strings.Join(hull, " "))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func opt(p *float64, format string) string {
	if p == nil {
		return "–"
	}
	return fmt.Sprintf(format, *p)
}
