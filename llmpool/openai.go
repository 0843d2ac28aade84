package llmpool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"

	"github.com/recal-project/recal/internal/httpretry"
)

// maxReplyBytes caps the body read from a provider (8 MiB); a longer body is
// a malformed reply.
const maxReplyBytes = 8 << 20

// HTTPError is a provider reply that carries an error: a non-2xx status, or
// a 2xx whose body is an error object ({"error": {...}}), as OpenRouter sends
// for upstream failures. A redirect (3xx) is one too: it is never followed
// and never retried. Its fields are StatusCode, Code, Location and Message.
type HTTPError = httpretry.HTTPError

// openAI is the provider of an OpenAI-compatible /chat/completions endpoint.
// It holds one httpretry.Client (one reused http.Client that keeps
// max_concurrency idle connections to the host and follows no redirect), a
// semaphore of max_concurrency requests in flight and an optional
// requests-per-minute limiter; retries and their waits follow
// httpretry.Do. A request takes, in order, the model's slot, a rate-limit
// token and the pool's wire slot, and holds the wire slot only for the
// round trip, so that a model waiting for its own slot, its rate limit or a
// retry holds up no other model.
type openAI struct {
	name     string // pool model name, for logs and errors
	cfg      OpenAIConfig
	endpoint string
	client   *httpretry.Client   // holds the API key: never logged, never in errors or cache keys
	retry    httpretry.Policy    // max_retries, retry_base, retry_max
	sem      *semaphore.Weighted // this model's max_concurrency
	limiter  *rate.Limiter       // nil when unlimited
	wire     *semaphore.Weighted // the pool's max_concurrency
	log      *slog.Logger
}

func newOpenAI(m ModelConfig, env providerEnv) (provider, error) {
	cfg := *m.OpenAI
	p := &openAI{
		name:     m.Name,
		cfg:      cfg,
		endpoint: strings.TrimRight(cfg.BaseURL, "/") + "/chat/completions",
		retry:    httpretry.Policy{Retries: cfg.retries(), Base: cfg.RetryBase, Max: cfg.RetryMax},
		sem:      semaphore.NewWeighted(int64(cfg.MaxConcurrency)),
		wire:     env.wire,
		log:      env.log,
	}
	apiKey := ""
	if cfg.APIKeyEnv != "" {
		key, err := APIKey(cfg.APIKeyEnv, env.getenv)
		if err != nil {
			return nil, err
		}
		apiKey = key
	}
	if cfg.RequestsPerMinute > 0 {
		// Burst 1: requests are paced evenly, which also respects providers
		// that enforce their per-minute cap over shorter windows.
		p.limiter = rate.NewLimiter(rate.Limit(cfg.RequestsPerMinute/60), 1)
	}
	p.client = httpretry.NewClient(httpretry.Options{URL: p.endpoint, APIKey: apiKey, Timeout: cfg.Timeout,
		MaxConcurrency: cfg.MaxConcurrency, MaxReplyBytes: maxReplyBytes, Table: "openai"})
	return p, nil
}

// APIKey returns the API key environment variable name holds (lookup reads
// the environment), trimmed, or an error naming the variable and what is
// wrong: unset, empty, or holding a control character (a line break pasted
// with the key), which no HTTP header can carry, so every call would fail.
// The error never holds the value.
func APIKey(name string, lookup func(string) (string, bool)) (string, error) {
	key, ok := lookup(name)
	key = strings.TrimSpace(key)
	switch {
	case !ok:
		return "", fmt.Errorf("environment variable %s (api_key_env) is not set", name)
	case key == "":
		return "", fmt.Errorf("environment variable %s (api_key_env) is set but empty", name)
	case strings.IndexFunc(key, unicode.IsControl) >= 0:
		return "", fmt.Errorf("environment variable %s (api_key_env) holds a control character (a line break?); an API key is one line", name)
	}
	return key, nil
}

// chatMessage is one message of a chat-completions request.
type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// chatRequest is the body of POST /chat/completions. Temperature and top_p
// are always sent (temperature 0 is meaningful).
type chatRequest struct {
	Model       string        `json:"model"`
	Messages    []chatMessage `json:"messages"`
	Temperature float64       `json:"temperature"`
	TopP        float64       `json:"top_p"`
	MaxTokens   int           `json:"max_tokens"`
	Seed        *int64        `json:"seed,omitempty"`
	Stream      bool          `json:"stream"`
}

