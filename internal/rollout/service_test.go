package rollout_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/generate"
	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/internal/testing/testenv"
	"github.com/recal-project/recal/internal/tokenizer"
	"github.com/recal-project/recal/llmpool"
	"github.com/recal-project/recal/router"
	"github.com/recal-project/recal/torchbridge"
)

// randomPolicy writes a random checkpoint whose layers weigh as much as the
// embeddings (std 0.5), so its next token depends on the whole context: a
// row that still held an earlier response would change what it writes.
func randomPolicy(t *testing.T) string {
	t.Helper()
	return writePolicy(t, 0.5, nil)
}

// writePolicy writes a 1-layer checkpoint with hidden size policyHidden and
// the Qwen2.5 vocabulary, drawn with std and then changed by edit.
func writePolicy(t *testing.T, std float64, edit func(get func(string) []float32, set func(string, []float32))) string {
	t.Helper()
	cfg := &hfmodel.Config{Architectures: []string{"Qwen2ForCausalLM"}, ModelType: "qwen2", VocabSize: 151936,
		HiddenSize: policyHidden, IntermediateSize: 64, NumHiddenLayers: 1, NumAttentionHeads: 2, NumKeyValueHeads: 1,
		MaxPositionEmbeddings: 2048, RopeTheta: 1e6, RMSNormEps: 1e-6, EOSTokenIDs: []int64{151645, 151643}}
	p, err := torchbridge.NewPolicy(cfg, torchbridge.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.InitRandom(3, std); err != nil {
		t.Fatal(err)
	}
	get := func(name string) []float32 {
		for _, prm := range p.Params() {
			if prm.Name == name {
				buf := make([]byte, 4*prm.Numel())
				if err := p.GetParam(name, "F32", buf); err != nil {
					t.Fatal(err)
				}
				out := make([]float32, prm.Numel())
				for i := range out {
					out[i] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:]))
				}
				return out
			}
		}
		t.Fatalf("no parameter %s", name)
		return nil
	}
	set := func(name string, v []float32) {
		buf := make([]byte, 4*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(x))
		}
		if err := p.SetParam(name, "F32", buf); err != nil {
			t.Fatal(err)
		}
	}
	if edit != nil {
		edit(get, set)
	}
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "tokenizer", "qwen2.5", f))
		if err != nil {
			t.Fatal(err)
		}
		p.Aux[f] = b
	}
	dir := filepath.Join(t.TempDir(), "policy")
	if err := p.Save(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

const policyHidden = 32

// searcher writes a checkpoint whose greedy policy always searches model:
// after the prompt and after every <information> block it writes
// "<search>MODEL: q</search>". Its layers add nothing (o_proj and
// down_proj are zero), so the next token is a function of the current
// token's embedding alone, and lm_head maps each token of that text to the
// next. It is a real policy decoding through the real KV cache, with the
// protocol written into its weights.
func searcher(t *testing.T, model string) string {
	t.Helper()
	return searcherScaled(t, model, 40)
}

// searcherScaled is searcher whose chain's logits are scale above the
// rest: a smaller scale leaves the log-probs unsaturated, so they show
// what the rest of the context contributes.
func searcherScaled(t *testing.T, model string, scale float64) string {
	t.Helper()
	tok, err := tokenizer.Load("../../tokenizer/qwen2.5")
	if err != nil {
		t.Fatal(err)
	}
	return writePolicy(t, 0.5, func(get func(string) []float32, set func(string, []float32)) {
		for _, n := range []string{"model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.down_proj.weight"} {
			set(n, make([]float32, len(get(n))))
		}
		emb := get("model.embed_tokens.weight")
		head := make([]float32, len(emb))
		succ := map[int32]int32{}
		link := func(a, b int32) {
			if old, ok := succ[a]; ok && old != b {
				t.Fatalf("token %d is followed by both %d and %d: the chain is ambiguous", a, old, b)
			}
			if _, ok := succ[a]; ok {
				return
			}
			succ[a] = b
			e := emb[int(a)*policyHidden : int(a+1)*policyHidden]
			var ss float64
			for _, x := range e {
				ss += float64(x) * float64(x)
			}
			rms := math.Sqrt(ss / policyHidden)
			for i, x := range e { // the logit of b after a is scale
				head[int(b)*policyHidden+i] += float32(scale / policyHidden * float64(x) / rms)
			}
		}
		chain := rollout.ToInt32(tok.Encode(router.SearchOpen + model + ": q" + router.SearchClose))
		promptEnd := rollout.ToInt32(tok.Encode("<|im_start|>assistant\n"))
		blockEnd, _ := router.InfoBlock(tok, "reply", 8)
		link(promptEnd[len(promptEnd)-1], chain[0])
		link(blockEnd[len(blockEnd)-1], chain[0])
		for i := 1; i < len(chain); i++ {
			link(chain[i-1], chain[i])
		}
		set("lm_head.weight", head)
	})
}

// serviceEnv opens a checkpoint in the trainer tests' configuration, with
// extra pool models.
func serviceEnv(t *testing.T, ck string, extra []llmpool.ModelConfig, sets ...string) (*rollout.Env, config.Config) {
	t.Helper()
	cfg := testConfig(t, ck, append([]string{"router.turn_tokens=24"}, sets...)...)
	cfg.Pool.Models = append(cfg.Pool.Models, extra...)
	return testenv.Open(t, ck, cfg), cfg
}

// startService runs a service until the test ends.
func startService(t *testing.T, env *rollout.Env, maxBatch, maxSamplings int) *rollout.Service {
	t.Helper()
	s, err := env.NewService(maxBatch, maxSamplings, 1)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return s
}

func serviceQuestions() []data.Example {
	var qs []data.Example
	for i, q := range []string{"Who wrote Hamlet?", "What is the capital of France?", "When did the Berlin Wall fall?",
		"Which river flows through Cairo?", "Who painted the Mona Lisa?", "How many moons does Mars have?"} {
		qs = append(qs, data.Example{ID: fmt.Sprintf("svc/%d", i), Dataset: "nq", Question: q, Golden: []string{"x"}})
	}
	return qs
}

// Greedy answers through the service, asked concurrently (three queries per
// row, so rows are reused), are exactly rollout.Answer's, which eval and
// validation use; no more than maxBatch rows ever decode.
func TestServiceMatchesAnswer(t *testing.T) {
	for _, c := range []struct {
		name   string
		ck     func(t *testing.T) string
		search bool
	}{
		{"random policy", randomPolicy, false},
		{"searching policy", func(t *testing.T) string { return searcher(t, "sim-small") }, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			env, _ := serviceEnv(t, c.ck(t), nil)
			qs := serviceQuestions()
			want, err := rollout.Answer(context.Background(), env, qs, 4)
			if err != nil {
				t.Fatal(err)
			}
			const maxBatch = 2
			s := startService(t, env, maxBatch, maxBatch)
			got := make([]rollout.ServiceAnswer, len(qs))
			peak := watchLoad(s, time.Millisecond)
			var wg sync.WaitGroup
			for i, q := range qs {
				wg.Go(func() {
					pq := rollout.Question(q)
					a, err := s.Answer(context.Background(), rollout.ServiceQuery{Question: q.Question, Pool: &pq})
					if err != nil {
						t.Errorf("question %d: %v", i, err)
					}
					got[i] = a
				})
			}
			wg.Wait()
			most := peak()
			if most[0] > maxBatch {
				t.Errorf("%d rows decoded at once; want at most max batch, %d", most[0], maxBatch)
			}
			for i := range qs {
				g, w := got[i], want[i]
				if g.Sample.Text != w.Response || g.Answer != w.Answer || !sameCalls(g.Sample.Calls, w.Calls) {
					t.Errorf("question %d through the service: answer %q, %d calls, response %q\nwant rollout.Answer's: %q, %d calls, %q",
						i, g.Answer, len(g.Sample.Calls), g.Sample.Text, w.Answer, len(w.Calls), w.Response)
				}
				if g.PolicyCompletionTokens == 0 || g.PolicyPromptTokens == 0 {
					t.Errorf("question %d: %d prompt and %d completion tokens; want both counted", i, g.PolicyPromptTokens, g.PolicyCompletionTokens)
				}
			}
			if calls := len(got[0].Sample.CalledModels()); c.search && (calls != 2 || got[0].PoolPromptTokens == 0 || got[0].CostUSD == 0) {
				t.Errorf("the searching policy made %d calls (%d pool prompt tokens, $%v); want max_turns = 2 counted calls", calls, got[0].PoolPromptTokens, got[0].CostUSD)
			}
			if a, w := s.Stats(); a != 0 || w != 0 {
				t.Errorf("after every query: %d active, %d waiting; want 0, 0", a, w)
			}
		})
	}
}

