package trainer

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/internal/tokenizer"
	"github.com/recal-project/recal/llmpool"
	"github.com/recal-project/recal/router"
)

func subsetModels(names ...string) []llmpool.ModelInfo {
	out := make([]llmpool.ModelInfo, len(names))
	for i, n := range names {
		out[i] = llmpool.ModelInfo{Name: n, Description: "model " + n}
	}
	return out
}

func modelNames(ms []llmpool.ModelInfo) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Name
	}
	return out
}

// ModelSubset is a pure function of (seed, step, question id): the same
// arguments give the same list, never an empty one and never a model twice;
// over many questions every model, every size and every order occurs, and
// the share of restricted questions is train.model_subsets.
func TestModelSubset(t *testing.T) {
	pool := subsetModels("a", "b", "c")
	cases := []struct {
		name  string
		share float64
		pool  []llmpool.ModelInfo
	}{
		{"every question", 1, pool},
		{"half the questions", 0.5, pool},
		{"one model", 1, subsetModels("only")},
		{"five models", 0.8, subsetModels("a", "b", "c", "d", "e")},
	}
	const draws = 4000
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			restricted := 0
			sizes := map[int]int{}
			alone := map[string]int{} // single-model lists by model
			orders := map[string]bool{}
			for i := range draws {
				step := 1 + i%7
				id := fmt.Sprintf("nq/q%d", i/7)
				seed := stepSeed(3, step)
				got, r := rollout.ModelSubset(c.pool, c.share, seed, id)
				again, r2 := rollout.ModelSubset(c.pool, c.share, seed, id)
				if r != r2 || !slices.Equal(modelNames(got), modelNames(again)) {
					t.Fatalf("step %d %s: %v then %v: the draw must be a pure function of (seed, step, id)", step, id, modelNames(got), modelNames(again))
				}
				if len(got) == 0 {
					t.Fatalf("step %d %s: an empty list", step, id)
				}
				seen := map[string]bool{}
				for _, m := range got {
					if seen[m.Name] || !slices.ContainsFunc(c.pool, func(p llmpool.ModelInfo) bool { return p == m }) {
						t.Fatalf("step %d %s: %v repeats a model or lists one outside the pool", step, id, modelNames(got))
					}
					seen[m.Name] = true
				}
				if !r {
					if !slices.Equal(modelNames(got), modelNames(c.pool)) {
						t.Fatalf("unrestricted list %v, want the pool in its order", modelNames(got))
					}
					continue
				}
				restricted++
				sizes[len(got)]++
				if len(got) == 1 {
					alone[got[0].Name]++
				}
				if len(got) == len(c.pool) {
					orders[strings.Join(modelNames(got), ",")] = true
				}
			}
			if share := float64(restricted) / draws; share < c.share-0.03 || share > c.share+0.03 {
				t.Errorf("%.3f of the questions restricted, want %g", share, c.share)
			}
			for k := 1; k <= len(c.pool); k++ {
				if sizes[k] == 0 {
					t.Errorf("no list of %d models in %d draws: every size should occur", k, draws)
				}
			}
			for _, m := range c.pool {
				if alone[m.Name] == 0 {
					t.Errorf("%s never listed alone: a request restricted to it would be new to the policy", m.Name)
				}
			}
			if n := len(c.pool); n == 3 && len(orders) != 6 {
				t.Errorf("%d orders of the whole pool, want all 6: %v", len(orders), orders)
			}
		})
	}
	t.Run("off", func(t *testing.T) {
		for i := range 100 {
			if got, r := rollout.ModelSubset(pool, 0, uint64(i), "x"); r || !slices.Equal(modelNames(got), modelNames(pool)) {
				t.Fatalf("share 0: %v restricted %v, want the whole pool", modelNames(got), r)
			}
		}
	})
	t.Run("seed, step and id all matter", func(t *testing.T) {
		base := func(seed int64, step int, id string) string {
			var b strings.Builder
			for k := range 40 { // 40 questions: a change of any input changes some list
				got, _ := rollout.ModelSubset(pool, 1, stepSeed(seed, step), fmt.Sprintf("%s%d", id, k))
				fmt.Fprint(&b, modelNames(got), ";")
			}
			return b.String()
		}
		ref := base(0, 1, "nq/")
		for _, other := range []string{base(1, 1, "nq/"), base(0, 2, "nq/"), base(0, 1, "hotpotqa/")} {
			if other == ref {
				t.Errorf("the same lists for another seed, step or id set")
			}
		}
	})
}

