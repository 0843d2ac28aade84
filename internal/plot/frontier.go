package plot

import (
	"fmt"
	"image/color"
	"math"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// FrontierSeries is one family of operating points of the cost–quality
// figure (package frontier).
type FrontierSeries struct {
	Name string
	// Points are (cost per question in USD, EM).
	Points [][2]float64
	// Labels, when given, name each point on the figure (the single
	// models).
	Labels []string
	// Hull, when given, is drawn as a line through its (cost, EM) vertices.
	Hull [][2]float64
	// Reference draws the series as a black star (the oracle).
	Reference bool
}

// Frontier draws EM against cost per question, cost on a log axis: each
// series' points and hull, in the palette's colours, and writes name.png
// and name.svg into dir. A log axis has no 0: a point that cost nothing is
// drawn at a tenth of the cheapest positive cost and labelled "(free)".
func Frontier(title string, series []FrontierSeries, dir, name string) ([]string, error) {
	floor := math.Inf(1)
	for _, s := range series {
		for _, p := range s.Points {
			if p[0] > 0 {
				floor = math.Min(floor, p[0])
			}
		}
	}
	if math.IsInf(floor, 1) {
		return nil, fmt.Errorf("plot: %s: no point costs more than 0: no log cost axis", name)
	}
	floor /= 10
	x := func(c float64) float64 { return math.Max(c, floor) }

	p, leg := newPlot(title, "cost per question, USD (log scale)", "EM")
	p.X.Scale = gplot.LogScale{}
	p.X.Tick.Marker = gplot.LogTicks{Prec: -1}

	lo, hi := math.Inf(1), math.Inf(-1)
	for i, s := range series {
		col := palette[i%len(palette)]
		var thumbs []gplot.Thumbnailer
		if len(s.Hull) > 1 {
			xys := make(plotter.XYs, len(s.Hull))
			for k, v := range s.Hull {
				xys[k] = plotter.XY{X: x(v[0]), Y: v[1]}
			}
			line, err := plotter.NewLine(xys)
			if err != nil {
				return nil, fmt.Errorf("plot: %s: series %q: hull: %w", name, s.Name, err)
			}
			line.LineStyle = draw.LineStyle{Color: col, Width: vg.Points(1.5)}
			if s.Name == "single" {
				line.LineStyle.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
			}
			p.Add(line)
			thumbs = append(thumbs, line)
		}
		if len(s.Points) == 0 {
			continue
		}
		xys := make(plotter.XYs, len(s.Points))
		labels := make([]string, len(s.Points))
		for k, v := range s.Points {
			xys[k] = plotter.XY{X: x(v[0]), Y: v[1]}
			lo, hi = math.Min(lo, v[1]), math.Max(hi, v[1])
			if k < len(s.Labels) {
				labels[k] = s.Labels[k]
				if v[0] <= 0 {
					labels[k] += " (free)"
				}
			}
		}
		dots, err := plotter.NewScatter(xys)
		if err != nil {
			return nil, fmt.Errorf("plot: %s: series %q: %w", name, s.Name, err)
		}
		dots.GlyphStyle = draw.GlyphStyle{Color: col, Radius: vg.Points(3), Shape: draw.CircleGlyph{}}
		if s.Reference {
			dots.GlyphStyle = draw.GlyphStyle{Color: color.Black, Radius: vg.Points(5), Shape: draw.PlusGlyph{}}
		}
		p.Add(dots)
		thumbs = append(thumbs, dots)
		if len(s.Labels) > 0 {
			l, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: labels})
			if err != nil {
				return nil, fmt.Errorf("plot: %s: series %q: labels: %w", name, s.Name, err)
			}
			for k := range l.TextStyle {
				l.TextStyle[k].Font.Size = vg.Points(9)
			}
			l.Offset = vg.Point{X: vg.Points(4), Y: vg.Points(4)}
			p.Add(l)
		}
		leg.Add(s.Name, thumbs...)
	}
	p.Y.Min, p.Y.Max = math.Max(0, lo-0.05), math.Min(1, hi+0.05)
	widenFlat(&p.Y)
	return saveFigure(dir, name, p, leg)
}
