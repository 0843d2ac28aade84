package baselines

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
)

// graphModel is "graphrouter", GraphRouter (Feng et al., 2025, "GraphRouter:
// A Graph-based Router for LLM Selections", §3; ulab-uiuc/GraphRouter
// model/graph_nn.py). A heterogeneous graph has task nodes (one per
// dataset), question nodes and model nodes; question–task edges say which
// task a question belongs to, question–model edges carry the observed
// performance (F1) and normalised cost as edge features. Following the
// code:
//
//   - FeatureAlign: a question node starts as [W_t e_task + b_t ; W_q e_q +
//     b_q] (2·hidden), e_task the embedding of the task's description and
//     e_q the question's; a model node as W_l e_model + b_l, e_model the
//     embedding of "name: description" from the pool;
//   - two message-passing layers (GeneralConv with edge attributes): a
//     model node adds to its self-transform the mean over its visible edges
//     of W_msg h_q + W_edge a_qm, a_qm = ReLU(W_e [perf, cost] + b_e); ReLU
//     after the first layer; question nodes have no incoming edges and keep
//     their self-transform;
//   - edge prediction: the performance of (q, m) is σ(mean(h⁰_q ⊙ h²_m)),
//     the initial question features against the propagated model node, as
//     in the code; a second head predicts the normalised cost as
//     σ(mean(h⁰_q ⊙ W_c h²_m) + b_c);
//   - training: full-graph AdamW steps; at each step a random graphrouter.
//     mask_rate share of the training edges is hidden from message passing
//     and predicted, with the binary cross entropy against the observed F1
//     (soft label) plus cost_weight times that of the normalised cost.
//
// Routing embeds the question and its dataset's description (any dataset:
// the task node of one unseen in training is built from its description,
// the inductive use the paper makes of descriptions), propagates nothing
// new (the model nodes' states with every training edge visible are
// computed at each model-selection check and saved with the kept weights)
// and picks argmax_m perf − λ·cost over the predicted edges. The held-out
// questions of model selection (select.go) are nodes without edges. Departures: mean instead of sum aggregation and no batch norm (a
// model node here has thousands of edges); the edge target is the F1 and
// cost themselves rather than a one-hot "best model under a fixed λ", so
// that cost_lambda is chosen at routing time; the task description texts
// are taskDescriptions'.
type graphModel struct {
	wt, bt, wq, bq, wl, bl *param
	we, be                 *param
	ws1, wm1, wa1, bc1     *param
	ws2, wm2, wa2, bc2     *param
	wc, bcost              *param
	states                 *param // model nodes after training (all training edges visible)
	lambda                 float64
}

// taskDescriptions are the task node texts of the seven QA datasets.
var taskDescriptions = map[string]string{
	"nq":        "Natural Questions: real questions people asked Google, each answered by a short span of one Wikipedia page; single-hop factoid questions.",
	"triviaqa":  "TriviaQA: trivia questions written by quiz enthusiasts, each answered by one entity or fact; single-hop factoid questions.",
	"popqa":     "PopQA: questions about one fact of an entity (occupation, birthplace, author, capital), many of them about rare entities; single-hop factoid questions.",
	"hotpotqa":  "HotpotQA: multi-hop questions that need facts from two Wikipedia articles combined, by bridging entities or comparing them.",
	"2wiki":     "2WikiMultihopQA: multi-hop questions composed from two Wikipedia articles and Wikidata relations: comparison, inference and compositional questions.",
	"musique":   "MuSiQue: multi-hop questions composed of two to four chained single-hop questions.",
	"bamboogle": "Bamboogle: hand-written two-hop questions that search engines answer wrongly, each composed of two facts.",
}

// taskText is the description of a dataset's task node.
func taskText(dataset string) string {
	if d, ok := taskDescriptions[strings.ToLower(dataset)]; ok {
		return d
	}
	return "Question answering dataset " + dataset + "."
}

