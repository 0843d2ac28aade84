package eval_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/eval"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/llmpool"
)

func TestSubQuestions(t *testing.T) {
	const q = "Who founded the city where the Louvre is?"
	cases := []struct {
		name, reply string
		want        []string
	}{
		{"numbered, with a preface line", "Here are the sub-questions:\n1. Where is the Louvre?\n2) Who founded that city?",
			[]string{"Where is the Louvre?", "Who founded that city?"}},
		{"bullets and labels", "- In which city is the Louvre?\n* Sub-question 2: Who founded Paris?",
			[]string{"In which city is the Louvre?", "Who founded Paris?"}},
		{"capped at MaxSubQuestions", "1. a?\n2. b?\n3. c?\n4. d?", []string{"a?", "b?", "c?"}},
		{"no question in the reply: the question itself", "[simulated sim-multihop] The answer is Paris.", []string{q}},
		{"empty reply", "", []string{q}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := eval.SubQuestions(c.reply, q); !slices.Equal(got, c.want) {
				t.Errorf("SubQuestions(%q) = %q, want %q", c.reply, got, c.want)
			}
		})
	}
}

// fakePool is a pool of two OpenAI-compatible models ("big", the largest,
// and "small") served by one test server that answers as an instructed LLM
// would: a decomposition prompt gets three sub-questions (plus a fourth past
// the cap), a selection prompt names "small", a composition prompt gets
// "The answer is Paris." and a sub-question gets "The answer is A:<sub-question>".
type fakePool struct {
	mu      sync.Mutex
	asked   map[string][]string // model → user messages
	compose []string
}

