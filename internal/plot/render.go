package plot

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
)

// Names of the files read from a run folder.
const (
	MetricsFile    = "metrics.jsonl"
	ValidationFile = "validation.jsonl"
)

// DefaultWindow is the moving-average window, in logged steps, used when
// Options.Window is 0.
const DefaultWindow = 10

// Options tunes Render. The zero value gives the defaults.
type Options struct {
	// Window is the length, in logged steps, of the trailing moving average
	// drawn over the per-step series; 0 means DefaultWindow and 1 draws the
	// raw values only.
	Window int
	// Logger receives the warnings (a skipped truncated last line, a figure
	// skipped for lack of data); nil means slog.Default().
	Logger *slog.Logger
}

// Render reads runDir/metrics.jsonl (and runDir/validation.jsonl if present)
// and writes PNG and SVG files into outDir (created if missing), returning the
// paths written. It uses the default Options.
func Render(runDir, outDir string) ([]string, error) {
	return Options{}.Render(runDir, outDir)
}

// settings resolves o's defaults: the smoothing window (DefaultWindow for
// 0; negative is an error) and the logger (slog's default for nil).
func (o Options) settings() (int, *slog.Logger, error) {
	window := o.Window
	switch {
	case window < 0:
		return 0, nil, fmt.Errorf("plot: window %d: must be ≥ 0", window)
	case window == 0:
		window = DefaultWindow
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	return window, log, nil
}

// Render is the package-level Render with the options of o. The paths come
// in figure order (rewards, calls, model_share, entropy, kl, validation_f1),
// each .png before its .svg; a figure with no data is left out.
func (o Options) Render(runDir, outDir string) ([]string, error) {
	window, log, err := o.settings()
	if err != nil {
		return nil, err
	}

	metrics, err := readMetrics(filepath.Join(runDir, MetricsFile), log)
	if err != nil {
		return nil, err
	}
	var validation []stepped[validationRecord]
	valPath := filepath.Join(runDir, ValidationFile)
	switch validation, err = readValidation(valPath, log); {
	case errors.Is(err, fs.ErrNotExist):
		validation = nil
	case err != nil:
		return nil, err
	}

	const step = "training step"
	smoothed := func(title string) string {
		if window <= 1 {
			return title
		}
		return fmt.Sprintf("%s (faint: per step; bold: %d-step moving average)", title, window)
	}
	figs := []*figure{
		{
			name: "rewards", title: smoothed("Reward components"), xLabel: step, yLabel: "reward", window: window,
			series: mapSeries(metrics, func(r metricsRecord) map[string]*float64 { return r.Reward }, rewardOrder, false),
		},
		{
			name: "calls", title: smoothed("Pool calls per question"), xLabel: step, yLabel: "calls per question", window: window,
			series: scalarSeries("calls / question", metrics, func(r metricsRecord) *float64 { return r.CallsPerQuestion }),
		},
		{
			name: "model_share", title: smoothed("Share of pool calls per model"), xLabel: step, yLabel: "share of calls",
			window: window, unitY: true,
			series: mapSeries(metrics, func(r metricsRecord) map[string]*float64 { return r.ModelShare }, nil, true),
		},
		{
			name: "entropy", title: smoothed("Policy entropy"), xLabel: step, yLabel: "entropy per token", window: window,
			series: scalarSeries("entropy", metrics, func(r metricsRecord) *float64 { return r.Entropy }),
		},
		{
			name: "kl", title: smoothed("KL divergence to the reference policy"), xLabel: step, yLabel: "KL", window: window,
			series: scalarSeries("KL", metrics, func(r metricsRecord) *float64 { return r.KL }),
		},
	}
	if validation != nil {
		datasets, avg := validationSeries(validation)
		figs = append(figs, &figure{
			name: "validation_f1", title: "Validation F1 per dataset", xLabel: step, yLabel: "F1",
			points: true, series: datasets, emphasis: avg,
		})
	}

	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, fmt.Errorf("plot: %w", err)
	}
	var paths []string
	for _, f := range figs {
		if len(f.series) == 0 && f.emphasis == nil {
			log.Warn("plot: figure skipped, no data", slog.String("figure", f.name))
			continue
		}
		written, err := f.save(outDir)
		paths = append(paths, written...)
		if err != nil {
			return paths, err
		}
	}
	return paths, nil
}
