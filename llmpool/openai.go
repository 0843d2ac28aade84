package llmpool

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"
)

// maxReplyBytes caps the body read from a provider (8 MiB); a longer body is
// a malformed reply.
const maxReplyBytes = 8 << 20

// maxErrorChars caps the provider message kept in an HTTPError.
const maxErrorChars = 300

// HTTPError is a provider reply that carries an error: a non-2xx status, or
// a 2xx whose body is an error object ({"error": {...}}), as OpenRouter sends
// for upstream failures. A redirect (3xx) is one too: it is never followed
// and never retried.
type HTTPError struct {
	// StatusCode is the HTTP status of the reply (200 for an error body).
	StatusCode int
	// Code is the "code" of the error object, if any ("429", "rate_limit").
	Code string
	// Location is the Location header of a redirect, not followed (at most
	// 300 characters, API key redacted); "" for other replies.
	Location string
	// Message is the start of the provider's message (at most 300
	// characters) with the API key, should the provider echo it, redacted.
	Message string
}

func (e *HTTPError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "http %d", e.StatusCode)
	if e.Code != "" {
		fmt.Fprintf(&b, " (code %s)", e.Code)
	}
	if e.StatusCode >= 300 && e.StatusCode <= 399 {
		loc := e.Location
		if loc == "" {
			loc = "(no Location)"
		}
		fmt.Fprintf(&b, ": redirect to %s not followed (fix openai.base_url)", loc)
	}
	if e.Message != "" {
		fmt.Fprintf(&b, ": %s", e.Message)
	}
	return b.String()
}

// openAI is the provider of an OpenAI-compatible /chat/completions endpoint.
// It holds one http.Client (its Transport keeps max_concurrency idle
// connections to the host; it follows no redirect), a semaphore of
// max_concurrency requests in flight and an optional requests-per-minute
// limiter; retries and their waits follow retry.go. A request takes, in
// order, the model's slot, a rate-limit token and the pool's wire slot, and
// holds the wire slot only for the round trip, so that a model waiting for
// its own slot, its rate limit or a retry holds up no other model.
type openAI struct {
	name      string // pool model name, for logs and errors
	cfg       OpenAIConfig
	endpoint  string
	apiKey    string // never logged, never in errors or cache keys
	client    *http.Client
	transport *http.Transport
	sem       *semaphore.Weighted // this model's max_concurrency
	limiter   *rate.Limiter       // nil when unlimited
	wire      *semaphore.Weighted // the pool's max_concurrency
	log       *slog.Logger
}

func newOpenAI(m ModelConfig, env providerEnv) (provider, error) {
	cfg := *m.OpenAI
	p := &openAI{
		name:     m.Name,
		cfg:      cfg,
		endpoint: strings.TrimRight(cfg.BaseURL, "/") + "/chat/completions",
		sem:      semaphore.NewWeighted(int64(cfg.MaxConcurrency)),
		wire:     env.wire,
		log:      env.log,
	}
	if cfg.APIKeyEnv != "" {
		key, ok := env.getenv(cfg.APIKeyEnv)
		if !ok || strings.TrimSpace(key) == "" {
			return nil, fmt.Errorf("environment variable %s (api_key_env) is not set", cfg.APIKeyEnv)
		}
		p.apiKey = strings.TrimSpace(key)
	}
	if cfg.RequestsPerMinute > 0 {
		// Burst 1: requests are paced evenly, which also respects providers
		// that enforce their per-minute cap over shorter windows.
		p.limiter = rate.NewLimiter(rate.Limit(cfg.RequestsPerMinute/60), 1)
	}
	tr, ok := http.DefaultTransport.(*http.Transport)
	if ok {
		tr = tr.Clone()
	} else {
		tr = &http.Transport{Proxy: http.ProxyFromEnvironment, ForceAttemptHTTP2: true, IdleConnTimeout: 90 * time.Second}
	}
	tr.MaxIdleConnsPerHost = max(cfg.MaxConcurrency, 2)
	tr.MaxIdleConns = max(tr.MaxIdleConns, 2*cfg.MaxConcurrency)
	p.transport = tr
	// No Client.Timeout: each attempt gets its own context timeout. No
	// redirects: following one would re-send the API key to wherever the
	// server points (in clear text after an https→http redirect) and turn
	// the POST into a GET on 301/302/303; the 3xx reply becomes an
	// HTTPError naming its Location instead.
	p.client = &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}
	return p, nil
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

