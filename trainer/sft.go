package trainer

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/internal/tokenizer"
	"github.com/recal-project/recal/llmpool"
	"github.com/recal-project/recal/router"
	"github.com/recal-project/recal/torchbridge"
)

// Demo is one format demonstration: prompt + policy turns + the real
// replies of the pool models it calls.
type Demo struct {
	Tokens  []int32
	Mask    []float32
	Correct bool
}

// DemoOptions are what a demonstration route reads besides the questions.
type DemoOptions struct {
	// Seed draws the uniform route's models (and the prompts' model
	// subsets).
	Seed int64
	// AnswerWeight is the mask of the answer turn's tokens (1 on the other
	// policy tokens, 0 on prompt and replies).
	AnswerWeight float32
	// Chain are the models the "agree" route asks, in order.
	Chain []string
	// DecisionWeight, when > 0, is the mask of the first token of each
	// turn that follows a reply (the choice between answering and asking
	// again) in the "agree" route, in place of its turn's weight.
	DecisionWeight float32
	// BudgetShare is the share of the "agree" route's demonstrations cut
	// by a spent cost budget (config's sft.budget_share).
	BudgetShare float64
}

// DemoRoutes are the warm-up's demonstration routes by name (sft.route,
// config.DemoRoutes): each asks the pool for the questions' replies and
// writes one demonstration a question.
var DemoRoutes = map[string]func(ctx context.Context, env *rollout.Env, qs []data.Example, o DemoOptions) ([]Demo, error){
	"uniform": func(ctx context.Context, env *rollout.Env, qs []data.Example, o DemoOptions) ([]Demo, error) {
		return BuildDemos(ctx, env, qs, o.Seed, o.AnswerWeight)
	},
	"agree": buildAgreeDemos,
}

// BuildDemos is the "uniform" route. It asks, for each question, a pool
// model chosen uniformly by a hash of (seed, question) among the models its
// prompt lists (every pool model, or with env.ModelSubsets the subset
// Env.RowPrompt draws for seed), with the question itself, and writes the
// demonstration: think, search, the reply as information, answer. The
// policy learns the protocol's shape from it; which model to call is left
// to GRPO.
func BuildDemos(ctx context.Context, env *rollout.Env, qs []data.Example, seed int64, answerWeight float32) ([]Demo, error) {
	models := env.Pool.Models()
	if len(models) == 0 {
		return nil, fmt.Errorf("trainer: sft: the pool has no models")
	}
	names := make([]string, len(models))
	for i, m := range models {
		names[i] = m.Name
	}
	reqs := make([]llmpool.Request, len(qs))
	prompts := make([][]int32, len(qs))
	for i, q := range qs {
		// With env.ModelSubsets (train.model_subsets) the prompt lists a
		// random subset of the pool and the demonstration calls one of
		// the models listed, so the warm-up teaches to name a model of
		// the list the prompt gives; otherwise every model is listed.
		prompt, listed, _, err := env.RowPrompt(q, uint64(seed))
		if err != nil {
			return nil, err
		}
		if listed == nil {
			listed = names
		}
		prompts[i] = prompt
		h := fnv.New64a()
		fmt.Fprintf(h, "%d/%s", seed, q.ID)
		qq := rollout.Question(q)
		reqs[i] = llmpool.Request{Model: listed[h.Sum64()%uint64(len(listed))], Query: q.Question, Question: &qq}
	}
	replies := env.Pool.CallBatch(ctx, reqs)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := make([]Demo, len(qs))
	for i, q := range qs {
		out[i] = writeDemo(env, prompts[i], q, []router.Call{{Model: reqs[i].Model, Reply: replies[i].Text}}, answerWeight, 0)
	}
	return out, nil
}

