package baselines

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// This file is the routers' small reverse-mode autodiff: row-major float64
// matrices on a tape, the dozen operations the four routers need, each with
// its hand-written backward, and AdamW. Everything runs on one goroutine in
// a fixed order, so a fit repeats bit for bit for a seed.
//
// Matrix products skip zero entries of their left operand: the hashed local
// embeddings have a few hundred non-zeros out of 4096, so the first layer
// costs what a sparse product would.

// param is a trained matrix with its gradient and AdamW moments.
type param struct {
	name string
	r, c int
	w, g []float64
	m, v []float64
}

// newParam makes an r×c parameter initialised uniformly in [-scale, scale]
// (scale 0: zeros).
func newParam(name string, r, c int, scale float64, rng *rand.Rand) *param {
	p := &param{name: name, r: r, c: c, w: make([]float64, r*c), g: make([]float64, r*c)}
	if scale != 0 && rng != nil { // no rng: an empty model for Load to fill
		for i := range p.w {
			p.w[i] = (2*rng.Float64() - 1) * scale
		}
	}
	return p
}

// glorot is the Glorot/Xavier uniform bound of an in×out weight.
func glorot(in, out int) float64 { return math.Sqrt(6 / float64(in+out)) }

// node is a matrix on the tape: its value, its gradient (nil when no
// gradient flows to it) and how to pass its gradient to its inputs.
type node struct {
	r, c int
	v, g []float64
	back func()
}

// tape records the nodes of one forward pass, in order. An infer tape
// (routing) keeps no gradient at all.
type tape struct {
	nodes []*node
	infer bool
}

func (t *tape) add(n *node) *node { t.nodes = append(t.nodes, n); return n }

// newNode makes a result node; it gets a gradient when any input has one.
func (t *tape) newNode(r, c int, grad bool) *node {
	n := &node{r: r, c: c, v: make([]float64, r*c)}
	if grad {
		n.g = make([]float64, r*c)
	}
	return t.add(n)
}

// param puts a parameter on the tape; its gradient accumulates into p.g.
func (t *tape) param(p *param) *node {
	if t.infer {
		return t.add(&node{r: p.r, c: p.c, v: p.w})
	}
	return t.add(&node{r: p.r, c: p.c, v: p.w, g: p.g})
}

// input puts a constant on the tape (no gradient).
func (t *tape) input(r, c int, v []float64) *node {
	if len(v) != r*c {
		panic(fmt.Sprintf("baselines: input of %d values for %dx%d", len(v), r, c)) // a caller bug
	}
	return t.add(&node{r: r, c: c, v: v})
}

// backward seeds d(loss)/d(loss) = 1 and runs the tape backwards.
func (t *tape) backward(loss *node) {
	loss.g[0] = 1
	for i := len(t.nodes) - 1; i >= 0; i-- {
		if n := t.nodes[i]; n.back != nil && n.g != nil {
			n.back()
		}
	}
}

// matmul is a·b for a r×k and b k×c.
func (t *tape) matmul(a, b *node) *node {
	if a.c != b.r {
		panic(fmt.Sprintf("baselines: matmul %dx%d by %dx%d", a.r, a.c, b.r, b.c))
	}
	r, k, c := a.r, a.c, b.c
	out := t.newNode(r, c, a.g != nil || b.g != nil)
	for i := 0; i < r; i++ {
		o := out.v[i*c : (i+1)*c]
		for p := 0; p < k; p++ {
			x := a.v[i*k+p]
			if x == 0 {
				continue
			}
			row := b.v[p*c : (p+1)*c]
			for j := range o {
				o[j] += x * row[j]
			}
		}
	}
	out.back = func() {
		for i := 0; i < r; i++ {
			og := out.g[i*c : (i+1)*c]
			for p := 0; p < k; p++ {
				if b.g != nil {
					if x := a.v[i*k+p]; x != 0 {
						bg := b.g[p*c : (p+1)*c]
						for j := range og {
							bg[j] += x * og[j]
						}
					}
				}
				if a.g != nil {
					row := b.v[p*c : (p+1)*c]
					var s float64
					for j := range og {
						s += og[j] * row[j]
					}
					a.g[i*k+p] += s
				}
			}
		}
	}
	return out
}

