package llmpool

import (
	"context"
	"testing"
)

// DearestCall is the most, over the pool's models, of what asking the
// model the question costs: for replayed models exactly the cost a call is
// charged (the router's cost reward is measured against it), for the other
// providers the documented price of their reply.
func TestDearestCall(t *testing.T) {
	log := writeLog(t, replayLog)
	t.Run("replay: the dearest call's own cost", func(t *testing.T) {
		p := newTestPool(t, testConfig(replayModel("big", log, ReplayConfig{}), replayModel("small", log, ReplayConfig{})))
		for _, id := range []string{"nq/1", "nq/2"} {
			var want float64
			for _, m := range []string{"big", "small"} {
				r := p.Call(context.Background(), Request{Model: m, Query: "any sub-query", Question: q(id, "nq")})
				if r.Failed {
					t.Fatalf("%s on %s failed: %v", m, id, r.Err)
				}
				want = max(want, r.Cost)
			}
			if got := p.DearestCall(q(id, "nq")); got != want || want == 0 {
				t.Errorf("DearestCall(%s) = %v, want %v: the cost of the dearest call the pool makes about it", id, got, want)
			}
		}
	})
	sim := func(name string, price float64, s SimConfig) ModelConfig {
		m := simModel(name, s)
		m.PriceIn, m.PriceOut = price, 2*price
		return m
	}
	question := &Question{ID: "nq/9", Text: "who wrote hamlet", Golden: []string{"Shakespeare"}}
	cases := []struct {
		name string
		cfg  Config
		want float64
	}{
		{"sim with token counts: the dearest model's price", testConfig(
			sim("a", 1, SimConfig{TokensIn: 100, TokensOut: 10}), sim("b", 3, SimConfig{TokensIn: 10, TokensOut: 10})),
			(100*1 + 10*2) / 1e6},
		{"sim estimated: the question in, the golden answer's reply out", testConfig(sim("a", 1, SimConfig{})),
			(float64(estimateTokens(question.Text)+chatOverheadTokens)*1 + float64(estimateTokens("[simulated a] The answer is Shakespeare."))*2) / 1e6},
		{"openai: the question in, max_tokens out", testConfig(openaiModel("o", "http://127.0.0.1:1/v1", func(o *OpenAIConfig) { o.MaxTokens = 64 })),
			(float64(estimateTokens(question.Text)+chatOverheadTokens)*1 + 64*2) / 1e6},
		{"every price 0: 0", testConfig(sim("a", 0, SimConfig{TokensIn: 100, TokensOut: 10})), 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newTestPool(t, c.cfg)
			if got := p.DearestCall(question); got != c.want {
				t.Errorf("DearestCall = %v, want %v", got, c.want)
			}
		})
	}
}
