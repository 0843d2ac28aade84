package trainer

import (
	"testing"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/router"
)

// GRPO rollouts use train.no_repeat_ngram; validation keeps the env's
// router.no_repeat_ngram; nothing else of the protocol changes.
func TestRolloutEnv(t *testing.T) {
	prompt := &router.Prompt{}
	env := &rollout.Env{Prompt: prompt, Router: router.Config{MaxTurns: 3, TurnTokens: 96, InfoTokens: 32, NoRepeatNGram: 3}}
	for _, c := range []struct {
		train int
		same  bool
	}{{3, true}, {0, false}, {4, false}} {
		got := rolloutEnv(env, config.Train{NoRepeatNGram: c.train})
		if (got == env) != c.same {
			t.Errorf("train %d: same env %v, want %v", c.train, got == env, c.same)
		}
		if got.Router.NoRepeatNGram != c.train {
			t.Errorf("train %d: rollouts ban %d-grams", c.train, got.Router.NoRepeatNGram)
		}
		want := env.Router
		want.NoRepeatNGram = c.train
		if got.Router != want || got.Prompt != prompt || got.Engine != env.Engine || got.Pool != env.Pool {
			t.Errorf("train %d: protocol %+v, want %+v with the same prompt, policy and pool", c.train, got.Router, want)
		}
		if env.Router.NoRepeatNGram != 3 {
			t.Fatalf("validation's env changed to %d", env.Router.NoRepeatNGram)
		}
	}
}
