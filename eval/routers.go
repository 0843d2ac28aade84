// Package eval evaluates routers on the QA test sets: the trained policy and
// baseline routers through the same harness and the same pool, so one table
// compares them in one run. Results per question are appended to JSONL files
// so an interrupted evaluation resumes where it stopped.
package eval

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/eval/embed"
	"github.com/recal-project/recal/internal/inputfile"
	"github.com/recal-project/recal/internal/procgroup"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/llmpool"
	"github.com/recal-project/recal/router"
)

// Router answers a batch of questions.
type Router interface {
	Answer(ctx context.Context, qs []data.Example) ([]rollout.QuestionResult, error)
}

// Setup is what routers are built from.
type Setup struct {
	Env      *rollout.Env // the policy, pool and prompt
	Batch    int          // questions decoded together
	Seed     int64        // for the random router
	Largest  string       // pool model the "largest" router uses ("" = the highest output price)
	Selector string       // pool model the "prompt" router asks ("" = Largest)
	KNNLog   string       // rollouts.jsonl with logged outcomes for "knn"
	KNNK     int          // neighbours for "knn"
	// CoTTemplate is the cot router's prompt template ("" = CoTTemplateName
	// beside router.prompt_template).
	CoTTemplate string
	// SFTCheckpoint is the sft router's checkpoint (recal train-sft-direct).
	SFTCheckpoint string
	// Outcomes is the outcome matrix (recal collect --out) the cascade
	// router fits its stopping rule on; CascadeThreshold is its threshold
	// in [0, 1] (cascade.go).
	Outcomes         string
	CascadeThreshold float64
	// CostLambda, when set, makes the fitted routers route at this
	// cost_lambda instead of the one they were fitted with
	// (baselines.Router.SetCostLambda; recal frontier's sweep).
	CostLambda *float64
	// RouterDir holds one folder per fitted baseline router (recal fit
	// --router-dir); Embedding and EmbeddingCache are the [embedding] table
	// and disk-cache folder they embed questions with (fitted.go).
	RouterDir      string
	Embedding      embed.Config
	EmbeddingCache string
	// Pool is the configuration Env's pool was built from; its part that
	// decides answers keys the results files (see identity.go).
	Pool llmpool.Config
	// InDomain are the datasets trained on (data.Config.InDomain), marked
	// in the tables; the others are out of domain.
	InDomain []string
	// Group is the data-parallel process group (nil: one process): Run
	// shares each router's questions among its ranks, and rank 0 alone
	// writes the results and returns the table (shard.go).
	Group procgroup.Group
}

// Spec is a registered router.
type Spec struct {
	// New builds the router.
	New func(s Setup) (Router, error)
	// Inputs names what decides the router's answers besides its name (parts
	// of inputParts in identity.go); results are resumed only under the
	// same inputs.
	Inputs []string
}

