// Package frontier places every router on the cost–quality plane: each
// operating point's EM against its cost per question, the upper hull of
// the single pool models (what mixing them at random reaches), each router
// family's own hull and how it compares (RouterBench, Hu et al. 2024,
// arXiv:2403.12031: the non-decreasing convex hull and AIQ). Analyze is the
// arithmetic; Run evaluates the points (run.go); `recal frontier` calls Run.
package frontier

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// Families of points. A fitted router's family is its name (mlp, ...).
const (
	FamilySingle  = "single"  // one pool model answers every question
	FamilyCascade = "cascade" // the cascade over its threshold sweep
	FamilyPolicy  = "policy"  // the RL policies given
	FamilyOracle  = "oracle"  // the cheapest right model per question (a reference, not a router)
)

// Point is one operating point.
type Point struct {
	Family string `json:"family"`
	// Label names the point: the model, or the family with its setting
	// ("mlp λ=0.3", "cascade t=0.75", a checkpoint).
	Label string `json:"label"`
	// Setting is the swept value (cost_lambda, threshold); nil for none.
	Setting *float64 `json:"setting,omitempty"`
	EM      float64  `json:"em"`
	F1      float64  `json:"f1"`
	// Cost is USD per question; Calls pool calls per question.
	Cost  float64 `json:"cost_per_question"`
	Calls float64 `json:"calls_per_question"`
	// Mark places the point against the single models' hull: "above",
	// "on", "below", or "left" (cheaper than every single model and no
	// better than the cheapest).
	Mark string `json:"mark"`
	// Shares is each pool model's share of a router's calls (routing
	// collapse shows as one share near 1); nil for the single models and
	// the oracle.
	Shares map[string]float64 `json:"call_shares,omitempty"`
	// Group names the policy a seed's point belongs to (Seeds); "" for
	// the others.
	Group string `json:"group,omitempty"`
}

// MaxShare is the largest share of p's calls one model took, and that
// model ("" without shares).
func (p Point) MaxShare() (string, float64) {
	best, share := "", -1.0
	for m, s := range p.Shares {
		if s > share || s == share && m < best {
			best, share = m, s
		}
	}
	return best, max(share, 0)
}

// SeedSummary is one policy trained with several seeds: the mean of its
// seeds' points and their spread, placed on the single models' hull.
type SeedSummary struct {
	Group string `json:"group"`
	Seeds int    `json:"seeds"`
	// EM and Cost are the seeds' means; EMStd and CostStd their sample
	// standard deviations (n−1; 0 for one seed).
	EM      float64 `json:"em"`
	EMStd   float64 `json:"em_std"`
	F1      float64 `json:"f1"`
	Cost    float64 `json:"cost_per_question"`
	CostStd float64 `json:"cost_std"`
	Calls   float64 `json:"calls_per_question"`
	// HullEM is the single models' hull at the mean cost (null below its
	// cheapest point); Margin is EM − HullEM.
	HullEM *float64 `json:"hull_em"`
	Margin *float64 `json:"margin"`
	// Above: the mean EM exceeds the hull's EM at the mean cost by more
	// than the seeds' EM standard deviation (and there are 2 seeds or
	// more): the bar of a router worth using over mixing the single
	// models at random.
	Above bool `json:"above_by_more_than_std"`
	// MaxShare is the mean over seeds of the largest share of calls one
	// model took, and MaxModel the model most often taking it.
	MaxShare float64 `json:"max_call_share"`
	MaxModel string  `json:"max_call_share_model"`
}

// Vertex is a point of a hull.
type Vertex struct {
	Cost float64 `json:"cost_per_question"`
	EM   float64 `json:"em"`
}

// Hull is a non-decreasing concave upper hull: vertices by cost, EM rising.
// Below its first vertex's cost it is undefined; beyond its last it is
// flat (a dearer point never does better).
type Hull []Vertex

// UpperHull returns the non-decreasing upper convex hull of ps: the upper
// convex hull of the (cost, EM) points, from the cheapest point (the best
// of equal cost) up to the point of the highest EM (the cheapest of those).
func UpperHull(ps []Vertex) Hull {
	pts := slices.Clone(ps)
	slices.SortFunc(pts, func(a, b Vertex) int {
		switch {
		case a.Cost != b.Cost:
			return cmpFloat(a.Cost, b.Cost)
		default:
			return cmpFloat(b.EM, a.EM)
		}
	})
	var h Hull
	for _, p := range pts {
		if len(h) > 0 && p.Cost == h[len(h)-1].Cost {
			continue // a dearer-or-equal point of no higher EM at the same cost
		}
		if len(h) > 0 && p.EM <= h[len(h)-1].EM {
			continue // dominated: non-decreasing
		}
		for len(h) >= 2 && cross(h[len(h)-2], h[len(h)-1], p) >= 0 {
			h = h[:len(h)-1] // h's last vertex lies on or under the chord
		}
		h = append(h, p)
	}
	return h
}

