package eval

import (
	"context"
	"fmt"
	"regexp"
	"strings"

	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/llmpool"
	"github.com/recal-project/recal/router"
)

// Task decomposition: the rows "Prompt LLM*" and "KNN Router*" of the ReCal
// paper's Table 1 (taken from Router-R1's baselines; "*" = with task
// decomposition). Neither paper gives prompts or limits, so recal's are:
//
//  1. The selector (--selector, else the largest model) is asked to split
//     the question into sub-questions, one per line (decomposePrompt). The
//     lines that end with "?" (list markers dropped) are the sub-questions,
//     at most MaxSubQuestions; a reply with none falls back to the question
//     itself as the only sub-question.
//  2. Each sub-question is routed by the base router (prompt: the selector
//     names a model; knn: the nearest logged training questions to the
//     sub-question) and sent, alone, to the chosen model.
//  3. The selector composes the final answer from the sub-questions and
//     their answers (composePrompt); the answer is ExtractAnswer of its reply.
//
// Every call counts in the result (calls and cost): the decomposition, the
// prompt router's selections, the sub-answers and the composition. Every
// call carries the original question (llmpool.Request.Question) and the
// sub-question or prompt as its query.
//
// What the simulated pool (provider sim) does with this: a simulated model
// replies "[simulated NAME] The answer is X." whatever it is asked, X being
// a golden answer of the ORIGINAL question with the model's accuracy on the
// question's dataset (times the query's overlap with the question's content
// words unless ignore_query), else a wrong answer. So the decomposition
// reply holds no line ending in "?": every question falls back to itself
// as its one sub-question, and the final answer is the selector's reply
// to the composition prompt, right with the selector's accuracy on the
// dataset, whatever the sub-answers were. On a simulated pool these rows
// measure the selector (and pay for the extra calls), not decomposition.

// MaxSubQuestions caps the sub-questions of one question.
const MaxSubQuestions = 3

// decomposeVersion changes with the prompts and the parsing below; it keys
// the results (identity.go).
const decomposeVersion = 1

func decomposePrompt(question string) string {
	return fmt.Sprintf("Split the question below into at most %d simpler sub-questions whose answers together answer it. "+
		"Write one sub-question per line, each ending with a question mark, and nothing else. "+
		"If the question is simple, write it unchanged as the only line.\n\nQuestion: %s", MaxSubQuestions, question)
}

func composePrompt(question string, subs, answers []string) string {
	var b strings.Builder
	b.WriteString("Answer the question using the answers to its sub-questions. Reply with the answer only, as a short phrase.\n\n")
	for i, s := range subs {
		fmt.Fprintf(&b, "Sub-question %d: %s\nAnswer %d: %s\n", i+1, s, i+1, answers[i])
	}
	fmt.Fprintf(&b, "\nQuestion: %s", question)
	return b.String()
}

// listMarker is a leading bullet ("-", "*", "•"), number ("1.", "2)") or
// label ("Sub-question 1:"), or a bullet followed by a number or label.
var listMarker = regexp.MustCompile(`^\s*(?:[-*•]\s*)?(?:(?i:sub-?question)\s*\d*\s*[:.)-]|\d+\s*[.):-])?\s*`)

// SubQuestions parses a decomposition reply: the lines ending with "?"
// (list markers dropped), at most MaxSubQuestions; the question itself
// when there are none.
func SubQuestions(reply, question string) []string {
	var out []string
	for _, line := range strings.Split(reply, "\n") {
		line = strings.TrimSpace(listMarker.ReplaceAllString(strings.TrimSpace(line), ""))
		if strings.HasSuffix(line, "?") && len(out) < MaxSubQuestions {
			out = append(out, line)
		}
	}
	if len(out) == 0 {
		return []string{question}
	}
	return out
}

// subPicker routes sub-questions: models[i] answers queries[i], a
// sub-question of qs[i]; calls[i] are the calls routing it made.
type subPicker interface {
	pickFor(ctx context.Context, qs []data.Example, queries []string) (models []string, calls [][]router.Call, err error)
}

// decomposeRouter is a base router with task decomposition (see above).
type decomposeRouter struct {
	s        Setup
	selector string
	base     subPicker
}

