package plot

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"gonum.org/v1/plot/plotter"
)

// AblationFigure is the file stem of the ablation study's figure
// (AblationFigure.png, AblationFigure.svg).
const AblationFigure = "ablation_reward"

// Curves is one line of the ablation figure: a variant's label and its run
// folders, one per seed.
type Curves struct {
	Label string
	Runs  []string
}

// Ablation draws the answer reward ("reward"."ans" of each run's
// metrics.jsonl) over training steps, one line per element of curves: each
// seed's series is smoothed by the trailing moving average of o.Window
// points (DefaultWindow when 0, none when 1), the line is the mean of the
// smoothed series over the seeds and the band spans their minimum to
// maximum. Steps some seed lacks are left out. It writes AblationFigure as
// PNG and SVG into outDir and returns the two paths.
func (o Options) Ablation(curves []Curves, outDir string) ([]string, error) {
	window, log, err := o.settings()
	if err != nil {
		return nil, err
	}
	seeds := 0
	fig := &figure{name: AblationFigure, xLabel: "training step", yLabel: "answer reward"}
	for _, c := range curves {
		s, err := seedBand(c, window, log)
		if err != nil {
			return nil, err
		}
		fig.series = append(fig.series, s)
		seeds = max(seeds, len(c.Runs))
	}
	smoothing := ""
	if window > 1 {
		smoothing = fmt.Sprintf("; %d-step moving average", window)
	}
	fig.title = fmt.Sprintf("Answer reward per variant (mean over %d seeds; band: min–max over seeds%s)", seeds, smoothing)
	if seeds == 1 {
		fig.title = fmt.Sprintf("Answer reward per variant (one seed%s)", smoothing)
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, fmt.Errorf("plot: %w", err)
	}
	return fig.save(outDir)
}

// seedBand is the line and band of one variant: the mean, minimum and
// maximum over its runs of their smoothed answer rewards, at the steps every
// run has.
func seedBand(c Curves, window int, log *slog.Logger) (series, error) {
	out := series{name: c.Label}
	if len(c.Runs) == 0 {
		return out, fmt.Errorf("plot: ablation: %s has no runs", c.Label)
	}
	var runs []map[float64]float64 // step → smoothed answer reward
	var steps []float64            // the first run's, in order
	for _, dir := range c.Runs {
		recs, err := readMetrics(filepath.Join(dir, MetricsFile), log)
		if err != nil {
			return out, err
		}
		var xys plotter.XYs
		for _, r := range recs {
			if v := r.rec.Reward["ans"]; v != nil {
				xys = append(xys, plotter.XY{X: r.step, Y: *v})
			}
		}
		if len(xys) == 0 {
			return out, fmt.Errorf("plot: ablation: %s: no answer reward (reward.ans) logged", filepath.Join(dir, MetricsFile))
		}
		if window > 1 {
			xys = movingAverage(xys, window)
		}
		m := make(map[float64]float64, len(xys))
		for _, p := range xys {
			m[p.X] = p.Y
			if len(runs) == 0 {
				steps = append(steps, p.X)
			}
		}
		runs = append(runs, m)
	}
	// The first run's steps, kept where every run has them.
next:
	for _, x := range steps {
		lo, hi, sum := 0.0, 0.0, 0.0
		for k, m := range runs {
			y, ok := m[x]
			if !ok {
				continue next
			}
			if k == 0 || y < lo {
				lo = y
			}
			if k == 0 || y > hi {
				hi = y
			}
			sum += y
		}
		out.xys = append(out.xys, plotter.XY{X: x, Y: sum / float64(len(runs))})
		out.lo = append(out.lo, plotter.XY{X: x, Y: lo})
		out.hi = append(out.hi, plotter.XY{X: x, Y: hi})
	}
	if len(out.xys) == 0 {
		return out, fmt.Errorf("plot: ablation: %s: its runs share no logged step", c.Label)
	}
	if len(runs) == 1 {
		out.lo, out.hi = nil, nil // no spread to show
	}
	return out, nil
}