// The prompt of a restricted question lists exactly its models, in the
// drawn order, and the format reward accepts exactly their names; an
// unrestricted question gets the environment's own prompt.
func TestRowPrompt(t *testing.T) {
	env, pool, tok := subsetEnv(t)
	sub := rolloutEnv(env, config.Train{ModelSubsets: 1, NoRepeatNGram: env.Router.NoRepeatNGram})
	if sub == env || env.ModelSubsets != 0 {
		t.Fatal("the rollouts' environment must be a copy: validation keeps the full pool")
	}
	all := modelNames(pool.Models())
	for i := range 12 {
		q := data.Example{ID: fmt.Sprintf("nq/%d", i), Question: "who wrote the song"}
		seed := stepSeed(0, i+1)
		list, _ := rollout.ModelSubset(pool.Models(), 1, seed, q.ID)
		want := modelNames(list)
		p, models, known, err := sub.RowPrompt(q, seed)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(models, want) {
			t.Errorf("%s: responses may call %v, want %v", q.ID, models, want)
		}
		text := tok.Decode(toInts(p))
		last := -1
		for _, name := range all {
			at := strings.Index(text, name)
			listed := slices.Contains(want, name)
			if listed != (at >= 0) {
				t.Errorf("%s: %s in the prompt %v, want %v (listed: %v)\n%s", q.ID, name, at >= 0, listed, want, text)
			}
			if listed != known(name) || listed != known(strings.ToUpper(name)) {
				t.Errorf("%s: the format reward knows %s: %v, want %v", q.ID, name, known(name), listed)
			}
		}
		for _, name := range want { // in the drawn order
			at := strings.Index(text, name)
			if at < last {
				t.Errorf("%s: %v listed out of order\n%s", q.ID, want, text)
			}
			last = at
		}
		again, _, _, _ := sub.RowPrompt(q, seed)
		if !slices.Equal(p, again) {
			t.Errorf("%s: another prompt the second time (the loss must see the rollout's prompt)", q.ID)
		}
		full, models, _, err := env.RowPrompt(q, seed)
		if err != nil {
			t.Fatal(err)
		}
		if wantFull, _ := env.PromptTokens(q); models != nil || !slices.Equal(full, wantFull) {
			t.Errorf("%s: without train.model_subsets: models %v and another prompt than PromptTokens'", q.ID, models)
		}
	}
}

func toInts(v []int32) []int {
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = int(x)
	}
	return out
}

// Under train.model_subsets the warm-up's demonstrations list a subset as
// GRPO's prompts do and call a model of that list: a demonstration that
// named an unlisted model would teach the policy to ignore the list. Without
// the key every demonstration lists the full pool.
func TestDemosCallListedModels(t *testing.T) {
	env, pool, tok := subsetEnv(t)
	sub := env.WithPrompt(env.Prompt, env.Router)
	sub.ModelSubsets = 1
	var qs []data.Example
	for i := range 24 {
		qs = append(qs, data.Example{ID: fmt.Sprintf("nq/%d", i), Dataset: "nq", Question: fmt.Sprintf("who wrote song number %d", i), Golden: []string{"x"}})
	}
	const seed = 11
	for _, c := range []struct {
		name       string
		env        *rollout.Env
		restricted bool
	}{{"full pool", env, false}, {"subsets", sub, true}} {
		t.Run(c.name, func(t *testing.T) {
			demos, err := BuildDemos(context.Background(), c.env, qs, seed, 1)
			if err != nil {
				t.Fatal(err)
			}
			alone := 0
			for i, d := range demos {
				want, listed, _, err := c.env.RowPrompt(qs[i], seed)
				if err != nil {
					t.Fatal(err)
				}
				if (listed != nil) != c.restricted && len(listed) != len(pool.Models()) {
					t.Errorf("%s: listed %v", qs[i].ID, listed)
				}
				if listed == nil {
					listed = modelNames(pool.Models())
				}
				if len(listed) == 1 {
					alone++
				}
				if !slices.Equal(d.Tokens[:len(want)], want) {
					t.Fatalf("%s: the demonstration's prompt is not the prompt listing %v", qs[i].ID, listed)
				}
				text := tok.Decode(toInts(d.Tokens[len(want):]))
				_, rest, ok := strings.Cut(text, router.SearchOpen)
				name, _, ok2 := strings.Cut(rest, ":")
				if !ok || !ok2 || !slices.Contains(listed, name) {
					t.Errorf("%s: the demonstration calls %q, not a model of its prompt's list %v (%q)", qs[i].ID, name, listed, text)
				}
			}
			if c.restricted && alone == 0 {
				t.Errorf("no demonstration listed a single model in %d questions: the draw is not what RowPrompt draws", len(qs))
			}
		})
	}
}

// subsetEnv is the offline default's pool and protocol with the real
// tokenizer and no policy: enough to render prompts and demonstrations.
func subsetEnv(t *testing.T) (*rollout.Env, *llmpool.Pool, *tokenizer.Tokenizer) {
	t.Helper()
	cfg, err := config.Load("../recal.toml", []string{"pool.cache=off"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := llmpool.New(cfg.Pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	tok, err := tokenizer.Load("../tokenizer/qwen2.5")
	if err != nil {
		t.Fatal(err)
	}
	prompt, err := router.NewPrompt(cfg.Router.PromptTemplate, pool.Models(), cfg.Router.MaxTurns)
	if err != nil {
		t.Fatal(err)
	}
	env := (&rollout.Env{Engine: &rollout.Engine{Tok: tok, CtxLen: 8192}, Pool: pool}).WithPrompt(prompt, cfg.Router)
	return env, pool, tok
}
