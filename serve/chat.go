package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/recal-project/recal/router"
)

// errRequestTimeout is the cause of a request context that ran past
// serve.request_timeout.
var errRequestTimeout = errors.New("serve: request timeout")

// chat is POST /v1/chat/completions: validate, admit, run the router, answer
// (plainly or as server-sent events).
func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	ri := infoOf(r.Context())
	body, aerr := s.body(w, r)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	req, aerr := parseChat(body, s.lim)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	ri.attrs = append(ri.attrs, slog.Bool("stream", req.stream))
	if req.user != "" {
		ri.attrs = append(ri.attrs, slog.String("user", req.user))
	}
	// Admission: max_batch rows decode and max_queue wait in the backend;
	// anyone beyond is turned away now rather than queued without bound.
	select {
	case s.slots <- struct{}{}:
		defer func() { <-s.slots }()
	default:
		s.metrics.rejected.Inc()
		w.Header().Set("Retry-After", "1")
		writeError(w, &apiError{Status: http.StatusTooManyRequests, Type: typeRateLimit, Code: strp("queue_full"),
			Message: fmt.Sprintf("the server is at capacity: %d requests are decoding or queued (serve.max_batch + serve.max_queue); retry later", cap(s.slots))})
		return
	}
	// The request's context ends when the client hangs up (cancelling its
	// row and pool calls) or when serve.request_timeout runs out.
	ctx, cancel := context.WithCancel(r.Context())
	if t := s.opt.Config.RequestTimeout; t > 0 {
		ctx, cancel = context.WithTimeoutCause(r.Context(), t, errRequestTimeout)
	}
	defer cancel()
	c := completion{s: s, ri: ri, req: req, id: "chatcmpl-" + ri.id, start: time.Now()}
	if req.stream {
		c.stream(ctx, w, r)
		return
	}
	q := req.query
	q.OnCall = s.metrics.call
	res, err := s.opt.Backend.Answer(ctx, q) // blocks: queueing, decoding, pool calls
	if err != nil {
		aerr := c.failure(ctx, r, err)
		c.record(res, aerr)
		writeError(w, aerr)
		return
	}
	s.metrics.answered(res)
	u, _ := usageOf(res)
	fr := finishReason(res.Sample.End)
	resp := chatCompletion{ID: c.id, Object: "chat.completion", Created: c.start.Unix(), Model: s.opt.Name,
		Choices: []chatChoice{{Message: &assistantText{Role: "assistant", Content: &res.Answer}, FinishReason: &fr}},
		Usage:   u, Recal: c.summary(res, true)}
	w.Header().Set("X-Recal-Models", strings.Join(calledModels(res.Sample), ","))
	w.Header().Set("X-Recal-Cost-USD", formatCost(res.CostUSD))
	c.record(res, nil)
	writeJSON(w, http.StatusOK, resp)
}

// lingerClose is how long the rest of a body that will not be read is
// still received (and dropped) after the response, before its connection
// closes: closing with bytes unread makes the kernel reset the connection,
// which can destroy the response before the client reads it (net/http
// waits as long after a body over its limit).
const lingerClose = 500 * time.Millisecond