// buildAgreeDemos is the "agree" route, a cascade of o.Chain (FrugalGPT's,
// with agreement as the stopping rule and no labels read): it asks the
// chain's first two models; when the second one's stated answer is
// mentioned by the first reply (router.Agreeing) the demonstration answers
// with it, otherwise it asks the next model, and so on; the chain's last
// model always answers. So the policy is shown a cheap call, a second
// opinion, and an escalation exactly when the replies disagree: a decision
// it can only make by reading them.
func buildAgreeDemos(ctx context.Context, env *rollout.Env, qs []data.Example, o DemoOptions) ([]Demo, error) {
	if len(o.Chain) < 2 {
		return nil, fmt.Errorf("trainer: sft: the agree route needs a chain of at least 2 models, have %q", o.Chain)
	}
	prompts := make([][]int32, len(qs))
	for i, q := range qs {
		prompt, _, _, err := env.RowPrompt(q, uint64(o.Seed))
		if err != nil {
			return nil, err
		}
		prompts[i] = prompt
	}
	calls := make([][]router.Call, len(qs)) // each question's calls, the replies as the pool gave them
	open := make([]int, len(qs))            // the questions still asking
	for i := range open {
		open[i] = i
	}
	for k, model := range o.Chain {
		reqs := make([]llmpool.Request, len(open))
		for j, i := range open {
			qq := rollout.Question(qs[i])
			reqs[j] = llmpool.Request{Model: model, Query: qs[i].Question, Question: &qq}
		}
		replies := env.Pool.CallBatch(ctx, reqs)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var next []int
		for j, i := range open {
			earlier := calls[i]
			c := router.Call{Model: model, Reply: replies[j].Text, Evidence: replies[j].Evidence, Failed: replies[j].Failed}
			calls[i] = append(calls[i], c)
			if k == 0 || len(router.Agreeing(c, earlier)) == 0 {
				next = append(next, i)
			}
		}
		open = next
	}
	out := make([]Demo, len(qs))
	for i, q := range qs {
		out[i] = writeDemo(env, prompts[i], q, budgetCut(calls[i], q.ID, o), o.AnswerWeight, o.DecisionWeight)
	}
	return out, nil
}

// budgetCut is calls as a spent cost budget leaves them, for the share
// o.BudgetShare of questions drawn by a hash of (seed, question): the
// first k replies kept (k = 1, or 1 or 2 drawn alike when more than two
// were asked), then the next model's call refused as router's per-request
// budget refuses it (BudgetText, no reply, no cost), so the demonstration
// answers from the k-th reply. Other questions' calls are returned as they
// are.
func budgetCut(calls []router.Call, id string, o DemoOptions) []router.Call {
	if o.BudgetShare <= 0 || len(calls) < 2 {
		return calls
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "budget/%d/%s", o.Seed, id)
	v := h.Sum64()
	if float64(v%1_000_000)/1_000_000 >= o.BudgetShare {
		return calls
	}
	k := 1 + int((v/1_000_000)%uint64(len(calls)-1))
	out := append([]router.Call(nil), calls[:k]...)
	return append(out, router.Call{Model: calls[k].Model, Reply: router.BudgetText, Failed: true, Refused: true})
}

// writeDemo writes the demonstration of q: for each call, think, search
// (the question itself as the sub-query) and the reply as information;
// then the answer drawn from the last reply (demoAnswer). A reply with no
// answer to copy (a real model's wrong prose, a pool error) ends the
// demonstration after it: imitating its first words would teach the policy
// to copy a reply from its start, which no right answer of a reply that
// states one ("The answer is X.") is. The mask is 1 on the think and search
// turns and answerWeight on the answer turn (0 on prompt and replies); with
// decisionWeight > 0, the first token of each turn after a reply weighs
// decisionWeight instead.
func writeDemo(env *rollout.Env, prompt []int32, q data.Example, calls []router.Call, answerWeight, decisionWeight float32) Demo {
	tok := env.Engine.Tok
	d := Demo{Tokens: append([]int32(nil), prompt...)}
	d.Mask = make([]float32, len(prompt))
	var shown []router.Call // the replies as the policy is shown them (router.agreement's notes compare them)
	for _, c := range calls {
		// The question, the reply and the answer drawn from it are plain
		// text: "<|im_end|>" in them is never a control token.
		turn := rollout.ToInt32(tok.EncodeSegments(tokenizer.Segment{Text: router.ThinkOpen + router.DemoThinkSearch + router.ThinkClose + "\n" + router.SearchOpen + c.Model + ": "},
			tokenizer.Segment{Text: q.Question, Plain: true}, tokenizer.Segment{Text: router.SearchClose}))
		var earlier []router.Call
		if env.Router.Agreement {
			earlier = shown
		}
		info, body := router.InfoBlockNote(tok, c, earlier, env.Router.InfoTokens)
		shown = append(shown, router.Call{Model: c.Model, Reply: body, Evidence: c.Evidence, Failed: c.Failed})
		d.Tokens = append(append(d.Tokens, turn...), info...)
		for range turn {
			d.Mask = append(d.Mask, 1)
		}
		if k := len(d.Mask) - len(turn); decisionWeight > 0 && k > len(prompt) {
			d.Mask[k] = decisionWeight
		}
		d.Mask = append(d.Mask, make([]float32, len(info))...)
	}
	last := calls[len(calls)-1]
	for k := len(calls) - 1; k > 0 && last.Refused; k-- { // a refused call has no reply to answer from
		last = calls[k-1]
	}
	answer, correct, stated := demoAnswer(last.Reply, q.Golden)
	d.Correct = correct
	if stated {
		// A space before the answer: " Paris" is the token the reply has
		// after "The answer is", so answering is copying tokens, not
		// mapping each to its space-less twin (which a small policy cannot
		// do for words it has not seen as the first of an answer).
		turn := rollout.ToInt32(tok.EncodeSegments(tokenizer.Segment{Text: router.AnswerOpen + " "}, tokenizer.Segment{Text: answer, Plain: true}, tokenizer.Segment{Text: router.AnswerClose}))
		d.Tokens = append(d.Tokens, turn...)
		for range turn {
			d.Mask = append(d.Mask, answerWeight)
		}
		if decisionWeight > 0 {
			d.Mask[len(d.Mask)-len(turn)] = decisionWeight
		}
	}
	return d
}