// Routers is the registry of routers by name; each entry's doc says what it
// does. Unknown names are an error listing these.
var Routers = map[string]Spec{
	// policy: the trained checkpoint runs the routing protocol (greedy).
	"policy": {New: func(s Setup) (Router, error) { return policyRouter{s}, nil },
		Inputs: []string{"checkpoint", "policy", "router", "pool"}},
	// direct: the policy answers alone: no model is listed and no call is made.
	"direct": {New: newDirect, Inputs: []string{"checkpoint", "policy", "router"}},
	// cot: the policy answers alone after thinking step by step (cot.go).
	"cot": {New: newCoT, Inputs: []string{"checkpoint", "policy", "cot"}},
	// sft: the SFT-direct checkpoint (--sft-checkpoint) answers alone (cot.go).
	"sft": {New: newSFT, Inputs: []string{"sft", "policy", "router"}},
	// largest: the pool's largest model (highest output price, or --largest) answers every question directly.
	"largest": {New: func(s Setup) (Router, error) {
		m, err := largest(s)
		return fixedRouter{s: s, pick: func(data.Example) string { return m }}, err
	}, Inputs: []string{"pool", "largest"}},
	// random: a pool model drawn uniformly per question (seeded) answers directly.
	"random": {New: func(s Setup) (Router, error) {
		models := s.Env.Pool.Models()
		return fixedRouter{s: s, pick: func(q data.Example) string {
			h := fnv.New64a()
			fmt.Fprintf(h, "%d/%s", s.Seed, q.ID)
			return models[h.Sum64()%uint64(len(models))].Name
		}}, nil
	}, Inputs: []string{"pool", "seed"}},
	// prompt: a pool model is asked which model should answer (given the
	// descriptions); the first pool name in its reply answers directly.
	"prompt": {New: newPromptRouter, Inputs: []string{"pool", "largest", "selector"}},
	// knn: the k nearest logged training questions (token-set cosine); the
	// model with the best mean answer F1 on them answers directly.
	"knn": {New: newKNN, Inputs: []string{"pool", "knn"}},
	// mlp, routellm-mf, routerdc, graphrouter: the trainable baselines of
	// package baselines (RouterBench's MLP, RouteLLM's matrix factorisation,
	// RouterDC, GraphRouter), fitted by `recal fit` into --router-dir/<name>;
	// the model each picks answers directly (fitted.go).
	"mlp":         fittedSpec("mlp"),
	"routellm-mf": fittedSpec("routellm-mf"),
	"routerdc":    fittedSpec("routerdc"),
	"graphrouter": fittedSpec("graphrouter"),
	// cascade: FrugalGPT's cascade, the pool's models cheapest first until
	// a stopping rule fitted on --outcomes trusts the answer
	// (baselines.CascadeRule); every call counts (cascade.go).
	"cascade": {New: newCascade, Inputs: []string{"pool", "cascade"}},
	// prompt-decomp, knn-decomp: prompt and knn with task decomposition
	// (Table 1's Prompt LLM* and KNN Router*): the selector splits the
	// question, each sub-question is routed and answered, the selector
	// composes the answer (decompose.go).
	"prompt-decomp": {New: withDecomposition(newPromptRouter), Inputs: []string{"pool", "largest", "selector", "decompose"}},
	"knn-decomp":    {New: withDecomposition(newKNN), Inputs: []string{"pool", "largest", "selector", "knn", "decompose"}},
}