// errorBody is an OpenAI-style error object.
type errorBody struct {
	Message string          `json:"message"`
	Code    json.RawMessage `json:"code"`
	Type    string          `json:"type"`
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

func (p *openAI) close() { p.transport.CloseIdleConnections() }

// attemptResult is the outcome of one HTTP attempt.
type attemptResult struct {
	err        error
	retry      bool          // worth another attempt
	serverWait time.Duration // Retry-After, when hasWait
	hasWait    bool
}

// complete sends the query, retrying as retry.go decides, and returns at
// once when ctx is done. An empty query is refused without a request. On
// error the completion carries only Attempts, the requests sent.
func (p *openAI) complete(ctx context.Context, call providerCall) (completion, error) {
	if call.Query == "" {
		return completion{}, ErrEmptyQuery
	}
	body, err := p.body(call.Query)
	if err != nil {
		return completion{}, fmt.Errorf("llmpool: model %q: encode request: %w", p.name, err)
	}
	retries := p.cfg.retries()
	var last attemptResult
	attempt := 1
	for ; ; attempt++ {
		if attempt > 1 {
			wait := retryWait(p.cfg.RetryBase, p.cfg.RetryMax, attempt-1, last.serverWait, last.hasWait)
			p.log.LogAttrs(ctx, slog.LevelWarn, "llmpool: retrying",
				slog.String("model", p.name), slog.Int("attempt", attempt),
				slog.Duration("wait", wait), slog.String("err", last.err.Error()))
			if err := sleepCtx(ctx, wait); err != nil {
				return completion{Attempts: attempt - 1}, err
			}
		}
		c, res := p.attempt(ctx, body, call.Query)
		if res.err == nil {
			c.Attempts = attempt
			return c, nil
		}
		if err := ctx.Err(); err != nil {
			return completion{Attempts: attempt}, err
		}
		last = res
		if !res.retry {
			return completion{Attempts: attempt}, fmt.Errorf("llmpool: model %q: attempt %d: %w", p.name, attempt, res.err)
		}
		if attempt > retries {
			break
		}
	}
	return completion{Attempts: attempt}, fmt.Errorf("llmpool: model %q: gave up after %d attempts: %w", p.name, attempt, last.err)
}

// attempt sends one request under the model's semaphore, its rate limiter,
// the pool's wire semaphore and the per-attempt timeout, taken in that
// order: the wire slot is held only while the request is out, so waiting
// for this model's slot or rate limit (and, in complete, for a retry) holds
// up no other model.
func (p *openAI) attempt(ctx context.Context, body []byte, query string) (completion, attemptResult) {
	if err := p.sem.Acquire(ctx, 1); err != nil {
		return completion{}, attemptResult{err: err}
	}
	defer p.sem.Release(1)
	if p.limiter != nil {
		// After the model's slot, so that the request leaves right after
		// its token and the pacing holds on the wire.
		if err := p.limiter.Wait(ctx); err != nil {
			// Either ctx is done or its deadline comes before our turn.
			return completion{}, attemptResult{err: fmt.Errorf("rate limit wait: %w", err)}
		}
	}
	if err := p.wire.Acquire(ctx, 1); err != nil {
		return completion{}, attemptResult{err: err}
	}
	defer p.wire.Release(1)

	actx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(actx, http.MethodPost, p.endpoint, bytes.NewReader(body))
	if err != nil {
		return completion{}, attemptResult{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	if p.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+p.apiKey)
	}
	p.log.LogAttrs(ctx, slog.LevelDebug, "llmpool: request", slog.String("model", p.name), slog.String("endpoint", p.endpoint))
	resp, err := p.client.Do(req)
	if err != nil {
		// Connection errors and per-attempt timeouts. *url.Error names the
		// URL, never the headers.
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("timed out after %v (openai.timeout): %w", p.cfg.Timeout, err)
		}
		return completion{}, attemptResult{err: p.redact(err), retry: true}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxReplyBytes+1))
	wait, hasWait := retryAfter(resp.Header, time.Now())
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		herr := p.httpError(resp.StatusCode, raw)
		if resp.StatusCode >= 300 && resp.StatusCode <= 399 {
			herr.Location = cutRunes(p.redactString(sanitizeHeader(resp.Header.Get("Location"))), maxErrorChars)
		}
		return completion{}, attemptResult{err: herr, retry: retryableStatus(resp.StatusCode), serverWait: wait, hasWait: hasWait}
	}
	if err != nil {
		// Truncated body: the connection broke or the attempt timed out mid-read.
		return completion{}, attemptResult{err: p.redact(fmt.Errorf("read reply: %w", err)), retry: true}
	}
	if len(raw) > maxReplyBytes {
		return completion{}, attemptResult{err: fmt.Errorf("reply larger than %d bytes", maxReplyBytes), retry: true}
	}
	return p.parse(resp.StatusCode, raw, query, wait, hasWait)
}