// demoAnswer is a demonstration's answer to reply: the golden answer it
// mentions (correct), else its stated answer (data.StatedAnswer), else nothing
// to copy ("", false, false).
func demoAnswer(reply string, golden []string) (answer string, correct, stated bool) {
	for _, g := range golden {
		if data.Mentions(reply, g) {
			return g, true, true
		}
	}
	a, ok := data.StatedAnswer(reply)
	return a, false, ok
}

// SFTLine is one line of sft.jsonl (the warm-up's, and SFT-direct's).
type SFTLine struct {
	Stage  string  `json:"stage"`
	Step   int     `json:"step"`
	NLL    float64 `json:"nll"`    // mean negative log-likelihood per policy token, weighted by the mask (sft.answer_weight on the answer turn)
	Tokens int     `json:"tokens"` // policy tokens in the step
	Demos  int     `json:"demos"`
}

// runSFT is the supervised warm-up: maximum likelihood of the policy tokens
// of format demonstrations (BuildDemos), fitted by FitDemos, data-parallel
// over the ranks of r.
func runSFT(ctx context.Context, cfg config.Training, env *rollout.Env, r ranks, train []data.Example, run *runDir, log *slog.Logger) error {
	denv := env
	if cfg.Train.ModelSubsets > 0 { // the warm-up's prompts list subsets as GRPO's do
		denv = env.WithPrompt(env.Prompt, env.Router)
		denv.ModelSubsets = cfg.Train.ModelSubsets
	}
	route, ok := DemoRoutes[cfg.SFT.Route]
	if !ok {
		return fmt.Errorf("trainer: sft.route = %q: no such demonstration route", cfg.SFT.Route)
	}
	build := func(step int, qs []data.Example) ([]Demo, error) {
		return route(ctx, denv, qs, DemoOptions{Seed: cfg.Train.Seed + int64(step), AnswerWeight: float32(cfg.SFT.AnswerWeight), Chain: cfg.SFT.Chain,
			DecisionWeight: float32(cfg.SFT.DecisionWeight), BudgetShare: cfg.SFT.BudgetShare})
	}
	return fitShared(ctx, cfg, env.Engine.Policy, r, train, "sft", build, run.logSFT, log)
}

// FitDemos runs sft.steps steps of maximum likelihood of the policy tokens
// (weighted by each demonstration's mask) of the demonstrations build makes
// from each batch of sft.batch_size training questions: AdamW with
// grad-norm clipping and a learning rate decaying linearly from sft.lr to
// zero. record receives one line per step, tagged with stage.
func FitDemos(ctx context.Context, cfg config.Training, p *torchbridge.Policy, train []data.Example, stage string,
	build func(step int, qs []data.Example) ([]Demo, error), record func(SFTLine) error, log *slog.Logger) error {
	r, err := newRanks(nil, p, false, false)
	if err != nil {
		return err
	}
	return fitShared(ctx, cfg, p, r, train, stage, build, record, log)
}

