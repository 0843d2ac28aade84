package llmpool_test

import (
	"context"
	"fmt"

	"github.com/recal-project/recal/llmpool"
)

// A pool with one simulated model: a relevant sub-query gets the golden
// answer (accuracy 1), an unknown model name gets the failure text.
func ExamplePool_Call() {
	pool, err := llmpool.New(llmpool.Config{
		Cache: llmpool.CacheOff,
		Models: []llmpool.ModelConfig{{
			Name:        "sim-qwen",
			Description: "A simulated 7B model.",
			PriceIn:     0.3, // USD per million tokens
			PriceOut:    0.3,
			Provider:    "sim",
			Sim:         &llmpool.SimConfig{Accuracy: map[string]float64{"nq": 1}, TokensIn: 100, TokensOut: 10},
		}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	ctx := context.Background()
	q := &llmpool.Question{ID: "nq-1", Dataset: "nq", Text: "What is the capital of France?", Golden: []string{"Paris"}}

	r := pool.Call(ctx, llmpool.Request{Model: "SIM-QWEN", Query: "capital of France", Question: q})
	fmt.Printf("%s (%d+%d tokens, $%.6f)\n", r.Text, r.InputTokens, r.OutputTokens, r.Cost)

	r = pool.Call(ctx, llmpool.Request{Model: "gpt-5", Query: "capital of France", Question: q})
	fmt.Println(r.Failed, r.Text)

	u := pool.Usage()
	fmt.Println(u["sim-qwen"].Calls, u[llmpool.UnknownModel].Failures)
	// Output:
	// [simulated sim-qwen] The answer is Paris. (100+10 tokens, $0.000033)
	// true [pool error: model gpt-5 unavailable]
	// 1 1
}