// matmulT is a·bᵀ for a r×k and b c×k.
func (t *tape) matmulT(a, b *node) *node {
	if a.c != b.c {
		panic(fmt.Sprintf("baselines: matmulT %dx%d by (%dx%d)ᵀ", a.r, a.c, b.r, b.c))
	}
	r, k, c := a.r, a.c, b.r
	out := t.newNode(r, c, a.g != nil || b.g != nil)
	for i := 0; i < r; i++ {
		ai := a.v[i*k : (i+1)*k]
		for j := 0; j < c; j++ {
			bj := b.v[j*k : (j+1)*k]
			var s float64
			for p := range ai {
				s += ai[p] * bj[p]
			}
			out.v[i*c+j] = s
		}
	}
	out.back = func() {
		for i := 0; i < r; i++ {
			for j := 0; j < c; j++ {
				gij := out.g[i*c+j]
				if gij == 0 {
					continue
				}
				if a.g != nil {
					ag, bj := a.g[i*k:(i+1)*k], b.v[j*k:(j+1)*k]
					for p := range ag {
						ag[p] += gij * bj[p]
					}
				}
				if b.g != nil {
					bg, ai := b.g[j*k:(j+1)*k], a.v[i*k:(i+1)*k]
					for p := range bg {
						bg[p] += gij * ai[p]
					}
				}
			}
		}
	}
	return out
}

// addRow is a plus the 1×c row b on every row (a bias).
func (t *tape) addRow(a, b *node) *node {
	if b.r != 1 || b.c != a.c {
		panic(fmt.Sprintf("baselines: addRow %dx%d + %dx%d", a.r, a.c, b.r, b.c))
	}
	out := t.newNode(a.r, a.c, a.g != nil || b.g != nil)
	for i := 0; i < a.r; i++ {
		for j := 0; j < a.c; j++ {
			out.v[i*a.c+j] = a.v[i*a.c+j] + b.v[j]
		}
	}
	out.back = func() {
		for i := 0; i < a.r; i++ {
			for j := 0; j < a.c; j++ {
				g := out.g[i*a.c+j]
				if a.g != nil {
					a.g[i*a.c+j] += g
				}
				if b.g != nil {
					b.g[j] += g
				}
			}
		}
	}
	return out
}

// add is a + b, of one shape.
func (t *tape) add2(a, b *node) *node {
	if a.r != b.r || a.c != b.c {
		panic(fmt.Sprintf("baselines: add %dx%d + %dx%d", a.r, a.c, b.r, b.c))
	}
	out := t.newNode(a.r, a.c, a.g != nil || b.g != nil)
	for i := range out.v {
		out.v[i] = a.v[i] + b.v[i]
	}
	out.back = func() {
		for i, g := range out.g {
			if a.g != nil {
				a.g[i] += g
			}
			if b.g != nil {
				b.g[i] += g
			}
		}
	}
	return out
}

// mulRow is a times the 1×c row b on every row, elementwise.
func (t *tape) mulRow(a, b *node) *node {
	if b.r != 1 || b.c != a.c {
		panic(fmt.Sprintf("baselines: mulRow %dx%d * %dx%d", a.r, a.c, b.r, b.c))
	}
	out := t.newNode(a.r, a.c, a.g != nil || b.g != nil)
	for i := 0; i < a.r; i++ {
		for j := 0; j < a.c; j++ {
			out.v[i*a.c+j] = a.v[i*a.c+j] * b.v[j]
		}
	}
	out.back = func() {
		for i := 0; i < a.r; i++ {
			for j := 0; j < a.c; j++ {
				g := out.g[i*a.c+j]
				if a.g != nil {
					a.g[i*a.c+j] += g * b.v[j]
				}
				if b.g != nil {
					b.g[j] += g * a.v[i*a.c+j]
				}
			}
		}
	}
	return out
}

// scale is s·a.
func (t *tape) scale(a *node, s float64) *node {
	out := t.newNode(a.r, a.c, a.g != nil)
	for i, x := range a.v {
		out.v[i] = s * x
	}
	out.back = func() {
		for i, g := range out.g {
			a.g[i] += s * g
		}
	}
	return out
}

// relu is max(a, 0).
func (t *tape) relu(a *node) *node {
	out := t.newNode(a.r, a.c, a.g != nil)
	for i, x := range a.v {
		out.v[i] = max(x, 0)
	}
	out.back = func() {
		for i, g := range out.g {
			if a.v[i] > 0 {
				a.g[i] += g
			}
		}
	}
	return out
}

// concat puts a and b side by side (same rows).
func (t *tape) concat(a, b *node) *node {
	if a.r != b.r {
		panic(fmt.Sprintf("baselines: concat %dx%d | %dx%d", a.r, a.c, b.r, b.c))
	}
	c := a.c + b.c
	out := t.newNode(a.r, c, a.g != nil || b.g != nil)
	for i := 0; i < a.r; i++ {
		copy(out.v[i*c:], a.v[i*a.c:(i+1)*a.c])
		copy(out.v[i*c+a.c:], b.v[i*b.c:(i+1)*b.c])
	}
	out.back = func() {
		for i := 0; i < a.r; i++ {
			if a.g != nil {
				for j := 0; j < a.c; j++ {
					a.g[i*a.c+j] += out.g[i*c+j]
				}
			}
			if b.g != nil {
				for j := 0; j < b.c; j++ {
					b.g[i*b.c+j] += out.g[i*c+a.c+j]
				}
			}
		}
	}
	return out
}

