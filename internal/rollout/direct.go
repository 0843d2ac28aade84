package rollout

import (
	"github.com/recal-project/recal/llmpool"
	"github.com/recal-project/recal/router"
)

// DirectProtocol is the protocol of a policy answering alone: the template
// at rc.PromptTemplate listing no models, and router.max_turns = 0, so the
// one turn the policy writes must answer. eval's no-routing rows (direct,
// cot, sft) and SFT-direct's demonstrations use it.
func DirectProtocol(rc router.Config) (*router.Prompt, router.Config, error) {
	rc.MaxTurns = 0
	p, err := router.NewPrompt(rc.PromptTemplate, nil, 0)
	if err != nil {
		return nil, rc, err
	}
	return p, rc, nil
}

// DirectEnv is the environment of eng answering alone under
// DirectProtocol(rc). pool is only consulted for model names (no call is
// made with max_turns 0) and may be shared with another environment.
func DirectEnv(eng *Engine, pool *llmpool.Pool, rc router.Config) (*Env, error) {
	prompt, rc, err := DirectProtocol(rc)
	if err != nil {
		return nil, err
	}
	return &Env{Engine: eng, Pool: pool, Prompt: prompt, Router: rc, prompts: map[string][]int32{}}, nil
}