// body reads the request's body, bounded in count and time: at most
// serve.max_body_reads bodies are read at once (a request beyond them is
// answered 503 before a byte of its body is read), each within
// serve.body_timeout of its headers (observe set the connection's read
// deadline; 408 beyond it). So clients trickling their bodies hold at most
// max_body_reads buffers of max_body_bytes, each for body_timeout at most.
// A request whose body was not read in full closes its connection within
// lingerClose of its response.
func (s *Server) body(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	rc := http.NewResponseController(w)
	closeSoon := func() {
		w.Header().Set("Connection", "close")
		rc.SetReadDeadline(time.Now().Add(lingerClose))
	}
	if aerr := jsonContent(r); aerr != nil {
		closeSoon()
		return nil, aerr
	}
	select {
	case s.bodies <- struct{}{}:
	default:
		s.metrics.bodyRefused.WithLabelValues("busy").Inc()
		w.Header().Set("Retry-After", "1")
		closeSoon()
		return nil, &apiError{Status: http.StatusServiceUnavailable, Type: typeServer, Code: strp("server_busy"),
			Message: fmt.Sprintf("the server is reading %d request bodies (serve.max_body_reads); retry later", cap(s.bodies))}
	}
	s.metrics.bodyReads.Inc()
	body, aerr := readBody(w, r, s.opt.Config.MaxBodyBytes, s.opt.Config.BodyTimeout)
	s.metrics.bodyReads.Dec()
	<-s.bodies
	if aerr != nil {
		if aerr.Status == http.StatusRequestTimeout {
			s.metrics.bodyRefused.WithLabelValues("timeout").Inc()
		}
		closeSoon() // the rest of the body stays unread: no request follows it
		return nil, aerr
	}
	// The answer may take longer than the body's deadline, which would cut
	// the connection (and cancel the request) if it stayed.
	rc.SetReadDeadline(time.Time{})
	return body, nil
}

// jsonContent answers 415 to a body that is not declared plain JSON: a
// Content-Type other than application/json (missing, text/plain, a form:
// what a web page can send without a CORS preflight), a charset other than
// UTF-8, or any Content-Encoding (a gzipped body).
func jsonContent(r *http.Request) *apiError {
	unsupported := func(format string, args ...any) *apiError {
		return &apiError{Status: http.StatusUnsupportedMediaType, Type: typeInvalid, Code: strp("unsupported_media_type"),
			Message: fmt.Sprintf(format, args...)}
	}
	ct := r.Header.Get("Content-Type")
	mt, params, err := mime.ParseMediaType(ct)
	switch {
	case ct == "":
		return unsupported("no Content-Type: POST %s takes Content-Type: application/json", r.URL.Path)
	case err != nil || mt != "application/json":
		return unsupported("Content-Type %q: POST %s takes application/json", cut(ct, 100), r.URL.Path)
	case params["charset"] != "" && !strings.EqualFold(params["charset"], "utf-8"):
		return unsupported("Content-Type %q: the body must be UTF-8", cut(ct, 100))
	}
	if ce := r.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		return unsupported("Content-Encoding %q: recal reads uncompressed request bodies", cut(ce, 40))
	}
	return nil
}

// completion is one chat completion in progress.
type completion struct {
	s     *Server
	ri    *reqInfo
	req   request
	id    string
	start time.Time
}

// summary is the response's recal object (all of it, or in a stream's
// final chunk, all but the trace, which went out turn by turn).
func (c *completion) summary(res Result, withTrace bool) *recalResult {
	_, ru := usageOf(res)
	cost := roundUSD(res.CostUSD)
	rr := &recalResult{TotalCostUSD: &cost, End: res.Sample.End, Usage: ru, ModelsCalled: calledModels(res.Sample)}
	if withTrace {
		trace := make([]RoutingTurn, 0, len(res.Sample.Calls))
		for _, call := range res.Sample.Calls {
			trace = append(trace, routingTurn(call))
		}
		rr.Trace = &trace
		text := res.Sample.Text
		rr.Response = &text
	}
	return rr
}

// failure maps a backend error to the client's error.
func (c *completion) failure(ctx context.Context, r *http.Request, err error) *apiError {
	switch {
	case errors.Is(err, ErrInvalidQuery):
		return badRequest("messages", "invalid_value", "%s", strings.TrimPrefix(err.Error(), "serve: invalid query: "))
	case errors.Is(context.Cause(ctx), errRequestTimeout):
		return &apiError{Status: http.StatusGatewayTimeout, Type: typeServer, Code: strp("timeout"),
			Message: fmt.Sprintf("the request took longer than serve.request_timeout (%s)", c.s.opt.Config.RequestTimeout)}
	case r.Context().Err() != nil:
		return &apiError{Status: 499, Type: typeInvalid, Code: strp("client_closed"), Message: "the client closed the request"}
	}
	c.s.log.Error("serve: backend failed", "request_id", c.ri.id, "err", err.Error())
	return &apiError{Status: http.StatusInternalServerError, Type: typeServer, Code: strp("internal_error"),
		Message: fmt.Sprintf("the router failed (request %s; the server log has the details)", c.ri.id)}
}