// parse reads a 2xx body. Malformed or truncated JSON and a reply with no
// choices are retried (they are usually transient); an error object is
// retried unless its code is a 4xx other than 408 and 429.
func (p *openAI) parse(status int, raw []byte, query string, wait time.Duration, hasWait bool) (completion, attemptResult) {
	var cr chatResponse
	if err := json.Unmarshal(raw, &cr); err != nil {
		return completion{}, attemptResult{err: fmt.Errorf("malformed reply (%d bytes): %w", len(raw), err), retry: true}
	}
	if len(cr.Error) > 0 && string(cr.Error) != "null" {
		herr := p.httpError(status, raw)
		retry := true
		if n, ok := parseCode(herr.Code); ok && n >= 400 && n < 500 && !retryableStatus(n) {
			retry = false
		}
		return completion{}, attemptResult{err: herr, retry: retry, serverWait: wait, hasWait: hasWait}
	}
	if len(cr.Choices) == 0 {
		return completion{}, attemptResult{err: errors.New("reply has no choices"), retry: true}
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
	return c, attemptResult{}
}

// httpError builds an HTTPError from an error reply, reading an
// OpenAI-style {"error": {...}} or {"error": "..."} object when there is
// one, else the start of the body.
func (p *openAI) httpError(status int, raw []byte) *HTTPError {
	e := &HTTPError{StatusCode: status}
	var wrapper struct {
		Error json.RawMessage `json:"error"`
	}
	msg := ""
	if json.Unmarshal(raw, &wrapper) == nil && len(wrapper.Error) > 0 {
		var eb errorBody
		var s string
		switch {
		case json.Unmarshal(wrapper.Error, &eb) == nil:
			msg = eb.Message
			if msg == "" {
				msg = eb.Type
			}
			e.Code = errorCode(eb.Code)
		case json.Unmarshal(wrapper.Error, &s) == nil:
			msg = s
		}
	}
	if msg == "" {
		msg = string(raw)
	}
	// Redact before cutting, so that no prefix of the key survives a cut.
	e.Message = cutRunes(p.redactString(strings.Join(strings.Fields(sanitizeHeader(msg)), " ")), maxErrorChars)
	e.Code = cutRunes(p.redactString(sanitizeHeader(e.Code)), 40)
	return e
}

// errorCode reads the "code" of an error object: a string or a number
// ("rate_limit", 429); any other JSON value is no code.
func errorCode(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return n.String()
	}
	return ""
}

// sanitizeHeader makes a header value from a server safe to put in an
// error: valid UTF-8 without control characters.
func sanitizeHeader(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return -1
		}
		return r
	}, strings.ToValidUTF8(s, ""))
}

// parseCode reads an error code such as 429 or "429".
func parseCode(code string) (int, bool) {
	var n int
	if _, err := fmt.Sscanf(code, "%d", &n); err != nil || fmt.Sprint(n) != code {
		return 0, false
	}
	return n, true
}

// redact removes the API key from an error, in case a provider or a proxy
// echoes it.
func (p *openAI) redact(err error) error {
	if p.apiKey == "" || !strings.Contains(err.Error(), p.apiKey) {
		return err
	}
	return errors.New(p.redactString(err.Error()))
}

func (p *openAI) redactString(s string) string {
	if p.apiKey == "" {
		return s
	}
	return strings.ReplaceAll(s, p.apiKey, "[redacted]")
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
