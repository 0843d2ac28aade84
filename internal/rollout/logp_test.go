package rollout_test

import (
	"context"
	"math"
	"testing"

	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/generate"
)

// TestRolloutLogpMatchesScore: the log-probs a rollout records while it
// decodes through the KV cache are those of one forward pass over the
// whole response (what the GRPO ratio compares them with), at every policy
// token, including those after an <information> block: the cache holds
// exactly the tokens the response holds. (This policy's chain is too sure
// of itself for one missing context token to move its log-probs; the
// order in which the engine feeds the cache is checked token by token by
// router's scripted decoder, checkClean.)
func TestRolloutLogpMatchesScore(t *testing.T) {
	env, _ := serviceEnv(t, searcherScaled(t, "sim-small", 12), nil)
	qs := []data.Example{
		{ID: "nq/a", Dataset: "nq", Question: "who wrote the song?", Golden: []string{"x"}},
		{ID: "hotpotqa/b", Dataset: "hotpotqa", Question: "Which film came first, A or B?", Golden: []string{"A"}},
	}
	for _, s := range []generate.Sampling{{}, {Temperature: 0.25, TopP: 1}} {
		samples, _, err := env.Roll(context.Background(), qs, 2, s, 11, true)
		if err != nil {
			t.Fatal(err)
		}
		for i, smp := range samples {
			if len(smp.Calls) == 0 {
				t.Fatalf("sampling %+v, response %d made no pool call, so nothing follows an <information> block: %q", s, i, smp.Text)
			}
			prompt, err := env.PromptTokens(qs[i/2])
			if err != nil {
				t.Fatal(err)
			}
			seq := append(append([]int32{}, prompt...), smp.Tokens...)
			lp, _, err := env.Engine.Policy.Score(context.Background(), [][]int32{seq})
			if err != nil {
				t.Fatal(err)
			}
			var block bool
			var after int // policy tokens after the first block
			for k, m := range smp.Mask {
				if m == 0 {
					block = true
					continue
				}
				if block {
					after++
				}
				if d := math.Abs(float64(lp[0][len(prompt)+k] - smp.Logp[k])); d > 1e-4 {
					t.Errorf("sampling %+v, response %d, token %d (%q): rollout log-prob %.6f, forward pass %.6f",
						s, i, k, env.Engine.Tok.Decode([]int{int(smp.Tokens[k])}), smp.Logp[k], lp[0][len(prompt)+k])
					break
				}
			}
			if after <= 0 {
				t.Errorf("sampling %+v, response %d: no policy token after an <information> block: %q", s, i, smp.Text)
			}
		}
	}
}