// record adds the outcome to the access log line and writes the trace line.
func (c *completion) record(res Result, aerr *apiError) {
	s := c.s
	ri := c.ri
	ri.attrs = append(ri.attrs, slog.String("models_called", strings.Join(calledModels(res.Sample), ",")),
		slog.Int("calls", len(res.Sample.Calls)), slog.Float64("cost_usd", roundUSD(res.CostUSD)), slog.String("end", res.Sample.End),
		slog.Int("policy_tokens", res.PolicyCompletionTokens))
	if aerr != nil {
		ri.attrs = append(ri.attrs, slog.String("error", aerr.Message))
	}
	if s.opt.Config.LogContent {
		ri.attrs = append(ri.attrs, slog.String("question", c.req.query.Question), slog.String("answer", res.Answer))
	}
	if s.opt.Trace == nil {
		return
	}
	_, ru := usageOf(res)
	q := c.req.query
	line := RequestTrace{Time: c.start.UTC(), RequestID: ri.id, Model: s.opt.Name, User: c.req.user, Question: q.Question,
		Answer: res.Answer, Response: res.Sample.Text, Calls: res.Sample.Calls, End: res.Sample.End, Tokens: res.PolicyCompletionTokens,
		Usage: *ru, CostUSD: res.CostUSD, Status: http.StatusOK, LatencyMS: float64(time.Since(c.start).Microseconds()) / 1000,
		Request: traceRequest{Models: q.Models, MaxTurns: q.MaxTurns, MaxCostUSD: q.MaxCostUSD, Temperature: q.Sampling.Temperature,
			TopP: q.Sampling.TopP, MaxTokens: q.MaxTokens, Stream: c.req.stream}}
	if line.Calls == nil {
		line.Calls = []router.Call{}
	}
	if aerr != nil {
		line.Status, line.Error = aerr.Status, aerr.Message
	}
	b, err := json.Marshal(line)
	if err != nil {
		s.log.Error("serve: trace", "request_id", ri.id, "err", err.Error())
		return
	}
	s.traceMu.Lock()
	defer s.traceMu.Unlock()
	if _, err := s.opt.Trace.Write(append(b, '\n')); err != nil {
		s.log.Error("serve: trace", "request_id", ri.id, "err", err.Error())
	}
}

// RequestTrace is one line of --trace: a request's question, response and
// pool calls, with the field names of rollouts.jsonl's per-response records
// (question, response, calls, end, policy_tokens).
type RequestTrace struct {
	Time      time.Time     `json:"time"`
	RequestID string        `json:"request_id"`
	Model     string        `json:"model"`
	User      string        `json:"user,omitempty"`
	Question  string        `json:"question"`
	Answer    string        `json:"answer"`
	Response  string        `json:"response"`
	Calls     []router.Call `json:"calls"`
	End       string        `json:"end"`
	Tokens    int           `json:"policy_tokens"`
	Usage     recalUsage    `json:"usage"`
	CostUSD   float64       `json:"cost_usd"`
	Status    int           `json:"status"`
	Error     string        `json:"error,omitempty"`
	LatencyMS float64       `json:"latency_ms"`
	Request   traceRequest  `json:"request"`
}

// traceRequest is what the client asked for.
type traceRequest struct {
	Models      []string `json:"models,omitempty"`
	MaxTurns    int      `json:"max_turns,omitempty"`
	MaxCostUSD  float64  `json:"max_cost_usd,omitempty"`
	Temperature float64  `json:"temperature"`
	TopP        float64  `json:"top_p,omitempty"`
	MaxTokens   int      `json:"max_tokens,omitempty"`
	Stream      bool     `json:"stream"`
}

// formatCost writes USD with 12 decimals at most, without trailing zeros
// (no float noise such as 0.00007000000000000001), as roundUSD does.
func formatCost(usd float64) string {
	s := strings.TrimRight(strconv.FormatFloat(usd, 'f', 12, 64), "0")
	return strings.TrimSuffix(s, ".")
}

