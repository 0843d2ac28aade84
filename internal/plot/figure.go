package plot

import (
	"bytes"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Size of every figure. The SVG has the same size in points as the PNG in
// inches at DPI.
const (
	PNGWidth  = 1000 // pixels
	PNGHeight = 560  // pixels
	DPI       = 100  // PNG dots per inch
)

var (
	figWidth  = vg.Length(PNGWidth) / DPI * vg.Inch
	figHeight = vg.Length(PNGHeight) / DPI * vg.Inch
	margin    = 0.15 * vg.Inch // blank border around the figure
	gap       = 0.2 * vg.Inch  // between the plot and the legend
)

// palette is matplotlib's "tab10", which stays distinguishable when
// lightened for the per-step lines.
var palette = []color.RGBA{
	{0x1f, 0x77, 0xb4, 0xff}, {0xff, 0x7f, 0x0e, 0xff}, {0x2c, 0xa0, 0x2c, 0xff},
	{0xd6, 0x27, 0x28, 0xff}, {0x94, 0x67, 0xbd, 0xff}, {0x8c, 0x56, 0x4b, 0xff},
	{0xe3, 0x77, 0xc2, 0xff}, {0x7f, 0x7f, 0x7f, 0xff}, {0xbc, 0xbd, 0x22, 0xff},
	{0x17, 0xbe, 0xcf, 0xff},
}

// figure is one chart, drawn the same way to PNG and SVG.
type figure struct {
	name           string // file stem: name.png, name.svg
	title          string
	xLabel, yLabel string
	series         []series
	// window > 1 draws each series faint at every point and bold as its
	// trailing moving average over window points.
	window int
	// points marks every data point, for sparse series such as validations.
	points bool
	// unitY fixes the y axis to [0, 1] (shares), widening it only if a value
	// falls outside.
	unitY bool
	// emphasis, if set, is drawn last in black, dashed and thicker (the
	// average over datasets).
	emphasis *series
}

// newPlot is a plot with recal's title style, axis labels, six nice ticks
// on y and a grey grid, and an empty legend of recal's style (top left),
// for the caller to fill: every figure of the package starts from it.
func newPlot(title, xLabel, yLabel string) (*gplot.Plot, gplot.Legend) {
	p := gplot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(14)
	p.Title.Padding = vg.Points(8)
	p.X.Label.Text = xLabel
	p.Y.Label.Text = yLabel
	p.Y.Tick.Marker = niceTicks{want: 6}
	grid := plotter.NewGrid()
	grid.Vertical.Color = color.Gray{Y: 0xd8}
	grid.Horizontal.Color = color.Gray{Y: 0xd8}
	p.Add(grid)

	leg := gplot.NewLegend()
	leg.Top, leg.Left = true, true
	leg.ThumbnailWidth = vg.Points(24)
	leg.Padding = vg.Points(4)
	return p, leg
}

// build makes the gonum plot and its legend. The legend is drawn beside the
// plot rather than over the data, so it is kept out of p.Legend.
func (f *figure) build() (*gplot.Plot, gplot.Legend, error) {
	p, leg := newPlot(f.title, f.xLabel, f.yLabel)
	p.X.Label.TextStyle.Font.Size = vg.Points(12)
	p.Y.Label.TextStyle.Font.Size = vg.Points(12)
	p.X.Tick.Marker = niceTicks{want: 8}

	all := f.series
	if f.emphasis != nil {
		all = append(all[:len(all):len(all)], *f.emphasis)
	}
	// Bands first, so that no band covers another series' line.
	for i, s := range all {
		if len(s.lo) == 0 {
			continue
		}
		ring := append(append(plotter.XYs{}, s.lo...), s.hi...)
		slices.Reverse(ring[len(s.lo):])
		band, err := plotter.NewPolygon(ring)
		if err != nil {
			return nil, leg, fmt.Errorf("plot: %s: series %q: band: %w", f.name, s.name, err)
		}
		c := palette[i%len(palette)]
		band.Color = color.NRGBA{R: c.R, G: c.G, B: c.B, A: 0x40} // translucent: overlapping bands stay visible
		band.LineStyle = draw.LineStyle{}
		p.Add(band)
	}
	for i, s := range all {
		col := palette[i%len(palette)]
		style := draw.LineStyle{Color: col, Width: vg.Points(1.5)}
		if f.emphasis != nil && i == len(all)-1 {
			style = draw.LineStyle{Color: color.Black, Width: vg.Points(2.5), Dashes: []vg.Length{vg.Points(6), vg.Points(3)}}
		}
		smooth := f.window > 1 && len(s.xys) > 1
		if smooth {
			raw, err := plotter.NewLine(s.xys)
			if err != nil {
				return nil, leg, fmt.Errorf("plot: %s: series %q: %w", f.name, s.name, err)
			}
			raw.LineStyle = draw.LineStyle{Color: lighten(col, 0.6), Width: vg.Points(0.8)}
			p.Add(raw)
			style.Width = vg.Points(2.2)
		}
		data := s.xys
		if smooth {
			data = movingAverage(s.xys, f.window)
		}
		line, err := plotter.NewLine(data)
		if err != nil {
			return nil, leg, fmt.Errorf("plot: %s: series %q: %w", f.name, s.name, err)
		}
		line.LineStyle = style
		p.Add(line)
		thumbs := []gplot.Thumbnailer{line}
		if f.points || len(s.xys) == 1 {
			dots, err := plotter.NewScatter(s.xys)
			if err != nil {
				return nil, leg, fmt.Errorf("plot: %s: series %q: %w", f.name, s.name, err)
			}
			dots.GlyphStyle = draw.GlyphStyle{Color: style.Color, Radius: vg.Points(2.5), Shape: draw.CircleGlyph{}}
			p.Add(dots)
			thumbs = append(thumbs, dots)
		}
		leg.Add(s.name, thumbs...)
	}
	if f.unitY {
		p.Y.Min = min(p.Y.Min, 0)
		p.Y.Max = max(p.Y.Max, 1)
	}
	widenFlat(&p.Y)
	widenFlat(&p.X)
	return p, leg, nil
}

// widenFlat gives an axis whose data is (nearly) constant a visible range:
// ±10% around the value, or ±1 around 0. Rounding in the moving average can
// leave a constant series a few ulps wide, which no ticker can label.
func widenFlat(a *gplot.Axis) {
	c := (a.Min + a.Max) / 2
	if a.Max-a.Min > 1e-9*math.Abs(c) || math.IsInf(c, 0) || math.IsNaN(c) {
		return
	}
	d := 0.1 * math.Abs(c)
	if d == 0 {
		d = 1
	}
	a.Min, a.Max = c-d, c+d
}

// draw renders the figure onto c: a white background, the plot, and the
// legend in a column on the right, level with the top of the plot area.
func (f *figure) draw(c draw.Canvas, p *gplot.Plot, leg gplot.Legend) { drawFigure(c, p, leg) }

// drawFigure draws p and its legend onto c (figure.draw).
func drawFigure(c draw.Canvas, p *gplot.Plot, leg gplot.Legend) {
	c.SetColor(color.White)
	c.Fill(c.Rectangle.Path())
	c = draw.Crop(c, margin, -margin, margin, -margin)
	legW := leg.Rectangle(c).Size().X
	plotC := draw.Crop(c, 0, -(legW + gap), 0, 0)
	p.Draw(plotC)

	top := p.Title.TextStyle.Rectangle(p.Title.Text).Size().Y + p.Title.Padding
	legC := c
	legC.Min.X = c.Max.X - legW
	legC.Max.Y -= top
	leg.Draw(legC)
}

// save writes the figure as name.png and name.svg into dir and returns the
// two paths. Each file is written under a temporary name and renamed, so a
// viewer watching dir never sees half a file.
func (f *figure) save(dir string) ([]string, error) {
	p, leg, err := f.build()
	if err != nil {
		return nil, err
	}
	return saveFigure(dir, f.name, p, leg)
}

// saveFigure writes p and its legend as name.png and name.svg into dir
// (figure.save).
func saveFigure(dir, name string, p *gplot.Plot, leg gplot.Legend) ([]string, error) {
	png := vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(figWidth, figHeight), vgimg.UseDPI(DPI))}
	svg := vgsvg.New(figWidth, figHeight)
	var paths []string
	for _, out := range []struct {
		ext    string
		canvas vg.CanvasWriterTo
	}{{".png", png}, {".svg", svg}} {
		drawFigure(draw.New(out.canvas), p, leg)
		path := filepath.Join(dir, name+out.ext)
		if err := writeAtomic(path, out.canvas); err != nil {
			return paths, err
		}
		paths = append(paths, path)
	}
	return paths, nil
}

// writeAtomic writes what w produces to path through a temporary file in the
// same folder and a rename.
func writeAtomic(path string, w io.WriterTo) error {
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		return fmt.Errorf("plot: encode %s: %w", path, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	defer os.Remove(tmp.Name())              // fails harmlessly once renamed
	if err := tmp.Chmod(0o644); err != nil { // CreateTemp makes it 0600
		tmp.Close()
		return fmt.Errorf("plot: %w", err)
	}
	if _, err := tmp.Write(buf.Bytes()); err != nil {
		tmp.Close()
		return fmt.Errorf("plot: write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("plot: write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	return nil
}

// lighten mixes c with white; by 0 keeps c, by 1 gives white. The result is
// opaque, so it looks the same in PNG and SVG viewers.
func lighten(c color.RGBA, by float64) color.RGBA {
	mix := func(v uint8) uint8 { return uint8(float64(v) + (255-float64(v))*by + 0.5) }
	return color.RGBA{R: mix(c.R), G: mix(c.G), B: mix(c.B), A: 0xff}
}