func sameCalls(a, b []router.Call) bool {
	return slices.EqualFunc(a, b, func(x, y router.Call) bool { x.Latency, y.Latency = 0, 0; return x == y })
}

// A query limited to a subset of the pool sees only those models in its
// prompt, and a search for another model makes no call; a query with a cost
// budget makes no call after the budget is spent.
func TestServiceLimits(t *testing.T) {
	env, cfg := serviceEnv(t, searcher(t, "sim-small"), nil)
	s := startService(t, env, 2, 2)
	q := "Who wrote Hamlet?"
	tok := env.Engine.Tok
	cases := []struct {
		name   string
		query  rollout.ServiceQuery
		models []llmpool.ModelInfo // listed in the prompt
		calls  int                 // pool calls made
		check  func(t *testing.T, a rollout.ServiceAnswer)
	}{
		{name: "subset without the model searched", query: rollout.ServiceQuery{Question: q, Models: []string{"sim-factoid", "SIM-MULTIHOP"}},
			models: env.Pool.Models()[:2], calls: 0,
			check: func(t *testing.T, a rollout.ServiceAnswer) {
				for _, c := range a.Sample.Calls {
					if !c.Unknown || c.Cost != 0 {
						t.Errorf("call %+v: a search for sim-small outside the subset must be treated as an unknown model", c)
					}
				}
				if len(a.Sample.Calls) != cfg.Router.MaxTurns || a.Sample.End != "final" {
					t.Errorf("%d call records, end %q; want %d unknown-model turns, then the final turn", len(a.Sample.Calls), a.Sample.End, cfg.Router.MaxTurns)
				}
			}},
		{name: "subset with the model searched", query: rollout.ServiceQuery{Question: q, Models: []string{"sim-small"}},
			models: env.Pool.Models()[2:], calls: 2},
		{name: "one turn", query: rollout.ServiceQuery{Question: q, MaxTurns: 1}, models: env.Pool.Models(), calls: 1},
		{name: "cost budget", query: rollout.ServiceQuery{Question: q, MaxCostUSD: 1e-9}, models: env.Pool.Models(), calls: 1,
			check: func(t *testing.T, a rollout.ServiceAnswer) {
				_, shown := router.InfoBlock(tok, router.BudgetText, cfg.Router.InfoTokens)
				if len(a.Sample.Calls) != 2 || !a.Sample.Calls[1].Refused || a.Sample.Calls[1].Reply != shown {
					t.Fatalf("calls %+v: want the second search refused with the budget observation %q", a.Sample.Calls, shown)
				}
				if c := a.Sample.Calls[0]; a.CostUSD != c.Cost || a.PoolPromptTokens != c.PromptTokens || a.PoolCompletionTokens != c.CompletionTokens {
					t.Errorf("answer cost $%v and tokens %d/%d; want the first call's, $%v and %d/%d", a.CostUSD, a.PoolPromptTokens, a.PoolCompletionTokens, c.Cost, c.PromptTokens, c.CompletionTokens)
				}
			}},
		{name: "max tokens", query: rollout.ServiceQuery{Question: q, MaxTokens: 3}, models: env.Pool.Models(), calls: 0,
			check: func(t *testing.T, a rollout.ServiceAnswer) {
				if a.PolicyCompletionTokens != 3 || a.Sample.End != "length" {
					t.Errorf("%d tokens written, end %q; want 3 and \"length\"", a.PolicyCompletionTokens, a.Sample.End)
				}
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := env.Pool.Usage()
			a, err := s.Answer(context.Background(), c.query)
			if err != nil {
				t.Fatal(err)
			}
			var made int64
			for _, u := range env.Pool.Usage().Sub(before) {
				made += u.Calls
			}
			if made != int64(c.calls) || len(a.Sample.CalledModels()) != c.calls {
				t.Errorf("%d pool calls (%d in the sample); want %d\nresponse %q", made, len(a.Sample.CalledModels()), c.calls, a.Sample.Text)
			}
			turns := cfg.Router.MaxTurns
			if c.query.MaxTurns > 0 {
				turns = c.query.MaxTurns
			}
			p, err := router.NewPrompt(cfg.Router.PromptTemplate, c.models, turns)
			if err != nil {
				t.Fatal(err)
			}
			ids, _ := p.Tokens(tok, q)
			if a.PolicyPromptTokens != len(ids) {
				t.Errorf("the prompt has %d tokens; want %d, the prompt listing %d models and %d turns", a.PolicyPromptTokens, len(ids), len(c.models), turns)
			}
			if c.check != nil {
				c.check(t, a)
			}
		})
	}
	for _, bad := range []rollout.ServiceQuery{
		{Question: q, Models: []string{"gpt-9"}},
		{Question: q, MaxTurns: cfg.Router.MaxTurns + 1},
		{Question: q, MaxCostUSD: math.NaN()},
		{Question: strings.Repeat("Hamlet ", rollout.ServiceQuestionTokens+2048)},
	} {
		if _, err := s.Answer(context.Background(), bad); !errors.Is(err, rollout.ErrInvalidQuery) {
			t.Errorf("query %.60q (models %v, max turns %d, cost %v): %v; want ErrInvalidQuery", bad.Question, bad.Models, bad.MaxTurns, bad.MaxCostUSD, err)
		}
	}
}