// stream answers as server-sent events: a chunk per pool call as its reply
// arrives (its trace entry in "recal", the delta empty), then the answer
// (the first delta with role "assistant"), a chunk with finish_reason and
// the summary, a usage chunk if asked for, and "data: [DONE]". The headers
// go out first, so they cannot carry the cost: the final chunk does.
func (c *completion) stream(ctx context.Context, w http.ResponseWriter, r *http.Request) {
	s := c.s
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc.Flush()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	var arrived []router.Call
	wake := make(chan struct{}, 1)
	q := c.req.query
	q.OnCall = func(call router.Call) { // on the backend's goroutine: never block
		s.metrics.call(call)
		mu.Lock()
		arrived = append(arrived, call)
		mu.Unlock()
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	type outcome struct {
		res Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := s.opt.Backend.Answer(ctx, q)
		done <- outcome{res, err}
	}()

	send := func(ch chatChunk) error {
		ch.ID, ch.Object, ch.Created, ch.Model = c.id, "chat.completion.chunk", c.start.Unix(), s.opt.Name
		b, err := json.Marshal(ch)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return err
		}
		return rc.Flush()
	}
	sent := 0
	sendCalls := func() error {
		mu.Lock()
		calls := arrived
		arrived = nil
		mu.Unlock()
		for _, call := range calls {
			if err := send(chatChunk{Choices: []chatChoice{{Delta: &assistantText{}}}, Recal: turnChunk(call)}); err != nil {
				return err
			}
			sent++
		}
		return nil
	}
	var out outcome
	for running := true; running; {
		select {
		case <-wake:
			if err := sendCalls(); err != nil { // the client is gone: stop its row
				cancel()
				out = <-done
				c.record(out.res, &apiError{Status: 499, Message: "the client closed the stream: " + err.Error()})
				return
			}
		case out = <-done:
			running = false
		}
	}
	err := sendCalls()
	if out.err != nil {
		aerr := c.failure(ctx, r, out.err)
		c.record(out.res, aerr)
		if err == nil {
			b, _ := json.Marshal(map[string]*apiError{"error": aerr})
			fmt.Fprintf(w, "data: %s\n\n", b)
			rc.Flush()
		}
		return
	}
	res := out.res
	s.metrics.answered(res)
	// Calls the backend did not report as they came (a backend without
	// OnCall support) go out now, in order.
	for _, call := range res.Sample.Calls[min(sent, len(res.Sample.Calls)):] {
		if err == nil {
			err = send(chatChunk{Choices: []chatChoice{{Delta: &assistantText{}}}, Recal: turnChunk(call)})
		}
	}
	empty := ""
	fr := finishReason(res.Sample.End)
	u, _ := usageOf(res)
	steps := []chatChunk{
		{Choices: []chatChoice{{Delta: &assistantText{Role: "assistant", Content: &empty}}}},
		{Choices: []chatChoice{{Delta: &assistantText{Content: &res.Answer}}}},
		{Choices: []chatChoice{{Delta: &assistantText{}, FinishReason: &fr}}, Recal: c.summary(res, false)},
	}
	if res.Answer == "" {
		steps = append(steps[:1], steps[2])
	}
	if c.req.includeUsage {
		steps = append(steps, chatChunk{Choices: []chatChoice{}, Usage: u})
	}
	for _, ch := range steps {
		if err == nil {
			err = send(ch)
		}
	}
	if err == nil {
		_, err = fmt.Fprint(w, "data: [DONE]\n\n")
		if err == nil {
			err = rc.Flush()
		}
	}
	if err != nil {
		c.record(res, &apiError{Status: 499, Message: "the client closed the stream: " + err.Error()})
		return
	}
	c.record(res, nil)
	markComplete(w)
}

// turnChunk is the recal object of a streamed turn: its trace entry.
func turnChunk(call router.Call) *recalResult {
	return &recalResult{Trace: &[]RoutingTurn{routingTurn(call)}}
}