func newGraph(dim, hidden, models int, rng *rand.Rand) *graphModel {
	h2 := 2 * hidden
	p := func(name string, r, c int, scale float64) *param { return newParam(name, r, c, scale, rng) }
	return &graphModel{
		wt: p("align.task.w", dim, hidden, glorot(dim, hidden)), bt: p("align.task.b", 1, hidden, 0),
		wq: p("align.query.w", dim, hidden, glorot(dim, hidden)), bq: p("align.query.b", 1, hidden, 0),
		wl: p("align.llm.w", dim, h2, glorot(dim, h2)), bl: p("align.llm.b", 1, h2, 0),
		we: p("edge_mlp.w", 2, 2, glorot(2, 2)), be: p("edge_mlp.b", 1, 2, 0),
		ws1: p("conv1.self", h2, h2, glorot(h2, h2)), wm1: p("conv1.message", h2, h2, glorot(h2, h2)),
		wa1: p("conv1.edge", 2, h2, glorot(2, h2)), bc1: p("conv1.b", 1, h2, 0),
		ws2: p("conv2.self", h2, h2, glorot(h2, h2)), wm2: p("conv2.message", h2, h2, glorot(h2, h2)),
		wa2: p("conv2.edge", 2, h2, glorot(2, h2)), bc2: p("conv2.b", 1, h2, 0),
		wc: p("cost.w", h2, h2, glorot(h2, h2)), bcost: p("cost.b", 1, 1, 0),
		states: p("model_states", models, h2, 0),
	}
}

// trained are the parameters AdamW updates (all but states).
func (g *graphModel) trained() []*param {
	return []*param{g.wt, g.bt, g.wq, g.bq, g.wl, g.bl, g.we, g.be, g.ws1, g.wm1, g.wa1, g.bc1,
		g.ws2, g.wm2, g.wa2, g.bc2, g.wc, g.bcost}
}

func (g *graphModel) weights() []*param { return append(g.trained(), g.states) }

// edge is a question–model edge of the training graph.
type edge struct {
	q, m       int
	perf, cost float64
}

// initial returns the question nodes' initial features h⁰_q from the
// question embeddings xq and task embeddings xt (taskOf: each question's
// task row).
func (g *graphModel) initial(t *tape, xq, xt *node, taskOf []int) *node {
	at := t.addRow(t.matmul(xt, t.param(g.wt)), t.param(g.bt))
	aq := t.addRow(t.matmul(xq, t.param(g.wq)), t.param(g.bq))
	return t.concat(t.rows(at, taskOf), aq)
}

// propagate runs the two layers over the visible edges and returns the
// model nodes' states h²_m.
func (g *graphModel) propagate(t *tape, h0q, xl *node, vis []edge, nq, nm int) *node {
	deg := make([]float64, nm)
	for _, e := range vis {
		deg[e.m]++
	}
	adj := make([]float64, nm*nq)          // mean over each model's visible questions
	byEdge := make([]float64, nm*len(vis)) // mean over each model's visible edges
	attrs := make([]float64, 2*len(vis))
	for k, e := range vis {
		adj[e.m*nq+e.q] += 1 / deg[e.m]
		byEdge[e.m*len(vis)+k] = 1 / deg[e.m]
		attrs[2*k], attrs[2*k+1] = e.perf, e.cost
	}
	a, b := t.input(nm, nq, adj), t.input(nm, len(vis), byEdge)
	ea := t.relu(t.addRow(t.matmul(t.input(len(vis), 2, attrs), t.param(g.we)), t.param(g.be)))
	h0m := t.addRow(t.matmul(xl, t.param(g.wl)), t.param(g.bl))
	msg1 := t.add2(t.matmul(a, t.matmul(h0q, t.param(g.wm1))), t.matmul(b, t.matmul(ea, t.param(g.wa1))))
	h1m := t.relu(t.addRow(t.add2(t.matmul(h0m, t.param(g.ws1)), msg1), t.param(g.bc1)))
	h1q := t.relu(t.addRow(t.matmul(h0q, t.param(g.ws1)), t.param(g.bc1)))
	msg2 := t.add2(t.matmul(a, t.matmul(h1q, t.param(g.wm2))), t.matmul(b, t.matmul(ea, t.param(g.wa2))))
	return t.addRow(t.add2(t.matmul(h1m, t.param(g.ws2)), msg2), t.param(g.bc2))
}

// tasks embeds the descriptions of the distinct datasets (sorted) and
// returns each question's row.
func tasks(ctx context.Context, datasets []string, embed func(context.Context, []string) ([]float64, error)) ([]float64, int, []int, error) {
	set := map[string]int{}
	for _, d := range datasets {
		set[d] = 0
	}
	names := slices.Sorted(maps.Keys(set))
	texts := make([]string, len(names))
	for i, n := range names {
		set[n], texts[i] = i, taskText(n)
	}
	x, err := embed(ctx, texts)
	if err != nil {
		return nil, 0, nil, err
	}
	of := make([]int, len(datasets))
	for i, d := range datasets {
		of[i] = set[d]
	}
	return x, len(names), of, nil
}