// With max samplings 1, queries of distinct sampling settings never decode
// together (each setting is a decode call of its own per step), though rows
// are free: they wait their turn, and every one is answered.
func TestServiceMaxSamplings(t *testing.T) {
	env, _ := serviceEnv(t, randomPolicy(t), nil)
	if _, err := env.NewService(4, 0, 1); err == nil || !strings.Contains(err.Error(), "samplings") {
		t.Errorf("NewService with max samplings 0: %v; want an error naming it", err)
	}
	s := startService(t, env, 4, 1)
	peak := watchLoad(s, 200*time.Microsecond)
	var wg sync.WaitGroup
	for i, temp := range []float64{0.3, 0.6, 0.9, 1.2} {
		wg.Go(func() {
			a, err := s.Answer(context.Background(), rollout.ServiceQuery{Question: "Who wrote Hamlet?",
				Sampling: generate.Sampling{Temperature: temp}, MaxTokens: 24})
			if err != nil || a.PolicyCompletionTokens == 0 {
				t.Errorf("query %d (temperature %v): %d tokens, %v; want an answer", i, temp, a.PolicyCompletionTokens, err)
			}
		})
	}
	wg.Wait()
	if most := peak(); most[0] != 1 {
		t.Errorf("at most %d rows decoded at once with 4 distinct temperatures and max samplings 1; want 1 (and the others waiting: at most %d did)", most[0], most[1])
	}
}