// rows gathers rows idx of a (repeats allowed).
func (t *tape) rows(a *node, idx []int) *node {
	out := t.newNode(len(idx), a.c, a.g != nil)
	for i, k := range idx {
		copy(out.v[i*a.c:(i+1)*a.c], a.v[k*a.c:(k+1)*a.c])
	}
	out.back = func() {
		for i, k := range idx {
			for j := 0; j < a.c; j++ {
				a.g[k*a.c+j] += out.g[i*a.c+j]
			}
		}
	}
	return out
}

// normRows scales every row of a to unit length (RouterDC's cosine,
// RouteLLM's normalised model embeddings); eps keeps zero rows finite.
func (t *tape) normRows(a *node) *node {
	const eps = 1e-12
	out := t.newNode(a.r, a.c, a.g != nil)
	norms := make([]float64, a.r)
	for i := 0; i < a.r; i++ {
		row := a.v[i*a.c : (i+1)*a.c]
		var s float64
		for _, x := range row {
			s += x * x
		}
		norms[i] = math.Sqrt(s) + eps
		for j, x := range row {
			out.v[i*a.c+j] = x / norms[i]
		}
	}
	out.back = func() {
		for i := 0; i < a.r; i++ {
			y, g := out.v[i*a.c:(i+1)*a.c], out.g[i*a.c:(i+1)*a.c]
			var dot float64
			for j := range y {
				dot += y[j] * g[j]
			}
			for j := range y {
				a.g[i*a.c+j] += (g[j] - y[j]*dot) / norms[i]
			}
		}
	}
	return out
}

// rowMeanDot is, for each row i, mean_j a[i,j]·b[i,j] (a r×1 column):
// GraphRouter's edge score.
func (t *tape) rowMeanDot(a, b *node) *node {
	if a.r != b.r || a.c != b.c {
		panic(fmt.Sprintf("baselines: rowMeanDot %dx%d · %dx%d", a.r, a.c, b.r, b.c))
	}
	out := t.newNode(a.r, 1, a.g != nil || b.g != nil)
	inv := 1 / float64(a.c)
	for i := 0; i < a.r; i++ {
		var s float64
		for j := 0; j < a.c; j++ {
			s += a.v[i*a.c+j] * b.v[i*a.c+j]
		}
		out.v[i] = s * inv
	}
	out.back = func() {
		for i := 0; i < a.r; i++ {
			g := out.g[i] * inv
			for j := 0; j < a.c; j++ {
				if a.g != nil {
					a.g[i*a.c+j] += g * b.v[i*a.c+j]
				}
				if b.g != nil {
					b.g[i*a.c+j] += g * a.v[i*a.c+j]
				}
			}
		}
	}
	return out
}

// mse is the mean over the entries with weight w > 0 of w·(a - y)², divided
// by the sum of the weights (the loss of the MLP router).
func (t *tape) mse(a *node, y, w []float64) *node {
	out := t.newNode(1, 1, true)
	var sw float64
	for i := range a.v {
		if w[i] > 0 {
			d := a.v[i] - y[i]
			out.v[0] += w[i] * d * d
			sw += w[i]
		}
	}
	if sw == 0 {
		return out
	}
	out.v[0] /= sw
	out.back = func() {
		if a.g == nil {
			return
		}
		for i := range a.v {
			if w[i] > 0 {
				a.g[i] += out.g[0] * 2 * w[i] * (a.v[i] - y[i]) / sw
			}
		}
	}
	return out
}

// bce is the mean over the entries with weight w > 0 of the binary cross
// entropy of logits a against soft targets y in [0, 1], weighted by w and
// divided by the sum of the weights. It is computed stably:
// max(a,0) - a·y + log(1 + exp(-|a|)).
func (t *tape) bce(a *node, y, w []float64) *node {
	out := t.newNode(1, 1, true)
	var sw float64
	for i, x := range a.v {
		if w[i] > 0 {
			out.v[0] += w[i] * (max(x, 0) - x*y[i] + math.Log1p(math.Exp(-math.Abs(x))))
			sw += w[i]
		}
	}
	if sw == 0 {
		return out
	}
	out.v[0] /= sw
	out.back = func() {
		if a.g == nil {
			return
		}
		for i, x := range a.v {
			if w[i] > 0 {
				a.g[i] += out.g[0] * w[i] * (sigmoid(x) - y[i]) / sw
			}
		}
	}
	return out
}