// cross is the z of (b−a)×(c−a): >= 0 when b is on or below the chord a→c.
func cross(a, b, c Vertex) float64 {
	return (b.Cost-a.Cost)*(c.EM-a.EM) - (b.EM-a.EM)*(c.Cost-a.Cost)
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// At is the hull's EM at cost c: NaN below its first vertex, linear between
// vertices, flat beyond the last.
func (h Hull) At(c float64) float64 {
	if len(h) == 0 || c < h[0].Cost {
		return math.NaN()
	}
	for i := 1; i < len(h); i++ {
		if c <= h[i].Cost {
			a, b := h[i-1], h[i]
			return a.EM + (b.EM-a.EM)*(c-a.Cost)/(b.Cost-a.Cost)
		}
	}
	return h[len(h)-1].EM
}

// FirstReach is the least cost at which the hull reaches EM e; NaN when it
// never does.
func (h Hull) FirstReach(e float64) float64 {
	if len(h) == 0 {
		return math.NaN()
	}
	if h[0].EM >= e {
		return h[0].Cost
	}
	for i := 1; i < len(h); i++ {
		if a, b := h[i-1], h[i]; b.EM >= e {
			return a.Cost + (e-a.EM)/(b.EM-a.EM)*(b.Cost-a.Cost)
		}
	}
	return math.NaN()
}

// Area is the mean of the hull's EM over costs [lo, hi] (RouterBench's
// AIQ, normalised by the range), counting 0 below its first vertex; NaN
// when hi <= lo.
func (h Hull) Area(lo, hi float64) float64 {
	if !(hi > lo) || len(h) == 0 {
		return math.NaN()
	}
	xs := []float64{lo, hi}
	for _, v := range h {
		if v.Cost > lo && v.Cost < hi {
			xs = append(xs, v.Cost)
		}
	}
	slices.Sort(xs)
	area := 0.0
	for i := 1; i < len(xs); i++ {
		a, b := xs[i-1], xs[i]
		if b <= h[0].Cost {
			continue // undefined below the first vertex: 0
		}
		a = math.Max(a, h[0].Cost)
		area += (h.At(a) + h.At(b)) / 2 * (b - a)
	}
	return area / (hi - lo)
}

// Family is one family's summary.
type Family struct {
	Name   string `json:"name"`
	Points int    `json:"points"`
	Above  int    `json:"above_single_hull"`
	Hull   Hull   `json:"hull"`
	// AIQ is the mean of the family's hull over the single models' cost
	// range (0 below the family's cheapest point); null when the single
	// models span no range.
	AIQ *float64 `json:"aiq"`
	// ReachCost is the least cost per question at which the family's hull
	// reaches the best single model's EM; null when it never does.
	ReachCost *float64 `json:"cost_to_best_single_em"`
	// EMAtHalf is the hull's EM at half the best single model's cost; null
	// when the family has no point that cheap.
	EMAtHalf *float64 `json:"em_at_half_best_single_cost"`
}

// Report is the frontier: every point, the single models' hull, and each
// family's summary.
type Report struct {
	Points     []Point    `json:"points"`
	SingleHull Hull       `json:"single_hull"`
	Best       string     `json:"best_single"` // the single model of the highest EM (ties: cheaper)
	BestEM     float64    `json:"best_single_em"`
	BestCost   float64    `json:"best_single_cost_per_question"`
	CostRange  [2]float64 `json:"single_cost_range"`
	Families   []Family   `json:"families"`
	// Seeds summarises each group of points (Point.Group), in the order
	// groups first appear.
	Seeds []SeedSummary `json:"seeds,omitempty"`
}

// ErrPoints: operating points the frontier cannot place.
var ErrPoints = errors.New("frontier: bad operating points")

// Analyze places ps (at least one of FamilySingle) on the single models'
// hull and summarises each family, in the order families first appear.
// A point's cost must be finite and >= 0 (0 is a point: a free model), its
// EM in [0, 1]; at least one single model must cost more than 0, or there
// is no cost axis (a log without costs and a pool without prices).
func Analyze(ps []Point) (Report, error) {
	var single []Vertex
	rep := Report{Points: slices.Clone(ps), BestEM: math.Inf(-1)}
	anyCost := false
	for _, p := range ps {
		if math.IsNaN(p.Cost) || math.IsInf(p.Cost, 0) || p.Cost < 0 {
			return Report{}, fmt.Errorf("%w: %s (%s): cost per question %v, want a finite number >= 0", ErrPoints, p.Label, p.Family, p.Cost)
		}
		if !(p.EM >= 0 && p.EM <= 1) {
			return Report{}, fmt.Errorf("%w: %s (%s): EM %v, want 0..1", ErrPoints, p.Label, p.Family, p.EM)
		}
		if p.Family != FamilySingle {
			continue
		}
		single = append(single, Vertex{p.Cost, p.EM})
		anyCost = anyCost || p.Cost > 0
		if p.EM > rep.BestEM || p.EM == rep.BestEM && p.Cost < rep.BestCost {
			rep.Best, rep.BestEM, rep.BestCost = p.Label, p.EM, p.Cost
		}
	}
	if len(single) == 0 {
		return Report{}, fmt.Errorf("%w: no single-model point to draw the hull from", ErrPoints)
	}
	if !anyCost {
		return Report{}, fmt.Errorf("%w: every single model costs 0 per question: the log holds no costs and the pool no prices (pool.models[].price_in, price_out), so there is no cost axis", ErrPoints)
	}
	rep.SingleHull = UpperHull(single)
	rep.CostRange = [2]float64{math.Inf(1), math.Inf(-1)}
	for _, v := range single {
		rep.CostRange[0], rep.CostRange[1] = math.Min(rep.CostRange[0], v.Cost), math.Max(rep.CostRange[1], v.Cost)
	}
	const eps = 1e-9
	for i := range rep.Points {
		p := &rep.Points[i]
		h := rep.SingleHull.At(p.Cost)
		switch {
		case math.IsNaN(h) && p.EM > rep.SingleHull[0].EM+eps:
			p.Mark = "above"
		case math.IsNaN(h):
			p.Mark = "left"
		case p.EM > h+eps:
			p.Mark = "above"
		case p.EM < h-eps:
			p.Mark = "below"
		default:
			p.Mark = "on"
		}
	}
	var order []string
	byFamily := map[string][]Point{}
	for _, p := range rep.Points {
		if _, ok := byFamily[p.Family]; !ok {
			order = append(order, p.Family)
		}
		byFamily[p.Family] = append(byFamily[p.Family], p)
	}
	for _, name := range order {
		f := Family{Name: name, Points: len(byFamily[name])}
		var vs []Vertex
		for _, p := range byFamily[name] {
			vs = append(vs, Vertex{p.Cost, p.EM})
			if p.Mark == "above" {
				f.Above++
			}
		}
		f.Hull = UpperHull(vs)
		f.AIQ = num(f.Hull.Area(rep.CostRange[0], rep.CostRange[1]))
		f.ReachCost = num(f.Hull.FirstReach(rep.BestEM))
		f.EMAtHalf = num(f.Hull.At(rep.BestCost / 2))
		rep.Families = append(rep.Families, f)
	}
	rep.Seeds = seedSummaries(rep.Points, rep.SingleHull)
	return rep, nil
}

// seedSummaries summarises the points of each group on hull.
func seedSummaries(ps []Point, hull Hull) []SeedSummary {
	var order []string
	byGroup := map[string][]Point{}
	for _, p := range ps {
		if p.Group == "" {
			continue
		}
		if _, ok := byGroup[p.Group]; !ok {
			order = append(order, p.Group)
		}
		byGroup[p.Group] = append(byGroup[p.Group], p)
	}
	var out []SeedSummary
	for _, g := range order {
		pts := byGroup[g]
		sum := SeedSummary{Group: g, Seeds: len(pts)}
		var ems, costs []float64
		models := map[string]int{}
		for _, p := range pts {
			ems, costs = append(ems, p.EM), append(costs, p.Cost)
			sum.F1 += p.F1 / float64(len(pts))
			sum.Calls += p.Calls / float64(len(pts))
			m, share := p.MaxShare()
			sum.MaxShare += share / float64(len(pts))
			if m != "" {
				models[m]++
			}
		}
		for m, n := range models {
			if n > models[sum.MaxModel] || n == models[sum.MaxModel] && m < sum.MaxModel {
				sum.MaxModel = m
			}
		}
		sum.EM, sum.EMStd = meanStd(ems)
		sum.Cost, sum.CostStd = meanStd(costs)
		if h := hull.At(sum.Cost); !math.IsNaN(h) {
			m := sum.EM - h
			sum.HullEM, sum.Margin = &h, &m
			sum.Above = len(pts) >= 2 && m > sum.EMStd
		}
		out = append(out, sum)
	}
	return out
}

// meanStd is xs' mean and sample standard deviation (n−1; 0 for one).
func meanStd(xs []float64) (mean, std float64) {
	for _, x := range xs {
		mean += x / float64(len(xs))
	}
	if len(xs) < 2 {
		return mean, 0
	}
	var ss float64
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	return mean, math.Sqrt(ss / float64(len(xs)-1))
}

// num is a pointer to x, or nil for NaN (JSON has no NaN).
func num(x float64) *float64 {
	if math.IsNaN(x) {
		return nil
	}
	return &x
}
