package rollout_test

import (
	"context"
	"slices"
	"testing"

	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/generate"
)

// Rollouts decoded in rounds (train.rollout_rows, Env.MaxRows) sample what
// one round samples, bit for bit (a float32 policy on the CPU): every
// response's tokens, log-probs and pool calls, in the same order.
func TestRolloutRoundsMatchOneRound(t *testing.T) {
	env, _ := serviceEnv(t, searcherScaled(t, "sim-small", 12), nil)
	qs := []data.Example{
		{ID: "nq/a", Dataset: "nq", Question: "who wrote the song?", Golden: []string{"x"}},
		{ID: "hotpotqa/b", Dataset: "hotpotqa", Question: "Which film came first, A or B?", Golden: []string{"A"}},
		{ID: "nq/c", Dataset: "nq", Question: "when was the bridge built?", Golden: []string{"1932"}},
	}
	s := generate.Sampling{Temperature: 1, TopP: 1}
	roll := func(maxRows int) ([][]int32, [][]float32, []int) {
		t.Helper()
		env.MaxRows = maxRows
		samples, st, err := env.RollRows(context.Background(), qs, 2, s, 5, true, 4)
		if err != nil {
			t.Fatal(err)
		}
		if len(samples) != 6 {
			t.Fatalf("max rows %d: %d responses, want 6", maxRows, len(samples))
		}
		var toks [][]int32
		var lps [][]float32
		var calls []int
		for _, smp := range samples {
			toks = append(toks, smp.Tokens)
			lps = append(lps, smp.Logp)
			calls = append(calls, len(smp.Calls))
		}
		if st.Calls != sum(calls) {
			t.Errorf("max rows %d: stats count %d pool calls, the responses %d", maxRows, st.Calls, sum(calls))
		}
		return toks, lps, calls
	}
	wantT, wantL, wantC := roll(0)
	for _, rows := range []int{1, 4, 6, 100} {
		gotT, gotL, gotC := roll(rows)
		for i := range wantT {
			if !slices.Equal(gotT[i], wantT[i]) || !slices.Equal(gotL[i], wantL[i]) || gotC[i] != wantC[i] {
				t.Errorf("rounds of %d rows: response %d differs from one round's (tokens %v vs %v): a response must not depend on the rows decoded with it",
					rows, i, gotT[i], wantT[i])
			}
		}
	}
	env.MaxRows = 0
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}