// choice is one term of a softmax cross entropy over some entries of a row:
// cols[0] is the positive, the rest its negatives.
type choice struct {
	row  int
	cols []int
}

// choiceCE is the sum over terms of -log softmax(a[row, cols])[0], divided
// by div: RouterDC's contrastive losses (div is the batch size, so a masked
// term counts as zero in the mean, as in its code).
func (t *tape) choiceCE(a *node, terms []choice, div float64) *node {
	out := t.newNode(1, 1, true)
	probs := make([][]float64, len(terms))
	for k, tm := range terms {
		m := math.Inf(-1)
		for _, j := range tm.cols {
			m = max(m, a.v[tm.row*a.c+j])
		}
		p := make([]float64, len(tm.cols))
		var z float64
		for i, j := range tm.cols {
			p[i] = math.Exp(a.v[tm.row*a.c+j] - m)
			z += p[i]
		}
		for i := range p {
			p[i] /= z
		}
		probs[k] = p
		out.v[0] -= math.Log(max(p[0], 1e-300)) / div
	}
	out.back = func() {
		if a.g == nil {
			return
		}
		for k, tm := range terms {
			for i, j := range tm.cols {
				d := probs[k][i]
				if i == 0 {
					d--
				}
				a.g[tm.row*a.c+j] += out.g[0] * d / div
			}
		}
	}
	return out
}

// pair is a preference: in row i, column win beat column lose.
type pair struct{ row, win, lose int }

// pairBCE is the mean over pairs of -log σ(a[row,win] - a[row,lose]): the
// Bradley–Terry loss of RouteLLM's matrix factorisation.
func (t *tape) pairBCE(a *node, pairs []pair) *node {
	out := t.newNode(1, 1, true)
	if len(pairs) == 0 {
		return out
	}
	n := float64(len(pairs))
	for _, p := range pairs {
		d := a.v[p.row*a.c+p.win] - a.v[p.row*a.c+p.lose]
		out.v[0] += (max(-d, 0) + math.Log1p(math.Exp(-math.Abs(d)))) / n
	}
	out.back = func() {
		if a.g == nil {
			return
		}
		for _, p := range pairs {
			d := a.v[p.row*a.c+p.win] - a.v[p.row*a.c+p.lose]
			g := out.g[0] * (sigmoid(d) - 1) / n
			a.g[p.row*a.c+p.win] += g
			a.g[p.row*a.c+p.lose] -= g
		}
	}
	return out
}

// sum2 is a + b for two 1×1 losses, b weighted by wb.
func (t *tape) sum2(a, b *node, wb float64) *node {
	out := t.newNode(1, 1, true)
	out.v[0] = a.v[0] + wb*b.v[0]
	out.back = func() {
		a.g[0] += out.g[0]
		b.g[0] += wb * out.g[0]
	}
	return out
}

func sigmoid(x float64) float64 {
	if x >= 0 {
		return 1 / (1 + math.Exp(-x))
	}
	e := math.Exp(x)
	return e / (1 + e)
}

// adamW is Adam with decoupled weight decay (Loshchilov & Hutter), as
// RouterDC and GraphRouter train (RouteLLM's Adam couples it; the
// difference is small at its 1e-5).
type adamW struct {
	lr, beta1, beta2, eps, decay float64
	step                         int
	params                       []*param
}

func newAdamW(lr, decay float64, params []*param) *adamW {
	for _, p := range params {
		p.m, p.v = make([]float64, len(p.w)), make([]float64, len(p.w))
	}
	return &adamW{lr: lr, beta1: 0.9, beta2: 0.999, eps: 1e-8, decay: decay, params: params}
}

// update applies the gradients in p.g and zeroes them.
func (o *adamW) update() {
	o.step++
	c1 := 1 - math.Pow(o.beta1, float64(o.step))
	c2 := 1 - math.Pow(o.beta2, float64(o.step))
	for _, p := range o.params {
		for i, g := range p.g {
			p.m[i] = o.beta1*p.m[i] + (1-o.beta1)*g
			p.v[i] = o.beta2*p.v[i] + (1-o.beta2)*g*g
			p.w[i] -= o.lr * (p.m[i]/c1/(math.Sqrt(p.v[i]/c2)+o.eps) + o.decay*p.w[i])
			p.g[i] = 0
		}
	}
}

// finite reports whether a loss value is usable.
func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }
