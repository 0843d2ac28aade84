package serve

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/recal-project/recal/router"
)

// apiError is an error in OpenAI's shape:
// {"error":{"message","type","param","code"}}, with its HTTP status.
type apiError struct {
	Status  int     `json:"-"`
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func (e *apiError) Error() string { return e.Message }

// OpenAI's error types.
const (
	typeInvalid   = "invalid_request_error"
	typeRateLimit = "rate_limit_error"
	typeServer    = "server_error"
)

func strp(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// badRequest is a 400 naming the parameter at fault.
func badRequest(param, code, format string, args ...any) *apiError {
	return &apiError{Status: http.StatusBadRequest, Message: fmt.Sprintf(format, args...), Type: typeInvalid,
		Param: strp(param), Code: strp(code)}
}

// chatRequest is the body of POST /v1/chat/completions. Parameters recal
// does not implement are unknown fields, answered 400 by name, except the
// few accepted at their neutral value.
type chatRequest struct {
	Model               string         `json:"model"`
	Messages            []chatMessage  `json:"messages"`
	Temperature         *float64       `json:"temperature"`
	TopP                *float64       `json:"top_p"`
	MaxTokens           *int           `json:"max_tokens"`
	MaxCompletionTokens *int           `json:"max_completion_tokens"`
	Stream              bool           `json:"stream"`
	StreamOptions       *streamOptions `json:"stream_options"`
	User                string         `json:"user"`
	N                   *int           `json:"n"`
	PresencePenalty     *float64       `json:"presence_penalty"`
	FrequencyPenalty    *float64       `json:"frequency_penalty"`
	Logprobs            *bool          `json:"logprobs"`
	Recal               *recalRequest  `json:"recal"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	Name    string          `json:"name"`
	// Assistant and tool messages of earlier turns may carry these; they are
	// accepted and ignored like the rest of the history.
	ToolCalls  json.RawMessage `json:"tool_calls"`
	ToolCallID string          `json:"tool_call_id"`
	Refusal    json.RawMessage `json:"refusal"`
}

// recalRequest is the body's "recal" object: per-request routing control.
type recalRequest struct {
	// Models restricts the pool models the router may call (and that its
	// prompt lists).
	Models []string `json:"models"`
	// MaxTurns caps the pool calls, at most router.max_turns.
	MaxTurns *int `json:"max_turns"`
	// MaxCostUSD stops pool calls once this much is spent.
	MaxCostUSD *float64 `json:"max_cost_usd"`
}

// request is a validated chat request.
type request struct {
	query        Query
	stream       bool
	includeUsage bool
	user         string
}

// limits are what parseChat checks a request against.
type limits struct {
	name             string            // the router's model id
	models           map[string]string // lowercased pool name → pool name
	modelList        string            // the pool names, for error messages
	maxTurns         int               // router.max_turns
	maxQuestionChars int
}

// readBody reads a request body of at most limit bytes (413 beyond) that is
// valid UTF-8 (400 otherwise) before the connection's read deadline, which
// is timeout after the headers (408 after it).
func readBody(w http.ResponseWriter, r *http.Request, limit int64, timeout time.Duration) ([]byte, *apiError) {
	tooLarge := &apiError{Status: http.StatusRequestEntityTooLarge, Type: typeInvalid, Code: strp("request_too_large"),
		Message: fmt.Sprintf("request body is larger than serve.max_body_bytes (%d bytes)", limit)}
	if r.ContentLength > limit {
		return nil, tooLarge
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return nil, tooLarge
	case errors.Is(err, os.ErrDeadlineExceeded):
		return nil, &apiError{Status: http.StatusRequestTimeout, Type: typeInvalid, Code: strp("body_timeout"),
			Message: fmt.Sprintf("the request body did not arrive within serve.body_timeout (%s)", timeout)}
	case err != nil:
		return nil, &apiError{Status: http.StatusBadRequest, Type: typeInvalid, Message: "reading the request body: " + err.Error()}
	case !utf8.Valid(body):
		return nil, badRequest("", "invalid_encoding", "the request body is not valid UTF-8")
	}
	return body, nil
}

// parseChat decodes and validates a chat completions body.
func parseChat(body []byte, lim limits) (request, *apiError) {
	var cr chatRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cr); err != nil {
		return request{}, jsonError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return request{}, badRequest("", "invalid_json", "the request body holds more than one JSON value")
	}
	if cr.Model != "" && cr.Model != lim.name {
		return request{}, &apiError{Status: http.StatusNotFound, Type: typeInvalid, Param: strp("model"), Code: strp("model_not_found"),
			Message: fmt.Sprintf("the model %q does not exist: this server is the router %q (GET /v1/models lists it and the pool models it calls; choose pool models with recal.models)", cut(cr.Model, 100), lim.name)}
	}
	question, aerr := lastUserText(cr.Messages, lim.maxQuestionChars)
	if aerr != nil {
		return request{}, aerr
	}
	req := request{query: Query{Question: question}, stream: cr.Stream, user: cr.User}
	if cr.N != nil && *cr.N != 1 {
		return request{}, badRequest("n", "unsupported_value", "n = %d: recal returns one choice (n must be 1)", *cr.N)
	}
	if cr.Temperature != nil {
		t := *cr.Temperature
		if !(t >= 0 && t <= 2) {
			return request{}, badRequest("temperature", "invalid_value", "temperature = %g: must be in [0, 2] (0 is greedy)", t)
		}
		req.query.Sampling.Temperature = t
	}
	if cr.TopP != nil {
		p := *cr.TopP
		if !(p > 0 && p <= 1) {
			return request{}, badRequest("top_p", "invalid_value", "top_p = %g: must be in (0, 1]", p)
		}
		req.query.Sampling.TopP = p
	}
	for _, mt := range []struct {
		name string
		v    *int
	}{{"max_tokens", cr.MaxTokens}, {"max_completion_tokens", cr.MaxCompletionTokens}} {
		if mt.v == nil {
			continue
		}
		if *mt.v < 1 {
			return request{}, badRequest(mt.name, "invalid_value", "%s = %d: must be ≥ 1", mt.name, *mt.v)
		}
		if req.query.MaxTokens == 0 || *mt.v < req.query.MaxTokens {
			req.query.MaxTokens = *mt.v
		}
	}
	for _, p := range []struct {
		name string
		v    *float64
	}{{"presence_penalty", cr.PresencePenalty}, {"frequency_penalty", cr.FrequencyPenalty}} {
		if p.v != nil && *p.v != 0 {
			return request{}, badRequest(p.name, "unsupported_value", "%s = %g: recal supports only 0", p.name, *p.v)
		}
	}
	if cr.Logprobs != nil && *cr.Logprobs {
		return request{}, badRequest("logprobs", "unsupported_value", "logprobs: recal does not return log-probabilities")
	}
	if cr.StreamOptions != nil {
		if !cr.Stream {
			return request{}, badRequest("stream_options", "invalid_value", "stream_options is only allowed when stream is true")
		}
		req.includeUsage = cr.StreamOptions.IncludeUsage
	}
	if utf8.RuneCountInString(cr.User) > 256 {
		return request{}, badRequest("user", "invalid_value", "user: at most 256 characters")
	}
	if rc := cr.Recal; rc != nil {
		if rc.Models != nil {
			if len(rc.Models) == 0 {
				return request{}, badRequest("recal.models", "invalid_value", "recal.models is empty: name at least one pool model (%s), or leave it out for all", lim.modelList)
			}
			seen := map[string]bool{}
			for _, m := range rc.Models {
				name, ok := lim.models[strings.ToLower(strings.TrimSpace(m))]
				if !ok {
					return request{}, badRequest("recal.models", "model_not_found", "recal.models: unknown model %q (the pool has: %s)", cut(m, 100), lim.modelList)
				}
				if !seen[name] {
					seen[name] = true
					req.query.Models = append(req.query.Models, name)
				}
			}
		}
		if rc.MaxTurns != nil {
			if *rc.MaxTurns < 1 || *rc.MaxTurns > lim.maxTurns {
				return request{}, badRequest("recal.max_turns", "invalid_value", "recal.max_turns = %d: must be in [1, %d] (router.max_turns)", *rc.MaxTurns, lim.maxTurns)
			}
			req.query.MaxTurns = *rc.MaxTurns
		}
		if rc.MaxCostUSD != nil {
			c := *rc.MaxCostUSD
			if !(c > 0) || math.IsInf(c, 0) {
				return request{}, badRequest("recal.max_cost_usd", "invalid_value", "recal.max_cost_usd = %g: must be > 0 (leave it out for no limit)", c)
			}
			req.query.MaxCostUSD = c
		}
	}
	return req, nil
}

// jsonError explains a decoding error, naming the field when it can.
func jsonError(err error) *apiError {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	msg := err.Error()
	switch {
	case errors.As(err, &se):
		return badRequest("", "invalid_json", "the request body is not valid JSON: %s (at byte %d)", strings.TrimPrefix(msg, "json: "), se.Offset)
	case errors.As(err, &te):
		field, what := te.Field, te.Field
		if what == "" {
			what = "the request body"
		}
		kind := jsonKind(te.Type.Kind().String())
		if num, ok := strings.CutPrefix(te.Value, "number "); ok && kind == "number" {
			// A number that does not fit the field: a fraction, an
			// exponent or too many digits for an integer, or past the
			// range of a 64-bit float.
			if te.Type.Kind() == reflect.Float64 {
				return badRequest(field, "invalid_value", "%s = %s: out of the range of a 64-bit float", cut(what, 100), cut(num, 40))
			}
			return badRequest(field, "invalid_value", "%s = %s: want a whole number written without a fraction or exponent, at most %d", cut(what, 100), cut(num, 40), math.MaxInt64)
		}
		return badRequest(field, "invalid_type", "%s: want a JSON %s, got %s", cut(what, 100), kind, cut(te.Value, 40))
	case errors.Is(err, io.EOF):
		return badRequest("", "invalid_json", "the request body is empty: want a JSON object")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badRequest("", "invalid_json", "the request body is not valid JSON: unexpected end")
	}
	if name, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		name, _ = strconv.Unquote(name)
		return badRequest(name, "unsupported_parameter", "unsupported parameter %q (recal implements model, messages, temperature, top_p, max_tokens, max_completion_tokens, stream, stream_options, user, n = 1 and the recal object)", cut(name, 100))
	}
	return badRequest("", "invalid_json", "the request body is not a valid chat completion request: %s", strings.TrimPrefix(msg, "json: "))
}

func jsonKind(k string) string {
	switch k {
	case "int", "int64", "float64":
		return "number"
	case "slice":
		return "array"
	case "struct", "map", "ptr":
		return "object"
	}
	return k
}

// lastUserText returns the text of the last user message: a string, or the
// concatenated text parts of an array.
func lastUserText(msgs []chatMessage, maxChars int) (string, *apiError) {
	if len(msgs) == 0 {
		return "", badRequest("messages", "invalid_value", "messages is empty: want at least one user message (the question)")
	}
	last := -1
	for i, m := range msgs {
		switch m.Role {
		case "user":
			last = i
		case "system", "developer", "assistant", "tool", "function":
		default:
			return "", badRequest(fmt.Sprintf("messages[%d].role", i), "invalid_value", "messages[%d].role = %q: want user, system, developer, assistant or tool", i, cut(m.Role, 40))
		}
	}
	if last < 0 {
		return "", badRequest("messages", "invalid_value", "messages holds no user message: the last user message is the question")
	}
	param := fmt.Sprintf("messages[%d].content", last)
	var text string
	raw := bytes.TrimSpace(msgs[last].Content)
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return "", badRequest(param, "invalid_value", "%s is missing", param)
	case raw[0] == '"':
		if err := json.Unmarshal(raw, &text); err != nil {
			return "", badRequest(param, "invalid_type", "%s: %v", param, err)
		}
	case raw[0] == '[':
		var parts []struct {
			Type string  `json:"type"`
			Text *string `json:"text"`
		}
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", badRequest(param, "invalid_type", "%s: want a string or an array of text parts", param)
		}
		var texts []string
		for j, p := range parts {
			if p.Type != "text" || p.Text == nil {
				return "", badRequest(fmt.Sprintf("%s[%d]", param, j), "unsupported_value", "%s[%d]: type %q: recal reads text parts only", param, j, cut(p.Type, 40))
			}
			texts = append(texts, *p.Text)
		}
		text = strings.Join(texts, "\n")
	default:
		return "", badRequest(param, "invalid_type", "%s: want a string or an array of text parts", param)
	}
	text = strings.TrimSpace(text)
	if text == "" {
		return "", badRequest(param, "invalid_value", "%s is empty: the last user message is the question", param)
	}
	if n := utf8.RuneCountInString(text); n > maxChars {
		return "", badRequest(param, "question_too_long", "the question has %d characters; serve.max_question_chars allows %d", n, maxChars)
	}
	return text, nil
}

// cut shortens an untrusted string quoted in an error message.
func cut(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n]) + "…"
}

// Response bodies.

type chatCompletion struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"`
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	Choices           []chatChoice `json:"choices"`
	Usage             *usage       `json:"usage"`
	SystemFingerprint *string      `json:"system_fingerprint"`
	Recal             *recalResult `json:"recal,omitempty"`
}

type chatChoice struct {
	Index        int            `json:"index"`
	Message      *assistantText `json:"message,omitempty"`
	Delta        *assistantText `json:"delta,omitempty"`
	Logprobs     *struct{}      `json:"logprobs"`
	FinishReason *string        `json:"finish_reason"`
}

// assistantText is a message or a delta. In a delta every field may be
// absent (an empty delta is {}).
type assistantText struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
	Refusal *string `json:"refusal,omitempty"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// chatChunk is one server-sent event of a streamed completion.
type chatChunk struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"`
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	Choices           []chatChoice `json:"choices"`
	Usage             *usage       `json:"usage,omitempty"`
	SystemFingerprint *string      `json:"system_fingerprint"`
	Recal             *recalResult `json:"recal,omitempty"`
}

// recalResult is the response's "recal" object; in a streamed turn chunk
// only Trace is set (that turn's entry).
type recalResult struct {
	// Trace is the router's pool calls, turn by turn ([] when none; in a
	// streamed turn chunk, that turn's entry; absent from the final chunk).
	Trace *[]RoutingTurn `json:"trace,omitempty"`
	// TotalCostUSD is the pool calls' cost at list prices.
	TotalCostUSD *float64 `json:"total_cost_usd,omitempty"`
	// End says why the router stopped: "answer", "eos", "length", ...
	End string `json:"end,omitempty"`
	// Usage breaks down the response's usage into policy and pool tokens.
	Usage *recalUsage `json:"usage,omitempty"`
	// ModelsCalled are the distinct pool models called, in call order.
	ModelsCalled []string `json:"models_called,omitempty"`
	// Response is the router's whole output: the policy's text with the
	// <information> blocks of the pool replies.
	Response *string `json:"response,omitempty"`
}

type recalUsage struct {
	PolicyPromptTokens     int `json:"policy_prompt_tokens"`
	PolicyCompletionTokens int `json:"policy_completion_tokens"`
	PoolPromptTokens       int `json:"pool_prompt_tokens"`
	PoolCompletionTokens   int `json:"pool_completion_tokens"`
}

// RoutingTurn is one routing turn of a response's recal.trace: a <search>
// the policy wrote and the pool's answer to it.
type RoutingTurn struct {
	// Turn counts the policy's <search> actions from 0.
	Turn int `json:"turn"`
	// Model is the pool model called (or, when Failed with no call made,
	// the name the policy wrote).
	Model string `json:"model"`
	// SubQuery is what the policy asked the model.
	SubQuery string `json:"sub_query"`
	// LatencyMS is the call's wall time in milliseconds.
	LatencyMS float64 `json:"latency_ms"`
	// PromptTokens and CompletionTokens are the call's tokens.
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	// CostUSD is the call's cost at list prices.
	CostUSD float64 `json:"cost_usd"`
	// Cached is true when the reply came from the pool's cache.
	Cached bool `json:"cached"`
	// Failed is true when no reply was had; Failure then is the text the
	// policy saw instead.
	Failed  bool   `json:"failed"`
	Failure string `json:"failure,omitempty"`
	// Unknown is true when the policy named no model it may call, and
	// Refused when recal.max_cost_usd was spent: no call was made.
	Unknown bool `json:"unknown,omitempty"`
	Refused bool `json:"refused,omitempty"`
}

// routingTurn converts a pool call.
func routingTurn(c router.Call) RoutingTurn {
	e := RoutingTurn{Turn: c.Turn, Model: c.Model, SubQuery: c.Query, LatencyMS: float64(c.Latency.Microseconds()) / 1000,
		CostUSD: roundUSD(c.Cost), Cached: c.Cached, Failed: c.Failed,
		Unknown: c.Unknown, Refused: c.Refused}
	e.PromptTokens, e.CompletionTokens = c.PromptTokens, c.CompletionTokens
	if c.Failed {
		e.Failure = c.Reply
	}
	return e
}

// roundUSD rounds a cost to 12 decimals (a millionth of a micro-dollar), so
// sums of prices print as 0.0000068, not 6.800000000000001e-06.
func roundUSD(usd float64) float64 { return math.Round(usd*1e12) / 1e12 }

// finishReason maps why the router stopped to OpenAI's finish_reason.
func finishReason(end string) string {
	switch end {
	case "answer", "eos":
		return "stop"
	}
	return "length"
}

// usageOf sums policy and pool tokens.
func usageOf(res Result) (*usage, *recalUsage) {
	ru := &recalUsage{PolicyPromptTokens: res.PolicyPromptTokens, PolicyCompletionTokens: res.PolicyCompletionTokens,
		PoolPromptTokens: res.PoolPromptTokens, PoolCompletionTokens: res.PoolCompletionTokens}
	u := &usage{PromptTokens: ru.PolicyPromptTokens + ru.PoolPromptTokens, CompletionTokens: ru.PolicyCompletionTokens + ru.PoolCompletionTokens}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u, ru
}

// calledModels are the distinct pool models called, in call order.
func calledModels(s router.Sample) []string {
	var out []string
	for _, m := range s.CalledModels() {
		if !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	return out
}