// withDecomposition builds the decomposition variant of a base router.
func withDecomposition(newBase func(Setup) (Router, error)) func(Setup) (Router, error) {
	return func(s Setup) (Router, error) {
		b, err := newBase(s)
		if err != nil {
			return nil, err
		}
		p, ok := b.(subPicker)
		if !ok {
			panic(fmt.Sprintf("eval: %T cannot route sub-questions", b)) // a registry bug
		}
		sel, err := selectorOf(s)
		if err != nil {
			return nil, err
		}
		return decomposeRouter{s: s, selector: sel, base: p}, nil
	}
}

func (r decomposeRouter) Answer(ctx context.Context, qs []data.Example) ([]rollout.QuestionResult, error) {
	pool := r.s.Env.Pool
	ask := func(reqs []llmpool.Request) ([]llmpool.Response, error) {
		resps := pool.CallBatch(ctx, reqs)
		return resps, ctx.Err()
	}
	// 1. Decompose.
	reqs := make([]llmpool.Request, len(qs))
	for i, q := range qs {
		qq := rollout.Question(q)
		reqs[i] = llmpool.Request{Model: r.selector, Query: decomposePrompt(q.Question), Question: &qq}
	}
	dec, err := ask(reqs)
	if err != nil {
		return nil, err
	}
	calls := make([][]router.Call, len(qs))
	var owner []int // question of each sub-question
	var subQs []data.Example
	var subs []string
	for i, q := range qs {
		calls[i] = append(calls[i], callOf(reqs[i], dec[i]))
		split := []string{q.Question}
		if !dec[i].Failed {
			split = SubQuestions(dec[i].Text, q.Question)
		}
		for _, s := range split {
			owner = append(owner, i)
			subQs = append(subQs, q)
			subs = append(subs, s)
		}
	}
	// 2. Route each sub-question and ask the chosen model.
	models, routing, err := r.base.pickFor(ctx, subQs, subs)
	if err != nil {
		return nil, err
	}
	reqs = make([]llmpool.Request, len(subs))
	for k := range subs {
		qq := rollout.Question(subQs[k])
		reqs[k] = llmpool.Request{Model: models[k], Query: subs[k], Question: &qq}
	}
	ans, err := ask(reqs)
	if err != nil {
		return nil, err
	}
	subsOf := make([][]string, len(qs))
	answersOf := make([][]string, len(qs))
	for k, i := range owner {
		calls[i] = append(calls[i], routing[k]...)
		calls[i] = append(calls[i], callOf(reqs[k], ans[k]))
		a := "(no answer)"
		if !ans[k].Failed {
			a = ExtractAnswer(ans[k].Text)
		}
		subsOf[i] = append(subsOf[i], subs[k])
		answersOf[i] = append(answersOf[i], a)
	}
	// 3. Compose.
	reqs = make([]llmpool.Request, len(qs))
	for i, q := range qs {
		qq := rollout.Question(q)
		reqs[i] = llmpool.Request{Model: r.selector, Query: composePrompt(q.Question, subsOf[i], answersOf[i]), Question: &qq}
	}
	comp, err := ask(reqs)
	if err != nil {
		return nil, err
	}
	out := make([]rollout.QuestionResult, len(qs))
	for i, q := range qs {
		calls[i] = append(calls[i], callOf(reqs[i], comp[i]))
		a := ""
		if !comp[i].Failed {
			a = ExtractAnswer(comp[i].Text)
		}
		res := rollout.QuestionResult{ID: q.ID, Dataset: q.Dataset, Question: q.Question, Golden: q.Golden, Answer: a,
			EM: data.ExactMatch(a, q.Golden), F1: data.F1(a, q.Golden), WellFormed: !comp[i].Failed, Calls: calls[i],
			Response: comp[i].Text}
		for _, c := range calls[i] {
			res.Cost += c.Cost
		}
		out[i] = res
	}
	return out, nil
}

// callOf records a pool call.
func callOf(req llmpool.Request, resp llmpool.Response) router.Call {
	return router.Call{Model: resp.Model, Query: req.Query, Reply: resp.Text, Evidence: resp.Evidence, Failed: resp.Failed, Cached: resp.Cached,
		Cost: resp.Cost, Latency: resp.Latency}
}
