package serve

import (
	"context"
	"errors"

	"github.com/recal-project/recal/internal/generate"
	"github.com/recal-project/recal/router"
)

// ErrInvalidQuery marks a backend error that is the client's fault (a
// question too long for the policy's context, say): the server answers it
// 400 with the error's text. A backend wraps it with %w.
var ErrInvalidQuery = errors.New("serve: invalid query")

// Query is one question for the router, as the HTTP layer validated it.
type Query struct {
	// Question is the last user message (non-empty, valid UTF-8).
	Question string
	// Models are the pool models the router may call (canonical pool names;
	// the prompt lists only these); nil means all.
	Models []string
	// MaxTurns caps the pool calls (≤ router.max_turns); 0 means the
	// configured router.max_turns.
	MaxTurns int
	// MaxCostUSD stops pool calls once this much is spent (USD); 0 means no
	// limit.
	MaxCostUSD float64
	// Sampling is the policy's sampling; Temperature 0 is greedy.
	Sampling generate.Sampling
	// MaxTokens caps the tokens the policy writes; 0 means none.
	MaxTokens int
	// OnCall is called as each pool reply arrives (from any goroutine; it
	// must not block); nil when nobody streams.
	OnCall func(router.Call)
}

// Result is the router's response to a Query.
type Result struct {
	// Answer is the <answer> content ("" when the response has none).
	Answer string
	// Sample is the whole response: text, pool calls and why it ended.
	Sample router.Sample
	// PolicyPromptTokens and PolicyCompletionTokens count the policy's
	// prompt and the tokens it wrote; PoolPromptTokens and
	// PoolCompletionTokens those of the pool calls.
	PolicyPromptTokens, PolicyCompletionTokens int
	PoolPromptTokens, PoolCompletionTokens     int
	// CostUSD is the pool calls' cost at list prices.
	CostUSD float64
}

// Backend answers queries: the policy decoding rows together and calling
// the pool (rollout.Service in `recal serve`). Its methods are safe for
// concurrent use.
type Backend interface {
	// Answer blocks until q is answered; cancelling ctx cancels the row and
	// its pool calls and returns ctx's error.
	Answer(ctx context.Context, q Query) (Result, error)
	// Stats reports the rows decoding and the queries waiting for a row.
	Stats() (active, waiting int)
}
