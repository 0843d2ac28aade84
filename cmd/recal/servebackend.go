package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/serve"
)

// recal serve's wiring: serve is pure Go and knows the policy only as a
// serve.Backend; rollout.Service is that backend.

// serviceBackend adapts rollout.Service to serve.Backend.
type serviceBackend struct{ s *rollout.Service }

func (b serviceBackend) Stats() (int, int) { return b.s.Stats() }

func (b serviceBackend) Answer(ctx context.Context, q serve.Query) (serve.Result, error) {
	a, err := b.s.Answer(ctx, rollout.ServiceQuery{Question: q.Question, Models: q.Models, MaxTurns: q.MaxTurns,
		MaxCostUSD: q.MaxCostUSD, Sampling: q.Sampling, MaxTokens: q.MaxTokens, OnCall: q.OnCall})
	if errors.Is(err, rollout.ErrInvalidQuery) {
		return serve.Result{}, fmt.Errorf("%w: %s", serve.ErrInvalidQuery, strings.TrimPrefix(err.Error(), rollout.ErrInvalidQuery.Error()+": "))
	}
	if err != nil {
		return serve.Result{}, err
	}
	return serve.Result{Answer: a.Answer, Sample: a.Sample, PolicyPromptTokens: a.PolicyPromptTokens,
		PolicyCompletionTokens: a.PolicyCompletionTokens, PoolPromptTokens: a.PoolPromptTokens,
		PoolCompletionTokens: a.PoolCompletionTokens, CostUSD: a.CostUSD}, nil
}
