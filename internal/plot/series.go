package plot

import (
	"maps"
	"slices"
	"sort"

	"gonum.org/v1/plot/plotter"
)

// series is one named line of a figure: (step, value) points in increasing
// step order.
type series struct {
	name string
	xys  plotter.XYs
	// lo and hi, when set, bound a band drawn under the line (the spread
	// over seeds of the ablation figure), point for point with xys.
	lo, hi plotter.XYs
}

// rewardOrder is the order of the ReCal reward components in the legend;
// other components follow in name order.
var rewardOrder = []string{"ans", "info", "format", "route", "balance"}

// scalarSeries collects one optional field of every metrics record; records
// without it add no point.
func scalarSeries(name string, recs []stepped[metricsRecord], field func(metricsRecord) *float64) []series {
	var xys plotter.XYs
	for _, r := range recs {
		if v := field(r.rec); v != nil {
			xys = append(xys, plotter.XY{X: r.step, Y: *v})
		}
	}
	if len(xys) == 0 {
		return nil
	}
	return []series{{name: name, xys: xys}}
}

// mapSeries turns a map-valued field (reward components, model shares) into
// one series per key, ordered by first (the keys it names, in that order)
// and then by name. With missingIsZero, a record that has the map but lacks a
// key that appeared in an earlier record gives that key the value 0: a model
// absent from "model_share" got no calls at that step. Before a key first
// appears it has no points, so a model added midway starts where it appears.
// Without missingIsZero a missing key or a null value adds no point.
func mapSeries(recs []stepped[metricsRecord], field func(metricsRecord) map[string]*float64, first []string, missingIsZero bool) []series {
	index := map[string]int{}
	var out []series
	for _, r := range recs {
		m := field(r.rec)
		if m == nil {
			continue
		}
		for _, k := range slices.Sorted(maps.Keys(m)) {
			if _, ok := index[k]; !ok {
				index[k] = len(out)
				out = append(out, series{name: k})
			}
		}
		for k, i := range index {
			v, ok := m[k]
			switch {
			case ok && v != nil:
				out[i].xys = append(out[i].xys, plotter.XY{X: r.step, Y: *v})
			case !ok && missingIsZero:
				out[i].xys = append(out[i].xys, plotter.XY{X: r.step, Y: 0})
			}
		}
	}
	out = slices.DeleteFunc(out, func(s series) bool { return len(s.xys) == 0 })
	rank := func(name string) int {
		if i := slices.Index(first, name); i >= 0 {
			return i
		}
		return len(first)
	}
	sort.SliceStable(out, func(i, j int) bool {
		ri, rj := rank(out[i].name), rank(out[j].name)
		if ri != rj {
			return ri < rj
		}
		return out[i].name < out[j].name
	})
	return out
}

// validationSeries returns one F1 series per dataset, in name order, and the
// series of the average F1 (nil when no record has one).
func validationSeries(recs []stepped[validationRecord]) (datasets []series, avg *series) {
	index := map[string]int{}
	for _, r := range recs {
		for _, name := range slices.Sorted(maps.Keys(r.rec.Datasets)) {
			s := r.rec.Datasets[name]
			if s == nil || s.F1 == nil {
				continue
			}
			i, ok := index[name]
			if !ok {
				i = len(datasets)
				index[name] = i
				datasets = append(datasets, series{name: name})
			}
			datasets[i].xys = append(datasets[i].xys, plotter.XY{X: r.step, Y: *s.F1})
		}
		if a := r.rec.Avg; a != nil && a.F1 != nil {
			if avg == nil {
				avg = &series{name: "average"}
			}
			avg.xys = append(avg.xys, plotter.XY{X: r.step, Y: *a.F1})
		}
	}
	sort.Slice(datasets, func(i, j int) bool { return datasets[i].name < datasets[j].name })
	return datasets, avg
}

// movingAverage returns the trailing moving average of xys: point i is the
// mean of the values of points max(0, i-window+1)…i, so the first window-1
// points average fewer values. The window counts points of the series, not
// steps, so a step missing from the series does not shorten it.
func movingAverage(xys plotter.XYs, window int) plotter.XYs {
	out := make(plotter.XYs, len(xys))
	sum := 0.0
	for i, p := range xys {
		sum += p.Y
		if i >= window {
			sum -= xys[i-window].Y
		}
		out[i] = plotter.XY{X: p.X, Y: sum / float64(min(i+1, window))}
	}
	return out
}
