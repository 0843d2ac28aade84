package baselines

import (
	"math"
	"math/rand/v2"
	"testing"
)

// Every operation's hand-written backward agrees with central finite
// differences of a scalar made from its output: the routers learn only if
// these are right.
func TestGradients(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	mk := func(name string, r, c int) *param {
		p := newParam(name, r, c, 1, rng)
		for i := range p.w {
			if i%5 == 3 {
				p.w[i] = 0 // exercise the zero skips of matmul
			}
		}
		return p
	}
	a, b, sq, row := mk("a", 3, 4), mk("b", 4, 5), mk("sq", 3, 4), mk("row", 1, 4)
	probe := mk("probe", 3, 5) // weights of the scalar read off an output
	y := []float64{0.2, 0.9, 0.5, 0.1, 0.7, 0.3, 1, 0, 0.4, 0.6, 0.8, 0.05}
	w := []float64{1, 1, 0.5, 2, 1, 1, 0, 1, 1, 1, 1, 1}
	// readout is sum(probe ⊙ n) over n's entries (probe reused cyclically).
	readout := func(t *tape, n *node) *node {
		out := t.newNode(1, 1, true)
		for i, v := range n.v {
			out.v[0] += probe.w[i%len(probe.w)] * v
		}
		out.back = func() {
			for i := range n.v {
				if n.g != nil {
					n.g[i] += out.g[0] * probe.w[i%len(probe.w)]
				}
			}
		}
		return out
	}
	cases := []struct {
		name   string
		params []*param
		f      func(t *tape) *node
	}{
		{"matmul", []*param{a, b}, func(t *tape) *node { return readout(t, t.matmul(t.param(a), t.param(b))) }},
		{"matmulT", []*param{a, sq}, func(t *tape) *node { return readout(t, t.matmulT(t.param(a), t.param(sq))) }},
		{"addRow mulRow", []*param{a, row}, func(t *tape) *node {
			return readout(t, t.mulRow(t.addRow(t.param(a), t.param(row)), t.param(row)))
		}},
		{"add2 scale relu", []*param{a, sq}, func(t *tape) *node {
			return readout(t, t.relu(t.scale(t.add2(t.param(a), t.param(sq)), 1.7)))
		}},
		{"concat rows", []*param{a, sq}, func(t *tape) *node {
			return readout(t, t.rows(t.concat(t.param(a), t.param(sq)), []int{2, 0, 2}))
		}},
		{"normRows", []*param{a}, func(t *tape) *node { return readout(t, t.normRows(t.param(a))) }},
		{"rowMeanDot", []*param{a, sq}, func(t *tape) *node { return readout(t, t.rowMeanDot(t.param(a), t.param(sq))) }},
		{"mse", []*param{a}, func(t *tape) *node { return t.mse(t.param(a), y, w) }},
		{"bce", []*param{a}, func(t *tape) *node { return t.bce(t.param(a), y, w) }},
		{"choiceCE", []*param{a}, func(t *tape) *node {
			return t.choiceCE(t.param(a), []choice{{0, []int{1, 0, 3}}, {2, []int{0, 2}}, {2, []int{3, 1, 2, 0}}}, 3)
		}},
		{"pairBCE", []*param{a}, func(t *tape) *node {
			return t.pairBCE(t.param(a), []pair{{0, 1, 2}, {1, 3, 0}, {2, 0, 1}, {2, 2, 3}})
		}},
		{"sum2", []*param{a, sq}, func(t *tape) *node {
			return t.sum2(t.bce(t.param(a), y, w), t.mse(t.param(sq), y, w), 0.3)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, p := range c.params {
				clear(p.g)
			}
			tp := &tape{}
			tp.backward(c.f(tp))
			const h = 1e-6
			for _, p := range c.params {
				for i := range p.w {
					keep := p.w[i]
					p.w[i] = keep + h
					up := c.f(&tape{}).v[0]
					p.w[i] = keep - h
					down := c.f(&tape{}).v[0]
					p.w[i] = keep
					num := (up - down) / (2 * h)
					if math.Abs(num-p.g[i]) > 1e-5*(1+math.Abs(num)) {
						t.Errorf("d/d%s[%d]: backward %.8f, finite differences %.8f", p.name, i, p.g[i], num)
					}
				}
			}
		})
	}
}

// AdamW moves a parameter against its gradient and zeroes the gradient.
func TestAdamW(t *testing.T) {
	p := newParam("p", 1, 2, 0, nil)
	p.w[0], p.w[1] = 1, -1
	p.g[0], p.g[1] = 2, -3
	opt := newAdamW(0.1, 0, []*param{p})
	opt.update()
	if math.Abs(p.w[0]-0.9) > 1e-6 || math.Abs(p.w[1]+0.9) > 1e-6 {
		t.Errorf("after one step w = %v, want [0.9 -0.9] (Adam's first step is lr·sign(g))", p.w)
	}
	if p.g[0] != 0 || p.g[1] != 0 {
		t.Errorf("gradients %v not zeroed after the update", p.g)
	}
}
