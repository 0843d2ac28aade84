package embed

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

	"golang.org/x/sync/errgroup"
)

// maxReplyBytes caps the body read from the endpoint (64 MiB: 2048 vectors
// of 3072 floats as JSON text fit).
const maxReplyBytes = 64 << 20

// HTTPError is a reply of the endpoint that carries an error: a non-2xx
// status, or a 2xx whose body is an error object. A redirect is one too: it
// is never followed.
type HTTPError struct {
	// StatusCode is the HTTP status (200 for an error object in a 2xx body).
	StatusCode int
	// Location is a redirect's Location (API key redacted), not followed.
	Location string
	// Message is the start of the provider's message (at most 300
	// characters, API key redacted).
	Message string
}

func (e *HTTPError) Error() string {
	s := fmt.Sprintf("http %d", e.StatusCode)
	if e.StatusCode >= 300 && e.StatusCode <= 399 {
		s += fmt.Sprintf(": redirect to %q not followed (fix embedding.openai.base_url)", e.Location)
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// openAI is the "openai" provider: POST base_url + "/embeddings" with
// {"model", "input": [texts], "encoding_format": "float"} (and
// "dimensions" when set), the OpenAI embeddings API that vLLM, TEI,
// Ollama, NVIDIA NIM and others serve too.
//
// Texts are looked up in memory, then on disk (diskCache); the rest, each
// distinct text once, go in requests of batch_size texts, at most
// max_concurrency in flight (errgroup). A request is retried on 408, 429,
// 5xx, connection errors, timeouts (timeout per attempt) and malformed
// replies, up to max_retries times, waiting Retry-After (or Retry-After-Ms)
// when the server sends it and an exponential backoff with jitter
// otherwise, and giving up at once when ctx ends. Other statuses fail at
// once. One http.Client, reused; it follows no redirect (that would send the
// key wherever the server points). The API key is read once, sent only in
// the Authorization header and redacted from every error; nothing logs it.
// Replies are checked: one vector per text, indices in range, one length,
// finite values; vectors are scaled to unit length.
type openAI struct {
	cfg      OpenAIConfig
	endpoint string
	base     string
	apiKey   string
	client   *http.Client
	disk     *diskCache // nil: memory only
	readOnly bool
	memo     *memo
	log      *slog.Logger
}

func newOpenAI(cfg Config, env Env) (Embedder, error) {
	o := cfg.OpenAI
	p := &openAI{cfg: o, base: strings.TrimRight(o.BaseURL, "/"), memo: &memo{}, log: env.Log,
		readOnly: cfg.Cache == CacheReadOnly}
	p.endpoint = p.base + "/embeddings"
	if o.APIKeyEnv != "" {
		key, ok := env.LookupEnv(o.APIKeyEnv)
		if !ok || strings.TrimSpace(key) == "" {
			return nil, fmt.Errorf("embed: environment variable %s (embedding.openai.api_key_env) is not set", o.APIKeyEnv)
		}
		p.apiKey = strings.TrimSpace(key)
	}
	disk, err := openDisk(env.CacheDir, cfg.Cache, env.Log)
	if err != nil {
		return nil, err
	}
	p.disk = disk
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = max(o.MaxConcurrency, 2)
	// No Client.Timeout (each attempt has its own) and no redirects.
	p.client = &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}
	return p, nil
}

func (p *openAI) Info() Info {
	return Info{Provider: "openai", Model: p.cfg.Model, Endpoint: p.base, Dim: p.cfg.Dimensions}
}

func (p *openAI) Embed(ctx context.Context, texts []string) ([][]float32, error) {
	out := make([][]float32, len(texts))
	info := p.Info()
	var todo []string
	where := map[string][]int{} // text -> its positions in texts
	for i, t := range texts {
		if strings.TrimSpace(t) == "" {
			return nil, fmt.Errorf("%w (text %d)", ErrEmptyText, i)
		}
		if v, ok := p.memo.get(memoKey(info, t)); ok {
			out[i] = clone(v)
			continue
		}
		if _, queued := where[t]; !queued {
			if v, ok := p.fromDisk(t); ok {
				p.memo.put(memoKey(info, t), clone(v))
				out[i] = v
				continue
			}
			if p.readOnly {
				return nil, fmt.Errorf("%w: text %s (model %q)", ErrCacheMiss, describe(t), p.cfg.Model)
			}
			todo = append(todo, t)
		}
		where[t] = append(where[t], i)
	}
	got := make([][]float32, len(todo))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(p.cfg.MaxConcurrency)
	for lo := 0; lo < len(todo); lo += p.cfg.BatchSize {
		hi := min(lo+p.cfg.BatchSize, len(todo))
		g.Go(func() error {
			vs, err := p.request(gctx, todo[lo:hi])
			if err != nil {
				return err
			}
			copy(got[lo:hi], vs)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	for k, t := range todo {
		v := got[k]
		p.memo.put(memoKey(info, t), clone(v))
		if p.disk != nil {
			if err := p.disk.put(diskKey("openai", p.base, p.cfg.Model, p.cfg.Dimensions, t), p.cfg.Model, v); err != nil {
				p.log.Warn("embed: cache write failed", "err", err)
			}
		}
		for _, i := range where[t] {
			out[i] = clone(v)
		}
	}
	for i, v := range out {
		if len(v) != len(out[0]) {
			return nil, fmt.Errorf("embed: openai %q: vectors of %d and %d dimensions (texts 0 and %d); a cache of another model?", p.cfg.Model, len(out[0]), len(v), i)
		}
	}
	return out, nil
}

func (p *openAI) fromDisk(t string) ([]float32, bool) {
	if p.disk == nil {
		return nil, false
	}
	return p.disk.get(diskKey("openai", p.base, p.cfg.Model, p.cfg.Dimensions, t))
}

// request embeds one batch, retrying as the type's doc says.
func (p *openAI) request(ctx context.Context, texts []string) ([][]float32, error) {
	body := map[string]any{"model": p.cfg.Model, "input": texts, "encoding_format": "float"}
	if p.cfg.Dimensions > 0 {
		body["dimensions"] = p.cfg.Dimensions
	}
	raw, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("embed: openai %q: encode request: %w", p.cfg.Model, err)
	}
	retries := p.cfg.retries()
	for attempt := 1; ; attempt++ {
		vs, res := p.attempt(ctx, raw, len(texts))
		if res.err == nil {
			return vs, nil
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if !res.retry {
			return nil, fmt.Errorf("embed: openai %q: attempt %d: %w", p.cfg.Model, attempt, res.err)
		}
		if attempt > retries {
			return nil, fmt.Errorf("embed: openai %q: gave up after %d attempts: %w", p.cfg.Model, attempt, res.err)
		}
		wait := backoff(p.cfg.RetryBase, p.cfg.RetryMax, attempt, res.wait, res.hasWait)
		p.log.Warn("embed: retrying", "model", p.cfg.Model, "attempt", attempt+1, "wait", wait, "err", res.err.Error())
		if err := sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
}

// attemptResult is the outcome of one HTTP attempt.
type attemptResult struct {
	err     error
	retry   bool
	wait    time.Duration // the server's Retry-After, when hasWait
	hasWait bool
}

// embeddingsReply is the part of the reply read.
type embeddingsReply struct {
	Data []struct {
		Index     *int      `json:"index"`
		Embedding []float32 `json:"embedding"`
	} `json:"data"`
	Error json.RawMessage `json:"error"`
}

func (p *openAI) attempt(ctx context.Context, body []byte, n int) ([][]float32, attemptResult) {
	actx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(actx, http.MethodPost, p.endpoint, bytes.NewReader(body))
	if err != nil {
		return nil, attemptResult{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	if p.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+p.apiKey)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("timed out after %v (embedding.openai.timeout): %w", p.cfg.Timeout, err)
		}
		return nil, attemptResult{err: p.redact(err), retry: true}
	}
	defer resp.Body.Close()
	raw, rerr := io.ReadAll(io.LimitReader(resp.Body, maxReplyBytes+1))
	wait, hasWait := serverWait(resp.Header, time.Now())
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		herr := &HTTPError{StatusCode: resp.StatusCode, Message: p.message(raw)}
		if resp.StatusCode >= 300 && resp.StatusCode <= 399 {
			herr.Location = p.clean(resp.Header.Get("Location"))
		}
		return nil, attemptResult{err: herr, retry: retryable(resp.StatusCode), wait: wait, hasWait: hasWait}
	}
	if rerr != nil {
		return nil, attemptResult{err: p.redact(fmt.Errorf("read reply: %w", rerr)), retry: true}
	}
	if len(raw) > maxReplyBytes {
		return nil, attemptResult{err: fmt.Errorf("reply larger than %d bytes", maxReplyBytes), retry: true}
	}
	var r embeddingsReply
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, attemptResult{err: fmt.Errorf("malformed reply (%d bytes): %w", len(raw), err), retry: true}
	}
	if len(r.Error) > 0 && string(r.Error) != "null" {
		return nil, attemptResult{err: &HTTPError{StatusCode: resp.StatusCode, Message: p.message(raw)}, retry: true, wait: wait, hasWait: hasWait}
	}
	out := make([][]float32, n)
	if len(r.Data) != n {
		return nil, attemptResult{err: fmt.Errorf("reply has %d vectors for %d texts", len(r.Data), n), retry: true}
	}
	for k, d := range r.Data {
		i := k // replies without indices are in order
		if d.Index != nil {
			i = *d.Index
		}
		switch {
		case i < 0 || i >= n || out[i] != nil:
			return nil, attemptResult{err: fmt.Errorf("reply has a bad or repeated index %d", i), retry: true}
		case len(d.Embedding) == 0 || len(d.Embedding) != len(r.Data[0].Embedding):
			return nil, attemptResult{err: fmt.Errorf("reply has vectors of %d and %d dimensions", len(r.Data[0].Embedding), len(d.Embedding)), retry: true}
		case p.cfg.Dimensions > 0 && len(d.Embedding) != p.cfg.Dimensions:
			return nil, attemptResult{err: fmt.Errorf("reply has %d dimensions, embedding.openai.dimensions is %d", len(d.Embedding), p.cfg.Dimensions)}
		case !normalize(d.Embedding):
			return nil, attemptResult{err: errors.New("reply has a non-finite value"), retry: true}
		}
		out[i] = d.Embedding
	}
	return out, attemptResult{}
}

// message is the provider's error message (or the body's start), on one
// line, key redacted, at most 300 characters.
func (p *openAI) message(raw []byte) string {
	var w struct {
		Error json.RawMessage `json:"error"`
	}
	msg := ""
	if json.Unmarshal(raw, &w) == nil && len(w.Error) > 0 {
		var e struct {
			Message string `json:"message"`
		}
		var s string
		if json.Unmarshal(w.Error, &e) == nil && e.Message != "" {
			msg = e.Message
		} else if json.Unmarshal(w.Error, &s) == nil {
			msg = s
		}
	}
	if msg == "" {
		msg = string(raw)
	}
	r := []rune(p.clean(strings.Join(strings.Fields(msg), " "))) // redact before cutting
	if len(r) > 300 {
		r = r[:300]
	}
	return string(r)
}

// clean makes server text safe for an error: valid UTF-8, no control
// characters, the API key redacted.
func (p *openAI) clean(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return -1
		}
		return r
	}, strings.ToValidUTF8(s, ""))
	if p.apiKey != "" {
		s = strings.ReplaceAll(s, p.apiKey, "[redacted]")
	}
	return s
}

// redact removes the API key from an error, should a proxy echo it.
func (p *openAI) redact(err error) error {
	if p.apiKey == "" || !strings.Contains(err.Error(), p.apiKey) {
		return err
	}
	return errors.New(p.clean(err.Error()))
}
