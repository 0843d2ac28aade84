package eval

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"

	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/torchbridge"
)

// The no-routing rows of the ReCal paper's Table 1 besides Vanilla
// (direct): the policy answers alone, with no model listed and no call
// allowed (rollout.DirectProtocol).

// CoTTemplateName is the chain-of-thought template's file name; with no
// Setup.CoTTemplate it is looked up beside the routing template
// (router.prompt_template), so router/prompt-cot.tmpl for both the offline
// default and configs/.
const CoTTemplateName = "prompt-cot.tmpl"

// cotTemplate is the chain-of-thought template the cot router uses.
func cotTemplate(s Setup) string {
	if s.CoTTemplate != "" {
		return s.CoTTemplate
	}
	return filepath.Join(filepath.Dir(s.Env.Router.PromptTemplate), CoTTemplateName)
}

// newCoT is Chain-of-Thought prompting (Wei et al., 2022; Table 1's "CoT"):
// the policy is asked to think step by step inside <think> and then answer,
// with no pool. It departs from the paper's few-shot CoT in having no
// exemplars (zero-shot, "think step by step"); the turn's token limit is
// router.turn_tokens, as for every policy turn.
func newCoT(s Setup) (Router, error) {
	if s.Env == nil || s.Env.Engine == nil {
		return nil, errors.New("eval: router cot needs a policy: --checkpoint")
	}
	rc := s.Env.Router
	rc.PromptTemplate = cotTemplate(s)
	env, err := rollout.DirectEnv(s.Env.Engine, s.Env.Pool, rc)
	if err != nil {
		return nil, fmt.Errorf("eval: router cot: %w", err)
	}
	return policyRouter{Setup{Env: env, Batch: s.Batch}}, nil
}

// SFTDirectCommand is the command that makes the sft router's checkpoint;
// errors name it.
const SFTDirectCommand = "recal train-sft-direct --config FILE --out DIR"

// sftRouter is Table 1's "SFT": policy.checkpoint fine-tuned on the
// training split to answer directly (sftdirect.Train), evaluated
// with the direct prompt and no pool. It holds its own policy, closed with
// the router.
type sftRouter struct {
	policyRouter
	eng *rollout.Engine
}

func newSFT(s Setup) (Router, error) {
	if s.SFTCheckpoint == "" {
		return nil, fmt.Errorf("eval: router sft needs the SFT-direct checkpoint: --sft-checkpoint DIR, made by `%s`", SFTDirectCommand)
	}
	if s.Env == nil || s.Env.Engine == nil {
		return nil, errors.New("eval: router sft needs the evaluation's policy settings: --checkpoint")
	}
	o := s.Env.Engine.Policy.Options()
	eng, err := rollout.OpenEngine(s.SFTCheckpoint, torchbridge.Options{Device: o.Device, DType: o.DType})
	if err != nil {
		return nil, fmt.Errorf("eval: router sft: %s is not a checkpoint (make it with `%s`): %w", s.SFTCheckpoint, SFTDirectCommand, err)
	}
	env, err := rollout.DirectEnv(eng, s.Env.Pool, s.Env.Router)
	if err != nil {
		eng.Close()
		return nil, err
	}
	return &sftRouter{policyRouter: policyRouter{Setup{Env: env, Batch: s.Batch}}, eng: eng}, nil
}

// Close frees the SFT policy.
func (r *sftRouter) Close() error { return r.eng.Close() }

var _ io.Closer = (*sftRouter)(nil)