// sftPart is one rank's part of a warm-up step: the demonstrations of its
// share of the questions, or that building them was interrupted.
type sftPart struct {
	Interrupted bool
	Demos       []Demo
}

// fitShared is FitDemos over the ranks of r. Every rank draws the same
// questions and builds (asks the pool for) the demonstrations of its
// contiguous share; the demonstrations are all-gathered, and every rank
// then fits the whole batch exactly as one process does: the same
// micro-batches, the same float32 sums, no gradient all-reduce. So the
// warm-up ends with the weights of one process bit for bit (given the same
// threads per process; sameWeights checks the replicas agree) and the pool
// calls, its slow part with real models, are shared. Its forward and
// backward passes are repeated on every rank, not split: N ranks warm up
// no faster than one.
func fitShared(ctx context.Context, cfg config.Training, p *torchbridge.Policy, r ranks, train []data.Example, stage string,
	build func(step int, qs []data.Example) ([]Demo, error), record func(SFTLine) error, log *slog.Logger) error {
	sampler, err := data.NewSampler(train, cfg.Train.Seed+1)
	if err != nil {
		return err
	}
	tc := cfg.Train
	adam := torchbridge.AdamW{LR: cfg.SFT.LR, Beta1: tc.Beta1, Beta2: tc.Beta2, Eps: tc.AdamEps, WeightDecay: tc.WeightDecay, MaxGradNorm: tc.MaxGradNorm}
	// Once the ranks agreed on a step, it runs to its end on all of them.
	work := context.WithoutCancel(ctx)
	for step := 1; step <= cfg.SFT.Steps; step++ {
		qs := sampler.Next(cfg.SFT.BatchSize)
		lo, hi := r.share(len(qs))
		var mine sftPart
		mine.Demos, err = build(step, qs[lo:hi])
		if err != nil {
			if ctx.Err() == nil {
				return err
			}
			mine = sftPart{Interrupted: true}
		}
		// Collective: every rank's demonstrations, in question order; an
		// interruption on any rank stops all.
		parts, err := allGather(work, r, "demonstrations", mine)
		if err != nil {
			return err
		}
		var demos []Demo
		for _, pt := range parts {
			if pt.Interrupted {
				return ErrInterrupted
			}
			demos = append(demos, pt.Demos...)
		}
		var seqs [][]int32
		var masks [][]float32
		total, tokens := 0.0, 0 // mask weight and count of the scored policy tokens
		for _, d := range demos {
			if cfg.SFT.CorrectOnly && !d.Correct {
				continue
			}
			seqs = append(seqs, d.Tokens)
			masks = append(masks, d.Mask)
			for _, m := range d.Mask[1:] {
				total += float64(m)
				if m > 0 {
					tokens++
				}
			}
		}
		if total == 0 {
			continue
		}
		var nll float64
		for lo := 0; lo < len(seqs); lo += tc.MicroBatch {
			hi := min(lo+tc.MicroBatch, len(seqs))
			n, _, err := p.BackwardNLL(work, seqs[lo:hi], masks[lo:hi], 1/total, tc.HeadChunk)
			if err != nil {
				return err
			}
			nll += n
		}
		// Linear decay to zero: the warm-up ends calibrated rather than
		// tilted by its last batches (which would bias the routing choice
		// GRPO starts from).
		adam.LR = cfg.SFT.LR * float64(cfg.SFT.Steps-step+1) / float64(cfg.SFT.Steps)
		if _, err := p.Step(work, adam); err != nil {
			return err
		}
		if err := record(SFTLine{Stage: stage, Step: step, NLL: nll / total, Tokens: tokens, Demos: len(seqs)}); err != nil {
			return err
		}
		if step%20 == 0 || step == cfg.SFT.Steps {
			log.Info(stage, "step", step, "of", cfg.SFT.Steps, "nll", fmt.Sprintf("%.3f", nll/total))
		}
	}
	// Collective: the replicas must have come out equal.
	return r.sameWeights(work, p)
}