// Cancelling a query whose pool call is in flight cancels the call and
// frees the row for the query waiting for it.
func TestServiceCancel(t *testing.T) {
	slow := llmpool.ModelConfig{Name: "sim-slow", Description: "simulated; slow", Provider: "sim",
		Sim: &llmpool.SimConfig{DefaultAccuracy: 1, Latency: time.Minute}}
	env, _ := serviceEnv(t, searcher(t, "sim-slow"), []llmpool.ModelConfig{slow}, "pool.max_concurrency=1")
	s := startService(t, env, 1, 1)
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() {
		_, err := s.Answer(ctx, rollout.ServiceQuery{Question: "Who wrote Hamlet?"})
		first <- err
	}()
	// The pool has one slot on the wire, which the slow call holds while it
	// is out: a probe that cannot get it within 20 ms shows the call started.
	deadline := time.Now().Add(time.Minute)
	for {
		pctx, pcancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		r := env.Pool.Call(pctx, llmpool.Request{Model: "sim-small", Query: "probe"})
		pcancel()
		if r.Failed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first query never called sim-slow")
		}
		time.Sleep(10 * time.Millisecond)
	}
	second := make(chan rollout.ServiceAnswer, 1)
	go func() {
		a, err := s.Answer(context.Background(), rollout.ServiceQuery{Question: "What is the capital of France?", Models: []string{"sim-small"}})
		if err != nil {
			t.Errorf("the second query: %v", err)
		}
		second <- a
	}()
	for a, w := s.Stats(); w != 1; a, w = s.Stats() {
		if a != 1 {
			t.Fatalf("%d rows active; want the first query's", a)
		}
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	cancel()
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Errorf("the cancelled query returned %v; want context.Canceled", err)
	}
	a := <-second
	if a.Sample.End != "final" || len(a.Sample.Calls) == 0 {
		t.Errorf("the second query ended %q with %d calls; want it to run to its final turn", a.Sample.End, len(a.Sample.Calls))
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("cancelling took %v: the minute-long call was awaited, not cancelled", took)
	}
	u := env.Pool.Usage()["sim-slow"]
	if u.Calls != 1 || u.Failures != 1 || u.Latency > 30*time.Second {
		t.Errorf("sim-slow usage %+v: want one call, failed by the cancellation well before its minute", u)
	}
	if a, w := s.Stats(); a != 0 || w != 0 {
		t.Errorf("after both queries: %d active, %d waiting; want 0, 0", a, w)
	}
}

// watchLoad samples s.Stats every tick while queries run; the function it
// returns stops the watch and gives the most rows seen decoding and waiting.
func watchLoad(s *rollout.Service, tick time.Duration) func() [2]int {
	stop := make(chan struct{})
	peak := make(chan [2]int, 1)
	go func() {
		var most [2]int
		defer func() { peak <- most }()
		for {
			a, w := s.Stats()
			most = [2]int{max(most[0], a), max(most[1], w)}
			select {
			case <-stop:
				return
			case <-time.After(tick):
			}
		}
	}()
	return func() [2]int {
		close(stop)
		return <-peak
	}
}