func (g *graphModel) scores(ctx context.Context, in scoreInput) ([][]float64, error) {
	xt, nt, taskOf, err := tasks(ctx, in.datasets, in.embed)
	if err != nil {
		return nil, err
	}
	t := &tape{infer: true}
	h0 := g.initial(t, t.input(in.n, in.dim, in.x), t.input(nt, in.dim, xt), taskOf)
	st := t.param(g.states)
	inv := 1 / float64(h0.c)
	perf := t.scale(t.matmulT(h0, st), inv)
	cost := t.scale(t.matmulT(h0, t.matmul(st, t.param(g.wc))), inv)
	out := make([][]float64, in.n)
	for i := range out {
		out[i] = make([]float64, st.r)
		for j := range out[i] {
			out[i][j] = sigmoid(perf.v[i*st.r+j]) - g.lambda*sigmoid(cost.v[i*st.r+j]+g.bcost.w[0])
		}
	}
	return out, nil
}

func fitGraph(ctx context.Context, d *fitData, c Config, rng *rand.Rand) (model, error) {
	h := c.GraphRouter
	nq, nm := len(d.m.Questions), len(d.models)
	g := newGraph(d.dim, h.Hidden, nm, rng)
	g.lambda = h.CostLambda
	datasets := make([]string, nq)
	for i, q := range d.m.Questions {
		datasets[i] = q.Dataset
	}
	xt, nt, taskOf, err := tasks(ctx, datasets, d.embed)
	if err != nil {
		return nil, err
	}
	mtexts := make([]string, nm)
	for j, m := range d.models {
		mtexts[j] = m.Name + ": " + m.Description
	}
	xl, err := d.embed(ctx, mtexts)
	if err != nil {
		return nil, err
	}
	top := 0.0
	for _, row := range d.m.Cost {
		top = max(top, slices.Max(row))
	}
	var edges []edge // the training questions' (held-out ones are nodes without edges)
	for _, q := range d.train {
		for m := range nm {
			e := edge{q: q, m: m, perf: d.m.F1[q][m]}
			if top > 0 {
				e.cost = d.m.Cost[q][m] / top
			}
			edges = append(edges, e)
		}
	}
	// settle sets the model nodes routing uses (every training edge
	// visible) and checks the held-out questions with them.
	settle := func() error {
		t := &tape{infer: true}
		h0 := g.initial(t, t.input(nq, d.dim, d.x), t.input(nt, d.dim, xt), taskOf)
		copy(g.states.w, g.propagate(t, h0, t.input(nm, d.dim, xl), edges, nq, nm).v)
		return d.val.check(ctx, d, g)
	}
	every := max(1, h.Steps/20)
	opt := newAdamW(h.LR, h.WeightDecay, g.trained())
	for step := 0; step < h.Steps; step++ {
		if err := checkCtx(ctx, step); err != nil {
			return nil, err
		}
		var vis, pred []edge
		for _, e := range edges {
			if rng.Float64() < h.MaskRate {
				pred = append(pred, e)
			} else {
				vis = append(vis, e)
			}
		}
		if len(pred) == 0 || len(vis) == 0 {
			continue
		}
		t := &tape{}
		h0 := g.initial(t, t.input(nq, d.dim, d.x), t.input(nt, d.dim, xt), taskOf)
		h2 := g.propagate(t, h0, t.input(nm, d.dim, xl), vis, nq, nm)
		qs, ms := make([]int, len(pred)), make([]int, len(pred))
		perf, cost, ones := make([]float64, len(pred)), make([]float64, len(pred)), make([]float64, len(pred))
		for k, e := range pred {
			qs[k], ms[k], perf[k], cost[k], ones[k] = e.q, e.m, e.perf, e.cost, 1
		}
		hq := t.rows(h0, qs)
		lp := t.bce(t.rowMeanDot(hq, t.rows(h2, ms)), perf, ones)
		lc := t.bce(t.addRow(t.rowMeanDot(hq, t.rows(t.matmul(h2, t.param(g.wc)), ms)), t.param(g.bcost)), cost, ones)
		loss := t.sum2(lp, lc, h.CostWeight)
		if !finite(loss.v[0]) {
			return nil, fmt.Errorf("loss %v at step %d; lower baselines.graphrouter.lr", loss.v[0], step)
		}
		t.backward(loss)
		opt.update()
		if (step+1)%every == 0 || step == h.Steps-1 {
			if err := settle(); err != nil {
				return nil, err
			}
		}
	}
	return g, nil
}

func buildGraph(man *Manifest) (model, error) {
	var h GraphRouterConfig
	if err := decodeHyper(man, &h); err != nil {
		return nil, err
	}
	if h.Hidden < 1 {
		return nil, fmt.Errorf("hidden %d", h.Hidden)
	}
	g := newGraph(man.Dim, h.Hidden, len(man.Models), nil)
	g.lambda = h.CostLambda
	return g, nil
}