// RouterNames lists the registered routers.
func RouterNames() []string {
	var out []string
	for k := range Routers {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// NewRouter builds a registered router.
func NewRouter(name string, s Setup) (Router, error) {
	spec, ok := Routers[name]
	if !ok {
		return nil, fmt.Errorf("eval: unknown router %q (known: %s)", name, strings.Join(RouterNames(), ", "))
	}
	return spec.New(s)
}

type policyRouter struct{ s Setup }

func (r policyRouter) Answer(ctx context.Context, qs []data.Example) ([]rollout.QuestionResult, error) {
	return rollout.Answer(ctx, r.s.Env, qs, r.s.Batch)
}

// newDirect runs the policy with a prompt that lists no models and allows no call.
func newDirect(s Setup) (Router, error) {
	cfg := s.Env.Router
	cfg.MaxTurns = 0
	prompt, err := router.NewPrompt(cfg.PromptTemplate, nil, 0)
	if err != nil {
		return nil, err
	}
	env := s.Env.WithPrompt(prompt, cfg)
	return policyRouter{Setup{Env: env, Batch: s.Batch}}, nil
}

func largest(s Setup) (string, error) {
	models := s.Env.Pool.Models()
	if s.Largest != "" {
		m, ok := s.Env.Pool.Lookup(s.Largest)
		if !ok {
			return "", fmt.Errorf("eval: --largest %q is not a pool model", s.Largest)
		}
		return m.Name, nil
	}
	best := models[0]
	for _, m := range models[1:] {
		if m.PriceOut > best.PriceOut {
			best = m
		}
	}
	return best.Name, nil
}

// fixedRouter sends each question, as is, to the model pick chooses.
type fixedRouter struct {
	s    Setup
	pick func(data.Example) string
}

func (r fixedRouter) Answer(ctx context.Context, qs []data.Example) ([]rollout.QuestionResult, error) {
	models := make([]string, len(qs))
	for i, q := range qs {
		models[i] = r.pick(q)
	}
	return directAnswers(ctx, r.s.Env.Pool, qs, models)
}

// directAnswers asks models[i] question i and scores the extracted answer.
func directAnswers(ctx context.Context, pool *llmpool.Pool, qs []data.Example, models []string) ([]rollout.QuestionResult, error) {
	reqs := make([]llmpool.Request, len(qs))
	for i, q := range qs {
		qq := rollout.Question(q)
		reqs[i] = llmpool.Request{Model: models[i], Query: q.Question, Question: &qq}
	}
	resps := pool.CallBatch(ctx, reqs)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := make([]rollout.QuestionResult, len(qs))
	for i, q := range qs {
		ans := ExtractAnswer(resps[i].Text)
		if resps[i].Failed {
			ans = ""
		}
		out[i] = rollout.QuestionResult{ID: q.ID, Dataset: q.Dataset, Question: q.Question, Golden: q.Golden, Answer: ans,
			EM: data.ExactMatch(ans, q.Golden), F1: data.F1(ans, q.Golden), WellFormed: !resps[i].Failed,
			Calls: []router.Call{{Model: resps[i].Model, Query: q.Question, Reply: resps[i].Text, Evidence: resps[i].Evidence, Failed: resps[i].Failed,
				Cached: resps[i].Cached, Cost: resps[i].Cost, Latency: resps[i].Latency}},
			Cost: resps[i].Cost, Response: resps[i].Text}
	}
	return out, nil
}

// ExtractAnswer takes the short answer out of a model's free-text reply: the
// last <answer> element if any, else the text after the last "answer is",
// else the reply; a leading "[...]" tag and a final period are dropped.
func ExtractAnswer(reply string) string {
	if a, ok := router.LastAnswer(reply); ok {
		return a
	}
	text := strings.TrimSpace(reply)
	if strings.HasPrefix(text, "[") {
		if k := strings.Index(text, "]"); k >= 0 {
			text = strings.TrimSpace(text[k+1:])
		}
	}
	if k := strings.LastIndex(strings.ToLower(text), "answer is"); k >= 0 {
		text = strings.TrimSpace(text[k+len("answer is"):])
	}
	return strings.TrimSpace(strings.TrimSuffix(text, "."))
}

// promptRouter asks a selector model which pool model should answer.
type promptRouter struct {
	s        Setup
	selector string
}

func newPromptRouter(s Setup) (Router, error) {
	sel, err := selectorOf(s)
	if err != nil {
		return nil, err
	}
	return promptRouter{s: s, selector: sel}, nil
}

// selectorOf is the pool model asked to select (and, with decomposition,
// to split and compose): --selector, else the largest.
func selectorOf(s Setup) (string, error) {
	if s.Selector == "" {
		return largest(s)
	}
	if m, ok := s.Env.Pool.Lookup(s.Selector); ok {
		return m.Name, nil
	}
	return "", fmt.Errorf("eval: --selector %q is not a pool model", s.Selector)
}

func (r promptRouter) Answer(ctx context.Context, qs []data.Example) ([]rollout.QuestionResult, error) {
	questions := make([]string, len(qs))
	for i, q := range qs {
		questions[i] = q.Question
	}
	picks, sel, err := r.pickFor(ctx, qs, questions)
	if err != nil {
		return nil, err
	}
	out, err := directAnswers(ctx, r.s.Env.Pool, qs, picks)
	if err != nil {
		return nil, err
	}
	for i := range out { // the selection call counts too
		out[i].Calls = append(sel[i], out[i].Calls...)
		out[i].Cost += sel[i][0].Cost
	}
	return out, nil
}

// pickFor asks the selector which model should answer queries[i] (a
// question of qs[i] or a sub-question of it); the selection is one call.
func (r promptRouter) pickFor(ctx context.Context, qs []data.Example, queries []string) ([]string, [][]router.Call, error) {
	models := r.s.Env.Pool.Models()
	var list strings.Builder
	for _, m := range models {
		fmt.Fprintf(&list, "- %s: %s\n", m.Name, m.Description)
	}
	reqs := make([]llmpool.Request, len(qs))
	for i, q := range qs {
		qq := rollout.Question(q)
		reqs[i] = llmpool.Request{Model: r.selector, Question: &qq,
			Query: "Which one of these models should answer the question? Reply with its name only.\n" + list.String() + "Question: " + queries[i]}
	}
	sel := r.s.Env.Pool.CallBatch(ctx, reqs)
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	picks := make([]string, len(qs))
	calls := make([][]router.Call, len(qs))
	for i := range qs {
		picks[i] = firstModelIn(sel[i].Text, models)
		calls[i] = []router.Call{{Model: sel[i].Model, Query: reqs[i].Query, Reply: sel[i].Text, Failed: sel[i].Failed, Cost: sel[i].Cost, Latency: sel[i].Latency}}
	}
	return picks, calls, nil
}

// firstModelIn returns the pool model whose name appears first in text
// (without case), or the first pool model when none does.
func firstModelIn(text string, models []llmpool.ModelInfo) string {
	low := strings.ToLower(text)
	best, at := models[0].Name, -1
	for _, m := range models {
		if k := strings.Index(low, strings.ToLower(m.Name)); k >= 0 && (at < 0 || k < at || (k == at && len(m.Name) > len(best))) {
			best, at = m.Name, k
		}
	}
	return best
}

// knnRouter routes by the logged outcomes of similar training questions.
type knnRouter struct {
	s      Setup
	k      int
	logged []loggedQuestion
	global string // best model over all logged outcomes
}

type loggedQuestion struct {
	words map[string]float64 // normalised token-set vector
	score map[string][2]float64
}

func newKNN(s Setup) (Router, error) {
	if s.KNNLog == "" {
		return nil, fmt.Errorf("eval: router knn needs logged outcomes: --knn-log RUN_DIR/rollouts.jsonl")
	}
	f, err := inputfile.Open(s.KNNLog)
	if err != nil {
		return nil, fmt.Errorf("eval: knn: %w", err)
	}
	defer f.Close()
	byQ := map[string]*loggedQuestion{}
	total := map[string][2]float64{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	line := 0
	for sc.Scan() {
		line++
		var r struct {
			Question   string             `json:"question"`
			RewardsRaw map[string]float64 `json:"rewards_raw"`
			Calls      []router.Call      `json:"calls"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			continue // a torn last line
		}
		if r.Question == "" || len(r.Calls) == 0 || r.Calls[0].Unknown {
			continue
		}
		lq, ok := byQ[r.Question]
		if !ok {
			lq = &loggedQuestion{words: wordVector(r.Question), score: map[string][2]float64{}}
			byQ[r.Question] = lq
		}
		m := r.Calls[0].Model
		v := lq.score[m]
		lq.score[m] = [2]float64{v[0] + r.RewardsRaw["ans"], v[1] + 1}
		t := total[m]
		total[m] = [2]float64{t[0] + r.RewardsRaw["ans"], t[1] + 1}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("eval: knn: %s: %w", s.KNNLog, err)
	}
	if len(byQ) == 0 {
		return nil, fmt.Errorf("eval: knn: %s holds no logged pool calls", s.KNNLog)
	}
	r := &knnRouter{s: s, k: max(s.KNNK, 1)}
	keys := slices.Sorted(maps.Keys(byQ))
	for _, q := range keys {
		r.logged = append(r.logged, *byQ[q])
	}
	r.global = bestModel(total, s.Env.Pool.Models()[0].Name)
	return r, nil
}

func (r *knnRouter) Answer(ctx context.Context, qs []data.Example) ([]rollout.QuestionResult, error) {
	questions := make([]string, len(qs))
	for i, q := range qs {
		questions[i] = q.Question
	}
	picks, _, _ := r.pickFor(ctx, qs, questions)
	return directAnswers(ctx, r.s.Env.Pool, qs, picks)
}

// pickFor routes queries[i] (a question or a sub-question) by its nearest
// logged training questions; no call is made.
func (r *knnRouter) pickFor(_ context.Context, qs []data.Example, queries []string) ([]string, [][]router.Call, error) {
	picks := make([]string, len(qs))
	for i, q := range queries {
		v := wordVector(q)
		type nb struct {
			sim float64
			i   int
		}
		nbs := make([]nb, len(r.logged))
		for j, l := range r.logged {
			nbs[j] = nb{cosine(v, l.words), j}
		}
		sort.SliceStable(nbs, func(a, b int) bool { return nbs[a].sim > nbs[b].sim })
		agg := map[string][2]float64{}
		for _, n := range nbs[:min(r.k, len(nbs))] {
			for m, s := range r.logged[n.i].score {
				a := agg[m]
				agg[m] = [2]float64{a[0] + s[0], a[1] + s[1]}
			}
		}
		picks[i] = bestModel(agg, r.global)
		if _, ok := r.s.Env.Pool.Lookup(picks[i]); !ok {
			picks[i] = r.s.Env.Pool.Models()[0].Name
		}
	}
	return picks, make([][]router.Call, len(qs)), nil
}

func bestModel(scores map[string][2]float64, fallback string) string {
	best, bestV := fallback, -1.0
	for _, m := range slices.Sorted(maps.Keys(scores)) {
		s := scores[m]
		if s[1] > 0 && s[0]/s[1] > bestV {
			best, bestV = m, s[0]/s[1]
		}
	}
	return best
}

func wordVector(text string) map[string]float64 {
	v := map[string]float64{}
	for _, w := range strings.Fields(data.Normalize(text)) {
		v[w] = 1
	}
	n := math.Sqrt(float64(len(v)))
	for w := range v {
		v[w] /= n
	}
	return v
}

func cosine(a, b map[string]float64) float64 {
	var s float64
	for w, x := range a {
		s += x * b[w]
	}
	return s
}
