package rollout

import (
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/llmpool"
	"github.com/recal-project/recal/router"
)

// ModelSubset is the list of pool models that the training prompt of
// question id shows at the rollout seeded rolloutSeed (stepSeed(train.seed,
// step)) under train.model_subsets = share, and whether it is restricted.
//
// A question is restricted with probability share; a restricted one lists a
// subset of size k drawn uniformly from 1..len(models), its members drawn
// uniformly without replacement, in the order drawn (so every order of every
// subset can occur, the full pool in a random order included). An
// unrestricted one lists models as given (the pool's order). The draw is a
// pure function of (rolloutSeed, id, share, len(models)): a SplitMix64
// stream seeded from them, which no Go release or batch layout can change,
// so every rank, rollout worker and resumed run draws the same.
func ModelSubset(models []llmpool.ModelInfo, share float64, rolloutSeed uint64, id string) (list []llmpool.ModelInfo, restricted bool) {
	if share <= 0 || len(models) == 0 {
		return models, false
	}
	h := fnv.New64a()
	h.Write([]byte(id))
	r := splitMix{state: rolloutSeed ^ h.Sum64() ^ 0x5ca1ab1e0ddba11}
	// 53 random bits as a float in [0, 1).
	if u := float64(r.next()>>11) / (1 << 53); u >= share {
		return models, false
	}
	n := len(models)
	k := 1 + int(r.next()%uint64(n))
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	list = make([]llmpool.ModelInfo, k)
	for i := range k { // a partial Fisher–Yates shuffle: the first k of a random order
		j := i + int(r.next()%uint64(n-i))
		idx[i], idx[j] = idx[j], idx[i]
		list[i] = models[idx[i]]
	}
	return list, true
}

// splitMix is SplitMix64 (Steele, Lea and Flood 2014), fixed here so that
// the subsets of a run never depend on the Go release.
type splitMix struct{ state uint64 }

func (s *splitMix) next() uint64 {
	s.state += 0x9E3779B97F4A7C15
	z := s.state
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// RowPrompt is what one question's training responses see: the prompt
// tokens, the models they may call (nil: every pool model) and the names
// they may write for the format reward. With e.ModelSubsets = 0 it is
// PromptTokens and Known.
func (e *Env) RowPrompt(q data.Example, rolloutSeed uint64) (prompt []int32, models []string, known func(string) bool, err error) {
	list, restricted := ModelSubset(e.Pool.Models(), e.ModelSubsets, rolloutSeed, q.ID)
	if !restricted {
		p, err := e.PromptTokens(q)
		return p, nil, e.Known, err
	}
	names := make([]string, len(list))
	for i, m := range list {
		names[i] = m.Name
	}
	allowed := map[string]bool{}
	for _, n := range names {
		allowed[n] = true
	}
	known = func(name string) bool {
		info, ok := e.Pool.Lookup(name)
		return ok && allowed[info.Name]
	}
	key := strings.Join(names, "\x00")
	e.mu.Lock()
	defer e.mu.Unlock()
	if p, ok := e.prompts[q.ID+"\x01"+key]; ok {
		return p, names, known, nil
	}
	if e.subsetPrompts == nil {
		e.subsetPrompts = map[string]*router.Prompt{}
	}
	pr, ok := e.subsetPrompts[key]
	if !ok {
		if pr, err = router.NewPrompt(e.Router.PromptTemplate, list, e.Router.MaxTurns); err != nil {
			return nil, nil, nil, err
		}
		e.subsetPrompts[key] = pr
	}
	ids, err := pr.Tokens(e.Engine.Tok, q.Question) // the question as plain text
	if err != nil {
		return nil, nil, nil, err
	}
	p := ToInt32(ids)
	if len(p)+e.Router.Capacity() > e.Engine.CtxLen {
		return nil, nil, nil, fmt.Errorf("rollout: question %s: prompt of %d tokens plus %d response tokens exceed the policy's context of %d", q.ID, len(p), e.Router.Capacity(), e.Engine.CtxLen)
	}
	e.prompts[q.ID+"\x01"+key] = p
	return p, names, known, nil
}
