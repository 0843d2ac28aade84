package plot

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"gonum.org/v1/plot/plotter"
)

func TestMovingAverage(t *testing.T) {
	xys := func(ys ...float64) plotter.XYs {
		out := make(plotter.XYs, len(ys))
		for i, y := range ys {
			out[i] = plotter.XY{X: float64(10 * (i + 1)), Y: y}
		}
		return out
	}
	tests := []struct {
		name   string
		in     plotter.XYs
		window int
		want   plotter.XYs
	}{
		{"window 1 is the identity", xys(1, 5, 3), 1, xys(1, 5, 3)},
		{"short start averages fewer points", xys(1, 3, 5, 7), 2, xys(1, 2, 4, 6)},
		{"window longer than the series", xys(2, 4, 6), 10, xys(2, 3, 4)},
		{"window 3", xys(3, 0, 0, 3, 6), 3, xys(3, 1.5, 1, 1, 3)},
		{"empty", nil, 5, plotter.XYs{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := movingAverage(tt.in, tt.window)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("trailing moving average over %d points, steps kept (-want +got):\n%s", tt.window, diff)
			}
		})
	}
}

func TestPlaceSteps(t *testing.T) {
	type rec struct {
		step *float64
		id   string
	}
	s := func(v float64) *float64 { return &v }
	tests := []struct {
		name string
		in   []rec
		want []stepped[string] // step and id of the records kept
	}{
		{
			name: "in order",
			in:   []rec{{s(1), "a"}, {s(2), "b"}, {s(5), "c"}},
			want: []stepped[string]{{1, "a"}, {2, "b"}, {5, "c"}},
		},
		{
			name: "missing step follows the previous one",
			in:   []rec{{nil, "a"}, {nil, "b"}, {s(10), "c"}, {nil, "d"}},
			want: []stepped[string]{{1, "a"}, {2, "b"}, {10, "c"}, {11, "d"}},
		},
		{
			name: "resumed run replaces re-logged steps",
			in:   []rec{{s(1), "a"}, {s(2), "b"}, {s(3), "c"}, {s(4), "d"}, {s(3), "c2"}, {s(4), "d2"}, {s(5), "e"}},
			want: []stepped[string]{{1, "a"}, {2, "b"}, {3, "c2"}, {4, "d2"}, {5, "e"}},
		},
		{
			name: "resume from before the first step",
			in:   []rec{{s(5), "a"}, {s(6), "b"}, {s(1), "c"}},
			want: []stepped[string]{{1, "c"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			placed := placeSteps(tt.in, func(r rec) *float64 { return r.step })
			got := make([]stepped[string], len(placed))
			for i, p := range placed {
				got[i] = stepped[string]{p.step, p.rec.id}
			}
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(stepped[string]{})); diff != "" {
				t.Errorf("steps must increase strictly, the latest record of a step winning (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMapSeries(t *testing.T) {
	v := func(x float64) *float64 { return &x }
	recs := []stepped[metricsRecord]{
		{1, metricsRecord{ModelShare: map[string]*float64{"large": v(1)}, Reward: map[string]*float64{"zeta": v(1), "ans": v(0.1), "format": v(0.9)}}},
		{2, metricsRecord{}}, // no model_share, no reward: no point for anyone
		{3, metricsRecord{ModelShare: map[string]*float64{"large": v(0.5), "multihop": v(0.5)}, Reward: map[string]*float64{"ans": nil}}},
		{4, metricsRecord{ModelShare: map[string]*float64{"large": v(1)}, Reward: map[string]*float64{"ans": v(0.3)}}},
	}
	type pts = plotter.XYs
	tests := []struct {
		name string
		got  []series
		want map[string]pts
		keys []string
	}{
		{
			name: "model shares: a model starts where it appears, then counts 0 when absent",
			got:  mapSeries(recs, func(r metricsRecord) map[string]*float64 { return r.ModelShare }, nil, true),
			keys: []string{"large", "multihop"},
			want: map[string]pts{
				"large":    {{X: 1, Y: 1}, {X: 3, Y: 0.5}, {X: 4, Y: 1}},
				"multihop": {{X: 3, Y: 0.5}, {X: 4, Y: 0}},
			},
		},
		{
			name: "rewards: known components first, missing and null values skipped",
			got:  mapSeries(recs, func(r metricsRecord) map[string]*float64 { return r.Reward }, rewardOrder, false),
			keys: []string{"ans", "format", "zeta"},
			want: map[string]pts{
				"ans":    {{X: 1, Y: 0.1}, {X: 4, Y: 0.3}},
				"format": {{X: 1, Y: 0.9}},
				"zeta":   {{X: 1, Y: 1}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var keys []string
			got := map[string]pts{}
			for _, s := range tt.got {
				keys = append(keys, s.name)
				got[s.name] = s.xys
			}
			if diff := cmp.Diff(tt.keys, keys); diff != "" {
				t.Errorf("legend order (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("points (-want +got):\n%s", diff)
			}
		})
	}
}
