package embed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/recal-project/recal/internal/httpretry"
)

// maxReplyBytes caps the body read from the endpoint (64 MiB: 2048 vectors
// of 3072 floats as JSON text fit).
const maxReplyBytes = 64 << 20

// HTTPError is a reply of the endpoint that carries an error: a non-2xx
// status, or a 2xx whose body is an error object. A redirect is one too: it
// is never followed. Its fields are StatusCode, Code, Location and Message
// (the start of the provider's message, API key redacted).
type HTTPError = httpretry.HTTPError

// openAI is the "openai" provider: POST base_url + "/embeddings" with
// {"model", "input": [texts], "encoding_format": "float"} (and
// "dimensions" when set), the OpenAI embeddings API that vLLM, TEI,
// Ollama, NVIDIA NIM and others serve too.
//
// Texts are looked up in memory, then on disk (diskCache); the rest, each
// distinct text once, go in requests of batch_size texts, at most
// max_concurrency in flight (errgroup). A request is retried (httpretry.Do)
// on 408, 429, 5xx, connection errors, timeouts (timeout per attempt) and
// malformed replies, up to max_retries times, waiting Retry-After (or
// Retry-After-Ms) when the server sends it and an exponential backoff with
// jitter otherwise, and giving up at once when ctx ends. Other statuses
// fail at once. One http.Client (httpretry.Client), reused; it follows no
// redirect (that would send the key wherever the server points). The API
// key is read once, sent only in the Authorization header and redacted
// from every error; nothing logs it.
// Replies are checked: one vector per text, indices in range, one length,
// finite values; vectors are scaled to unit length.
type openAI struct {
	cfg      OpenAIConfig
	base     string
	client   *httpretry.Client // holds the API key
	retry    httpretry.Policy  // max_retries, retry_base, retry_max
	disk     *diskCache        // nil: memory only
	readOnly bool
	memo     *memo
	log      *slog.Logger
}

func newOpenAI(cfg Config, env Env) (Embedder, error) {
	o := cfg.OpenAI
	apiKey := ""
	if o.APIKeyEnv != "" {
		key, ok := env.LookupEnv(o.APIKeyEnv)
		if !ok || strings.TrimSpace(key) == "" {
			return nil, fmt.Errorf("embed: environment variable %s (embedding.openai.api_key_env) is not set", o.APIKeyEnv)
		}
		apiKey = strings.TrimSpace(key)
	}
	disk, err := openDisk(env.CacheDir, cfg.Cache, env.Log)
	if err != nil {
		return nil, err
	}
	base := strings.TrimRight(o.BaseURL, "/")
	client := httpretry.NewClient(httpretry.Options{URL: base + "/embeddings", APIKey: apiKey, Timeout: o.Timeout,
		MaxConcurrency: o.MaxConcurrency, MaxReplyBytes: maxReplyBytes, Table: "embedding.openai"})
	return &openAI{cfg: o, base: base, client: client, disk: disk, memo: &memo{}, log: env.Log,
		readOnly: cfg.Cache == CacheReadOnly,
		retry:    httpretry.Policy{Retries: o.retries(), Base: o.RetryBase, Max: o.RetryMax}}, nil
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
	vs, _, err := httpretry.Do(ctx, p.retry, fmt.Sprintf("embed: openai %q", p.cfg.Model),
		func() ([][]float32, httpretry.Result) { return p.attempt(ctx, raw, len(texts)) },
		func(next int, wait time.Duration, err error) {
			p.log.Warn("embed: retrying", "model", p.cfg.Model, "attempt", next, "wait", wait, "err", err.Error())
		})
	return vs, err
}

// embeddingsReply is the part of the reply read.
type embeddingsReply struct {
	Data []struct {
		Index     *int      `json:"index"`
		Embedding []float32 `json:"embedding"`
	} `json:"data"`
	Error json.RawMessage `json:"error"`
}

// attempt sends one batch in one request (httpretry.Client.Post) and
// checks the reply.
func (p *openAI) attempt(ctx context.Context, body []byte, n int) ([][]float32, httpretry.Result) {
	reply, res := p.client.Post(ctx, body)
	if res.Err != nil {
		return nil, res
	}
	var r embeddingsReply
	if err := json.Unmarshal(reply.Body, &r); err != nil {
		return nil, httpretry.Result{Err: fmt.Errorf("malformed reply (%d bytes): %w", len(reply.Body), err), Retry: true}
	}
	if httpretry.HasError(r.Error) {
		return nil, p.client.Refusal(reply)
	}
	out := make([][]float32, n)
	if len(r.Data) != n {
		return nil, httpretry.Result{Err: fmt.Errorf("reply has %d vectors for %d texts", len(r.Data), n), Retry: true}
	}
	for k, d := range r.Data {
		i := k // replies without indices are in order
		if d.Index != nil {
			i = *d.Index
		}
		switch {
		case i < 0 || i >= n || out[i] != nil:
			return nil, httpretry.Result{Err: fmt.Errorf("reply has a bad or repeated index %d", i), Retry: true}
		case len(d.Embedding) == 0 || len(d.Embedding) != len(r.Data[0].Embedding):
			return nil, httpretry.Result{Err: fmt.Errorf("reply has vectors of %d and %d dimensions", len(r.Data[0].Embedding), len(d.Embedding)), Retry: true}
		case p.cfg.Dimensions > 0 && len(d.Embedding) != p.cfg.Dimensions:
			return nil, httpretry.Result{Err: fmt.Errorf("reply has %d dimensions, embedding.openai.dimensions is %d", len(d.Embedding), p.cfg.Dimensions)}
		case !normalize(d.Embedding):
			return nil, httpretry.Result{Err: errors.New("reply has a non-finite value"), Retry: true}
		}
		out[i] = d.Embedding
	}
	return out, httpretry.Result{}
}
