package httpretry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
	"unicode"
)

// maxErrorChars caps the server text (message, Location) kept in an
// HTTPError.
const maxErrorChars = 300

// HTTPError is a reply that carries an error: a non-2xx status, or a 2xx
// whose body is an error object ({"error": {...}}), as OpenRouter sends for
// upstream failures. A redirect (3xx) is one too: it is never followed and
// never retried.
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
	// Table is the config table of the endpoint ("openai",
	// "embedding.openai"), whose base_url a redirect's message names.
	Table string
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
		key := "base_url"
		if e.Table != "" {
			key = e.Table + ".base_url"
		}
		fmt.Fprintf(&b, ": redirect to %s not followed (fix %s)", loc, key)
	}
	if e.Message != "" {
		fmt.Fprintf(&b, ": %s", e.Message)
	}
	return b.String()
}

// Options are the settings of a Client.
type Options struct {
	// URL is the endpoint the JSON is POSTed to.
	URL string
	// APIKey, when not "", is sent as "Authorization: Bearer"; it is never
	// logged and is redacted from every error.
	APIKey string
	// Timeout bounds one attempt, the reply's body included.
	Timeout time.Duration
	// MaxConcurrency is the requests the caller keeps in flight: the idle
	// connections kept to the host (at least 2).
	MaxConcurrency int
	// MaxReplyBytes caps the body read; a longer reply is malformed.
	MaxReplyBytes int
	// Table is the config table of the endpoint ("openai",
	// "embedding.openai"), named in timeout and redirect errors.
	Table string
}

// Client posts JSON to one endpoint. It holds one http.Client, reused for
// every request: its Transport keeps MaxConcurrency idle connections to the
// host; it has no Client.Timeout (each attempt has its own) and follows no
// redirect, since following one would re-send the API key to wherever the
// server points (in clear text after an https→http redirect) and turn the
// POST into a GET on 301/302/303; the 3xx reply becomes an HTTPError naming
// its Location instead. A Client is safe for concurrent use.
type Client struct {
	opt  Options
	http *http.Client
}

// NewClient builds the Client of one provider.
func NewClient(opt Options) *Client {
	tr, ok := http.DefaultTransport.(*http.Transport)
	if ok {
		tr = tr.Clone()
	} else {
		tr = &http.Transport{Proxy: http.ProxyFromEnvironment, ForceAttemptHTTP2: true, IdleConnTimeout: 90 * time.Second}
	}
	tr.MaxIdleConnsPerHost = max(opt.MaxConcurrency, 2)
	tr.MaxIdleConns = max(tr.MaxIdleConns, 2*opt.MaxConcurrency)
	return &Client{opt: opt, http: &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

// CloseIdleConnections closes the connections kept for reuse.
func (c *Client) CloseIdleConnections() { c.http.CloseIdleConnections() }

// Reply is a 2xx reply: its status, its body, and the wait its headers ask
// for (kept for Refusal, should the body be an error object).
type Reply struct {
	Status  int
	Body    []byte
	Wait    time.Duration
	HasWait bool
}

// Post sends body in one attempt under Options.Timeout and reads the reply.
// It returns a 2xx reply for the caller to parse, or a Result saying what
// failed: connection errors, timeouts, a truncated or oversized body and
// the statuses Retryable names are worth another attempt; other non-2xx
// statuses are an HTTPError that is not. The caller retries (see Do).
func (c *Client) Post(ctx context.Context, body []byte) (Reply, Result) {
	actx, cancel := context.WithTimeout(ctx, c.opt.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(actx, http.MethodPost, c.opt.URL, bytes.NewReader(body))
	if err != nil {
		return Reply{}, Result{Err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	if c.opt.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.opt.APIKey)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		// Connection errors and per-attempt timeouts. *url.Error names the
		// URL, never the headers.
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("timed out after %v (%s.timeout): %w", c.opt.Timeout, c.opt.Table, err)
		}
		return Reply{}, Result{Err: c.redact(err), Retry: true}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, int64(c.opt.MaxReplyBytes)+1))
	wait, hasWait := RetryAfter(resp.Header, time.Now())
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		herr := c.httpError(resp.StatusCode, raw)
		if resp.StatusCode >= 300 && resp.StatusCode <= 399 {
			herr.Location = cutRunes(c.clean(resp.Header.Get("Location")), maxErrorChars)
		}
		return Reply{}, Result{Err: herr, Retry: Retryable(resp.StatusCode), Wait: wait, HasWait: hasWait}
	}
	if err != nil {
		// Truncated body: the connection broke or the attempt timed out mid-read.
		return Reply{}, Result{Err: c.redact(fmt.Errorf("read reply: %w", err)), Retry: true}
	}
	if len(raw) > c.opt.MaxReplyBytes {
		return Reply{}, Result{Err: fmt.Errorf("reply larger than %d bytes", c.opt.MaxReplyBytes), Retry: true}
	}
	return Reply{Status: resp.StatusCode, Body: raw, Wait: wait, HasWait: hasWait}, Result{}
}

// Refusal is the Result of a 2xx reply whose JSON holds a non-null "error"
// (the caller's parse finds it): an HTTPError, retried unless its code is a
// 4xx other than 408 and 429.
func (c *Client) Refusal(r Reply) Result {
	herr := c.httpError(r.Status, r.Body)
	retry := true
	if n, ok := parseCode(herr.Code); ok && n >= 400 && n < 500 && !Retryable(n) {
		retry = false
	}
	return Result{Err: herr, Retry: retry, Wait: r.Wait, HasWait: r.HasWait}
}

// HasError reports whether the "error" member of a reply is set.
func HasError(raw json.RawMessage) bool { return len(raw) > 0 && string(raw) != "null" }

// errorBody is an OpenAI-style error object.
type errorBody struct {
	Message string          `json:"message"`
	Code    json.RawMessage `json:"code"`
	Type    string          `json:"type"`
}

// httpError builds an HTTPError from an error reply, reading an
// OpenAI-style {"error": {...}} or {"error": "..."} object when there is
// one, else the start of the body.
func (c *Client) httpError(status int, raw []byte) *HTTPError {
	e := &HTTPError{StatusCode: status, Table: c.opt.Table}
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
	e.Message = cutRunes(strings.Join(strings.Fields(c.clean(msg)), " "), maxErrorChars)
	e.Code = cutRunes(c.clean(e.Code), 40)
	return e
}

// parseCode reads an error code such as 429 or "429".
func parseCode(code string) (int, bool) {
	var n int
	if _, err := fmt.Sscanf(code, "%d", &n); err != nil || fmt.Sprint(n) != code {
		return 0, false
	}
	return n, true
}

// clean makes server text safe for an error: valid UTF-8, no control
// characters, the API key redacted.
func (c *Client) clean(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return -1
		}
		return r
	}, strings.ToValidUTF8(s, ""))
	if c.opt.APIKey != "" {
		s = strings.ReplaceAll(s, c.opt.APIKey, "[redacted]")
	}
	return s
}

// redact removes the API key from an error, in case a server or a proxy
// echoes it.
func (c *Client) redact(err error) error {
	if c.opt.APIKey == "" || !strings.Contains(err.Error(), c.opt.APIKey) {
		return err
	}
	return errors.New(c.clean(err.Error()))
}

// cutRunes returns the first n code points of s.
func cutRunes(s string, n int) string {
	for i := range s {
		if n == 0 {
			return s[:i]
		}
		n--
	}
	return s
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