// chatResponse is the part of a chat-completions reply we read.
type chatResponse struct {
	Choices []struct {
		Message struct {
			Content *string `json:"content"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// userContent is the only user message: the query, wrapped in
// prompt_template when one is set.
func (p *openAI) userContent(query string) string {
	if p.cfg.PromptTemplate == "" {
		return query
	}
	return strings.ReplaceAll(p.cfg.PromptTemplate, "{query}", query)
}

// body returns the JSON request body: deterministic (extras are merged
// through a map, whose keys encoding/json sorts) and free of secrets, so it
// doubles as the cache key.
func (p *openAI) body(query string) ([]byte, error) {
	req := chatRequest{
		Model:       p.cfg.Model,
		Messages:    []chatMessage{{Role: "user", Content: p.userContent(query)}},
		Temperature: p.cfg.Temperature,
		TopP:        p.cfg.TopP,
		MaxTokens:   p.cfg.MaxTokens,
		Seed:        p.cfg.Seed,
	}
	b, err := json.Marshal(req)
	if err != nil || len(p.cfg.Extra) == 0 {
		return b, err
	}
	var merged map[string]any
	if err := json.Unmarshal(b, &merged); err != nil {
		return nil, err
	}
	for k, v := range p.cfg.Extra {
		merged[k] = v
	}
	return json.Marshal(merged)
}

// openAIKey is the cache key of an openai call.
type openAIKey struct {
	// Endpoint is base_url + "/chat/completions": two endpoints serving the
	// same model id may not answer alike (another deployment, quantisation
	// or version), so they do not share entries.
	Endpoint string `json:"endpoint"`
	// Request is the request body: provider model id, parameters, extras
	// and the message.
	Request json.RawMessage `json:"request"`
}

// cacheKey is the endpoint and the request body; never the API key.
func (p *openAI) cacheKey(call providerCall) any {
	b, err := p.body(call.Query)
	if err != nil {
		return nil
	}
	return openAIKey{Endpoint: p.endpoint, Request: b}
}

func (p *openAI) close() { p.client.CloseIdleConnections() }

// complete sends the query, retrying as p.retry says (httpretry.Do), and
// returns at once when ctx is done. An empty query is refused without a
// request. On error the completion carries only Attempts, the requests
// sent.
func (p *openAI) complete(ctx context.Context, call providerCall) (completion, error) {
	if call.Query == "" {
		return completion{}, ErrEmptyQuery
	}
	body, err := p.body(call.Query)
	if err != nil {
		return completion{}, fmt.Errorf("llmpool: model %q: encode request: %w", p.name, err)
	}
	c, attempts, err := httpretry.Do(ctx, p.retry, fmt.Sprintf("llmpool: model %q", p.name),
		func() (completion, httpretry.Result) { return p.attempt(ctx, body, call.Query) },
		func(next int, wait time.Duration, err error) {
			p.log.LogAttrs(ctx, slog.LevelWarn, "llmpool: retrying",
				slog.String("model", p.name), slog.Int("attempt", next),
				slog.Duration("wait", wait), slog.String("err", err.Error()))
		})
	c.Attempts = attempts
	return c, err
}

// attempt sends one request under the model's semaphore, its rate limiter,
// the pool's wire semaphore and the per-attempt timeout, taken in that
// order: the wire slot is held only while the request is out, so waiting
// for this model's slot or rate limit (and, in complete, for a retry) holds
// up no other model.
func (p *openAI) attempt(ctx context.Context, body []byte, query string) (completion, httpretry.Result) {
	if err := p.sem.Acquire(ctx, 1); err != nil {
		return completion{}, httpretry.Result{Err: err}
	}
	defer p.sem.Release(1)
	if p.limiter != nil {
		// After the model's slot, so that the request leaves right after
		// its token and the pacing holds on the wire.
		if err := p.limiter.Wait(ctx); err != nil {
			// Either ctx is done or its deadline comes before our turn.
			return completion{}, httpretry.Result{Err: fmt.Errorf("rate limit wait: %w", err)}
		}
	}
	if err := p.wire.Acquire(ctx, 1); err != nil {
		return completion{}, httpretry.Result{Err: err}
	}
	defer p.wire.Release(1)
	p.log.LogAttrs(ctx, slog.LevelDebug, "llmpool: request", slog.String("model", p.name), slog.String("endpoint", p.endpoint))
	r, res := p.client.Post(ctx, body)
	if res.Err != nil {
		return completion{}, res
	}
	return p.parse(r, query)
}

// parse reads a 2xx reply. Malformed or truncated JSON and a reply with no
// choices are retried (they are usually transient); an error object is
// classified by httpretry's Refusal.
func (p *openAI) parse(r httpretry.Reply, query string) (completion, httpretry.Result) {
	var cr chatResponse
	if err := json.Unmarshal(r.Body, &cr); err != nil {
		return completion{}, httpretry.Result{Err: fmt.Errorf("malformed reply (%d bytes): %w", len(r.Body), err), Retry: true}
	}
	if httpretry.HasError(cr.Error) {
		return completion{}, p.client.Refusal(r)
	}
	if len(cr.Choices) == 0 {
		return completion{}, httpretry.Result{Err: errors.New("reply has no choices"), Retry: true}
	}
	c := completion{}
	if s := cr.Choices[0].Message.Content; s != nil {
		c.Text = *s
	}
	// Counts are billed as costs: a negative one (from a broken or hostile
	// endpoint) would pay back, so such a usage is estimated instead.
	if u := cr.Usage; u != nil && u.PromptTokens >= 0 && u.CompletionTokens >= 0 && (u.PromptTokens > 0 || u.CompletionTokens > 0) {
		c.InputTokens = cr.Usage.PromptTokens
		c.OutputTokens = cr.Usage.CompletionTokens
	} else {
		c.InputTokens = estimateTokens(p.userContent(query)) + chatOverheadTokens
		c.OutputTokens = estimateTokens(c.Text)
		c.Estimated = true
	}
	return c, httpretry.Result{}
}

// chatOverheadTokens is added to estimated input tokens for the chat
// template around the user message.
const chatOverheadTokens = 8

// estimateTokens estimates a token count as one token per 4 characters
// (code points), rounded up: the usual rule of thumb for English text with
// BPE tokenizers. It is used only when a reply carries no usage.
func estimateTokens(s string) int {
	n := utf8.RuneCountInString(s)
	return (n + 3) / 4
}