func newFakePool(t *testing.T) (*fakePool, llmpool.Config) {
	t.Helper()
	f := &fakePool{asked: map[string][]string{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Model    string `json:"model"`
			Messages []struct {
				Content string `json:"content"`
			} `json:"messages"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || len(body.Messages) == 0 {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		msg := body.Messages[len(body.Messages)-1].Content
		f.mu.Lock()
		f.asked[body.Model] = append(f.asked[body.Model], msg)
		var reply string
		switch {
		case strings.HasPrefix(msg, "Split the question"):
			reply = "Sub-questions:\n1. Where is it?\n2. Who built it?\n3. When?\n4. One too many?"
		case strings.HasPrefix(msg, "Which one of these models"):
			reply = "small"
		case strings.HasPrefix(msg, "Answer the question using"):
			f.compose = append(f.compose, msg)
			reply = "The answer is Paris."
		default:
			reply = "The answer is A:" + msg + "."
		}
		f.mu.Unlock()
		fmt.Fprintf(w, `{"choices":[{"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":5}}`, reply)
	}))
	t.Cleanup(srv.Close)
	pc := llmpool.Defaults()
	pc.Cache = llmpool.CacheOff // nothing written into the source tree
	for _, m := range []struct {
		name  string
		price float64
	}{{"big", 2}, {"small", 0.1}} {
		pc.Models = append(pc.Models, llmpool.ModelConfig{Name: m.name, Description: "a test model", PriceIn: m.price, PriceOut: m.price,
			Provider: "openai", OpenAI: &llmpool.OpenAIConfig{BaseURL: srv.URL, Model: m.name, MaxRetries: -1}})
	}
	pc.SetDefaults()
	if err := pc.Validate(); err != nil {
		t.Fatal(err)
	}
	return f, pc
}

// decomposeSetup is a Setup over the fake pool (no policy: these routers
// do not use one) and a knn log that routes everything to "big".
func decomposeSetup(t *testing.T, pc llmpool.Config) eval.Setup {
	t.Helper()
	cfg, err := config.Load("../recal.toml", nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Pool = pc
	env, err := rollout.NewEnv(cfg.Rollout(), nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Close() })
	log := filepath.Join(t.TempDir(), "rollouts.jsonl")
	line := `{"question":"where is the eiffel tower","rewards_raw":{"ans":1},"calls":[{"model":"big"}]}` + "\n" +
		`{"question":"where is the eiffel tower","rewards_raw":{"ans":0},"calls":[{"model":"small"}]}` + "\n"
	if err := os.WriteFile(log, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	return eval.Setup{Env: env, Batch: 4, Pool: pc, KNNLog: log, KNNK: 1}
}

// With task decomposition, the selector splits the question (capped at
// three sub-questions), each sub-question is routed by the base router and
// answered by the model it picks, and the selector composes the answer from
// the sub-answers; every call is in the result and its cost in the total.
func TestDecompositionRouters(t *testing.T) {
	qs := []data.Example{
		{ID: "q1", Dataset: "hotpotqa", Question: "Where is the tower built by Eiffel?", Golden: []string{"Paris"}},
		{ID: "q2", Dataset: "hotpotqa", Question: "What city hosts the Louvre?", Golden: []string{"Paris"}},
	}
	cases := []struct {
		router    string
		calls     int      // per question
		subModels []string // models that answered the sub-questions
	}{
		// decompose + 3 × (selection + sub-answer) + compose
		{"prompt-decomp", 1 + 3*2 + 1, []string{"small"}},
		// decompose + 3 sub-answers (knn makes no call) + compose
		{"knn-decomp", 1 + 3 + 1, []string{"big"}},
	}
	for _, c := range cases {
		t.Run(c.router, func(t *testing.T) {
			f, pc := newFakePool(t)
			s := decomposeSetup(t, pc)
			r, err := eval.NewRouter(c.router, s)
			if err != nil {
				t.Fatal(err)
			}
			res, err := r.Answer(context.Background(), qs)
			if err != nil {
				t.Fatal(err)
			}
			for i, q := range res {
				if q.ID != qs[i].ID || q.Answer != "Paris" || q.EM != 1 || !q.WellFormed {
					t.Errorf("result %d: id %s, answer %q, EM %v, well-formed %v; want %s answered Paris by the composition", i, q.ID, q.Answer, q.EM, q.WellFormed, qs[i].ID)
				}
				if len(q.Calls) != c.calls {
					t.Errorf("%s made %d calls, want %d: every call counts", q.ID, len(q.Calls), c.calls)
				}
				var cost float64
				for _, call := range q.Calls {
					cost += call.Cost
				}
				if cost <= 0 || q.Cost != cost {
					t.Errorf("%s cost %g, want the calls' sum %g (> 0)", q.ID, q.Cost, cost)
				}
				first, last := q.Calls[0], q.Calls[len(q.Calls)-1]
				if first.Model != "big" || !strings.HasPrefix(first.Query, "Split the question") || last.Model != "big" || !strings.HasPrefix(last.Query, "Answer the question using") {
					t.Errorf("%s: first call %s %q, last %s %q; want the selector (big, the largest) to split and to compose", q.ID, first.Model, first.Query, last.Model, last.Query)
				}
				var answered []string
				for _, call := range q.Calls {
					if strings.HasPrefix(call.Reply, "The answer is A:") {
						answered = append(answered, call.Model)
					}
				}
				slices.Sort(answered)
				if got := slices.Compact(answered); len(answered) != 3 || !slices.Equal(got, c.subModels) {
					t.Errorf("%s: sub-questions answered by %v, want 3 answered by %v", q.ID, answered, c.subModels)
				}
			}
			if len(f.compose) != len(qs) {
				t.Fatalf("%d composition prompts, want %d", len(f.compose), len(qs))
			}
			for _, sub := range []string{"Where is it?", "Who built it?", "When?", "Answer 3: A:When?"} {
				if !strings.Contains(f.compose[0], sub) {
					t.Errorf("the composition prompt lacks %q:\n%s", sub, f.compose[0])
				}
			}
			if strings.Contains(f.compose[0], "One too many") {
				t.Error("a fourth sub-question was asked, past MaxSubQuestions")
			}
		})
	}
}

// On the simulated pool the decomposition reply holds no sub-question, so
// each question is its own one sub-question, and the answer is the
// selector's reply to the composition prompt (see decompose.go): four calls
// with prompt, three with knn.
func TestDecompositionOnSimulatedPool(t *testing.T) {
	f := newFixture(t)
	r, err := eval.NewRouter("prompt-decomp", f.setup)
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Answer(context.Background(), f.qs[:4])
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range res {
		if len(q.Calls) != 4 {
			t.Fatalf("%s: %d calls, want 4 (decompose, select, answer, compose)", q.ID, len(q.Calls))
		}
		if sub := q.Calls[2].Query; sub != q.Question {
			t.Errorf("%s: the sub-question asked is %q, want the question itself (the simulated reply names none)", q.ID, sub)
		}
		last := q.Calls[3]
		if last.Model != "sim-multihop" || q.Answer != eval.ExtractAnswer(last.Reply) {
			t.Errorf("%s: answer %q from %s's reply %q; want the selector's (sim-multihop) composition answer", q.ID, q.Answer, last.Model, last.Reply)
		}
	}
}
