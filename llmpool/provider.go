package llmpool

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"time"

	"golang.org/x/sync/semaphore"
)

// provider answers sub-queries for one model of the pool. Implementations
// are safe for concurrent use.
type provider interface {
	// complete returns the model's reply to one sub-query. It returns
	// promptly with ctx's error when ctx is done. On error, only the
	// completion's Attempts is meaningful. It holds one unit of
	// providerEnv.wire while a request is out, and only then.
	complete(ctx context.Context, call providerCall) (completion, error)
	// cacheKey returns everything that determines the reply, JSON-encodable,
	// for the response cache. It must never contain a secret.
	cacheKey(call providerCall) any
	// close releases the provider's resources (idle connections).
	close()
}

// providerCall is one sub-query as a provider sees it: already sanitised
// and capped by the pool.
type providerCall struct {
	// Query is the sub-query: valid UTF-8, trimmed, at most
	// pool.max_query_chars code points; it may be empty.
	Query string
	// Question is the example being routed; may be nil.
	Question *Question
}

// completion is a provider's successful reply.
type completion struct {
	Text         string
	InputTokens  int
	OutputTokens int
	// Estimated is true when the token counts are estimated, not reported.
	Estimated bool
	// Attempts is the number of requests sent (1 without retries).
	Attempts int
	// Cost, when set, is the reply's cost in USD as logged (provider
	// "replay"), used instead of tokens times the model's prices.
	Cost *float64
	// Latency, when set, is the reply's latency as logged (provider
	// "replay"), reported instead of the call's wall time so that replayed
	// runs are identical byte for byte.
	Latency *time.Duration
	// Evidence is what the model wrote when Text is rendered from a
	// judgment instead (provider "replay", render "judgment", a row with
	// reply text); empty otherwise. See Response.Evidence.
	Evidence string
}

// offlineProvider is implemented by providers that answer from a file
// (provider "replay"): their replies bypass the response cache (they are
// already a lookup on disk) and their failures report latency 0, not the
// call's wall time, so that replayed runs are identical byte for byte.
type offlineProvider interface {
	offline()
}

// providerEnv is what a provider constructor gets besides its model config.
type providerEnv struct {
	log        *slog.Logger
	getenv     func(string) (string, bool)
	answerBank map[string][]string
	// wire bounds the requests out across the pool (pool.max_concurrency).
	// A provider takes a unit just around a request (an HTTP round trip, a
	// simulated latency), never while it waits for its own slot, rate
	// limit or retry backoff.
	wire *semaphore.Weighted
	// logs reads each outcome log once per New (provider "replay").
	logs logBook
}

// providerFactory builds the provider of one model from its validated,
// defaulted config.
type providerFactory func(m ModelConfig, env providerEnv) (provider, error)

// providers is the registry of providers by the name used in
// pool.models[].provider. Adding a provider means adding it here.
var providers = map[string]providerFactory{
	"openai": newOpenAI,
	"replay": newReplay,
	"sim":    newSim,
}

// providerNames returns the registered provider names, sorted.
func providerNames() []string {
	return slices.Sorted(maps.Keys(providers))
}
