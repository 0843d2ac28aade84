// Package serve is `recal serve`: an HTTP server that answers questions
// with a routing policy, in the OpenAI chat completions wire format, so the
// official SDKs and any OpenAI-compatible client can call it.
//
// Endpoints: POST /v1/chat/completions (plain and streamed), GET /v1/models,
// GET /healthz, GET /readyz and GET /metrics (Prometheus). The policy and its
// batching live behind Backend (rollout.Service); this package does the
// HTTP: validation, admission (at most max_batch + max_queue requests in
// flight, 429 beyond; at most max_body_reads bodies being read, each within
// body_timeout), authentication, limits, timeouts, logs, traces, metrics
// and a graceful drain.
package serve

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/llmpool"
)

// ErrDrainTimeout: requests were still running when serve.drain_timeout
// ran out; their connections were closed.
var ErrDrainTimeout = errors.New("serve: drain timeout: requests in flight were cut")

// Options configure a Server.
type Options struct {
	// Config is the [serve] table.
	Config config.Serve
	// Name is the router's model id, e.g. "recal-<checkpoint folder>".
	Name string
	// Models are the pool models requests may call, in pool order.
	Models []llmpool.ModelInfo
	// MaxTurns is router.max_turns, the most pool calls a request may ask for.
	MaxTurns int
	// APIKey is the bearer token clients must send to /v1/ and, unless
	// Config.MetricsOpen, to /metrics; "" means none.
	APIKey string
	// MetricsListener serves GET /metrics alone when Config.MetricsAddr is
	// set (it is then required, and closed by Serve); nil otherwise.
	MetricsListener net.Listener
	// Backend answers the questions.
	Backend Backend
	// Log receives the access log and errors; nil discards them.
	Log *slog.Logger
	// Trace, when not nil, gets one JSON line per chat completion (see
	// RequestTrace); writes are serialised.
	Trace io.Writer
}

// Server is the HTTP server. Create it with New.
type Server struct {
	opt     Options
	log     *slog.Logger
	lim     limits
	keyHash [32]byte      // SHA-256 of APIKey, compared in constant time
	slots   chan struct{} // requests admitted: max_batch + max_queue
	bodies  chan struct{} // request bodies being read: max_body_reads
	ready   atomic.Bool
	metrics *metrics
	handler http.Handler
	// metricsOnly serves /metrics alone, on MetricsListener; nil without one.
	metricsOnly http.Handler
	created     int64

	traceMu sync.Mutex

	// handlers counts requests in flight, so Serve returns only after the
	// last handler (and the backend work it waits on) has returned.
	handlers sync.WaitGroup
}

// New checks opt and builds the server; it is not ready (GET /readyz answers
// 503) until SetReady(true).
func New(opt Options) (*Server, error) {
	if opt.Backend == nil {
		return nil, fmt.Errorf("serve: no backend")
	}
	if err := opt.Config.Validate(); err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	if opt.Name == "" {
		return nil, fmt.Errorf("serve: the router has no name")
	}
	switch {
	case opt.Config.MetricsAddr != "" && opt.MetricsListener == nil:
		return nil, fmt.Errorf("serve: serve.metrics_addr = %q but no listener for it (Options.MetricsListener)", opt.Config.MetricsAddr)
	case opt.Config.MetricsAddr == "" && opt.MetricsListener != nil:
		return nil, fmt.Errorf("serve: a metrics listener, but serve.metrics_addr is empty (/metrics is served on serve.addr)")
	}
	if opt.Log == nil {
		opt.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s := &Server{opt: opt, log: opt.Log, slots: make(chan struct{}, opt.Config.MaxBatch+opt.Config.MaxQueue),
		bodies: make(chan struct{}, opt.Config.MaxBodyReads), created: time.Now().Unix()}
	s.lim = limits{name: opt.Name, models: map[string]string{}, maxTurns: opt.MaxTurns, maxQuestionChars: opt.Config.MaxQuestionChars}
	var names []string
	for _, m := range opt.Models {
		s.lim.models[strings.ToLower(m.Name)] = m.Name
		names = append(names, m.Name)
	}
	s.lim.modelList = strings.Join(names, ", ")
	if opt.APIKey != "" {
		s.keyHash = sha256.Sum256([]byte(opt.APIKey))
	}
	s.metrics = newMetrics(opt.Backend, names)

	mux := http.NewServeMux()
	mux.Handle("/v1/chat/completions", s.only(http.MethodPost, s.auth(http.HandlerFunc(s.chat))))
	mux.Handle("/v1/models", s.only(http.MethodGet, s.auth(http.HandlerFunc(s.models))))
	mux.Handle("/v1/models/{id}", s.only(http.MethodGet, s.auth(http.HandlerFunc(s.model))))
	mux.Handle("/healthz", s.only(http.MethodGet, http.HandlerFunc(s.healthz)))
	mux.Handle("/readyz", s.only(http.MethodGet, http.HandlerFunc(s.readyz)))
	// /metrics needs the API key (when one is set) unless metrics_open,
	// wherever it is served.
	metricsH := s.only(http.MethodGet, s.metrics.handler())
	if !opt.Config.MetricsOpen {
		metricsH = s.auth(metricsH)
	}
	endpoints := "POST /v1/chat/completions, GET /v1/models, /healthz, /readyz, /metrics"
	if opt.MetricsListener == nil {
		mux.Handle("/metrics", metricsH)
	} else {
		endpoints = "POST /v1/chat/completions, GET /v1/models, /healthz, /readyz; /metrics is on serve.metrics_addr"
		only := http.NewServeMux()
		only.Handle("/metrics", metricsH)
		only.Handle("/", notFound("GET /metrics"))
		s.metricsOnly = s.observe(only)
	}
	mux.Handle("/", notFound(endpoints))
	s.handler = s.observe(s.guard(mux))
	return s, nil
}

// guard refuses what a web browser sends on behalf of a page the user
// opened, before any other check: a request carrying an Origin header not
// in serve.allowed_origins, and one addressed to a Host not in
// serve.allowed_hosts (when set; a DNS-rebound name). Both are answered
// 403. A listed origin gets CORS headers, and its preflight requests
// (OPTIONS with Access-Control-Request-Method) 204.
func (s *Server) guard(h http.Handler) http.Handler {
	origins := map[string]bool{}
	for _, o := range s.opt.Config.AllowedOrigins {
		origins[strings.ToLower(o)] = true
	}
	hosts := map[string]bool{}
	for _, h := range s.opt.Config.AllowedHosts {
		hosts[strings.ToLower(strings.Trim(h, "[]"))] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(hosts) > 0 {
			host := r.Host
			if h, _, err := net.SplitHostPort(host); err == nil {
				host = h
			}
			if !hosts[strings.ToLower(strings.Trim(host, "[]"))] {
				writeError(w, &apiError{Status: http.StatusForbidden, Type: typeInvalid, Code: strp("host_not_allowed"),
					Message: fmt.Sprintf("Host %q is not in serve.allowed_hosts", cut(r.Host, 100))})
				return
			}
		}
		if vs, sent := r.Header["Origin"]; sent {
			origin := strings.Join(vs, ",")
			if !origins[strings.ToLower(origin)] {
				writeError(w, &apiError{Status: http.StatusForbidden, Type: typeInvalid, Code: strp("origin_not_allowed"),
					Message: fmt.Sprintf("requests from web pages are refused: Origin %q is not in serve.allowed_origins", cut(origin, 100))})
				return
			}
			w.Header().Set("Access-Control-Allow-Origin", origin)
			w.Header().Add("Vary", "Origin")
			if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
				w.Header().Set("Access-Control-Allow-Methods", "GET, POST")
				w.Header().Set("Access-Control-Allow-Headers", "Authorization, Content-Type")
				w.Header().Set("Access-Control-Max-Age", "600")
				w.WriteHeader(http.StatusNoContent)
				markComplete(w)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// notFound answers 404 naming the endpoints served.
func notFound(endpoints string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{Status: http.StatusNotFound, Type: typeInvalid, Code: strp("not_found"),
			Message: fmt.Sprintf("no endpoint %s %s (recal serves %s)", cut(r.Method, 20), cut(r.URL.Path, 100), endpoints)})
	})
}

// Handler is the server's root handler (for httptest or another listener).
func (s *Server) Handler() http.Handler { return s.handler }

// SetReady says whether the backend is running: GET /readyz answers 200
// only when it is.
func (s *Server) SetReady(ok bool) { s.ready.Store(ok) }

// Serve serves HTTP on ln (and /metrics on Options.MetricsListener, when
// set) until ctx is done, then stops accepting connections, lets the
// requests in flight finish within serve.drain_timeout (then cuts them:
// ErrDrainTimeout) and returns once every handler has returned. The
// listeners are closed.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	type served struct {
		hs *http.Server
		ln net.Listener
	}
	all := []served{{s.httpServer(s.handler), ln}}
	if s.opt.MetricsListener != nil {
		all = append(all, served{s.httpServer(s.metricsOnly), s.opt.MetricsListener})
	}
	errc := make(chan error, len(all))
	for _, sv := range all {
		go func() { errc <- sv.hs.Serve(sv.ln) }()
	}
	running := len(all)
	var failed error
	select {
	case err := <-errc: // a listener failed: drain what was accepted
		failed = fmt.Errorf("serve: %w", err)
		running--
	case <-ctx.Done():
	}
	s.SetReady(false)
	s.log.Info("serve: draining", "timeout", s.opt.Config.DrainTimeout.String())
	dctx, cancel := context.WithTimeout(context.Background(), s.opt.Config.DrainTimeout)
	defer cancel()
	var err error
	for i, sv := range all {
		e := sv.hs.Shutdown(dctx)
		if errors.Is(e, context.DeadlineExceeded) {
			sv.hs.Close() // closing the connections cancels the requests' contexts
			if i == 0 {
				err = ErrDrainTimeout
			}
		}
	}
	for ; running > 0; running-- {
		<-errc // http.ErrServerClosed, or the other listener's failure
	}
	s.handlers.Wait() // the handlers cut by Close return once their rows are cancelled
	if failed != nil {
		return failed
	}
	return err
}

// httpServer is an http.Server for h with the server's timeouts. Reading a
// request body is bounded by serve.body_timeout (observe sets the
// deadline); writing a response is not, since a streamed one lasts as long
// as its answer.
func (s *Server) httpServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		// Request contexts do not derive from ctx: a shutdown drains them
		// instead of cancelling them.
		BaseContext: func(net.Listener) context.Context { return context.Background() },
		ErrorLog:    slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
}

// only answers 405 in OpenAI's error shape to other methods.
func (s *Server) only(method string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != method && !(method == http.MethodGet && r.Method == http.MethodHead) {
			w.Header().Set("Allow", method)
			writeError(w, &apiError{Status: http.StatusMethodNotAllowed, Type: typeInvalid, Code: strp("method_not_allowed"),
				Message: fmt.Sprintf("%s takes %s, not %s", r.URL.Path, method, cut(r.Method, 20))})
			return
		}
		h.ServeHTTP(w, r)
	})
}

// auth checks the bearer token in constant time when one is configured.
func (s *Server) auth(h http.Handler) http.Handler {
	if s.opt.APIKey == "" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := bearerToken(r.Header.Get("Authorization"))
		got := sha256.Sum256([]byte(token))
		if !ok || subtle.ConstantTimeCompare(got[:], s.keyHash[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="recal"`)
			writeError(w, &apiError{Status: http.StatusUnauthorized, Type: typeInvalid, Code: strp("invalid_api_key"),
				Message: "missing or incorrect API key: send Authorization: Bearer <the token in serve.api_key_env's variable>"})
			return
		}
		h.ServeHTTP(w, r)
	})
}

// bearerToken returns the token of an Authorization header of the Bearer
// scheme, whose name is case-insensitive (RFC 7235 section 2.1: "bearer",
// "BEARER"); the spaces around the token do not count.
func bearerToken(h string) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimLeft(h, " \t"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.Trim(token, " \t"), true
}

// reqInfo is what a handler tells the access log about its request.
type reqInfo struct {
	id    string
	attrs []slog.Attr
}

type ctxKey struct{}

func infoOf(ctx context.Context) *reqInfo {
	if ri, ok := ctx.Value(ctxKey{}).(*reqInfo); ok {
		return ri
	}
	return &reqInfo{}
}

// observe gives every request an id (X-Request-Id), counts it in the
// metrics and writes its access log line.
func (s *Server) observe(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.handlers.Add(1)
		defer s.handlers.Done()
		start := time.Now()
		// The request's body must arrive within serve.body_timeout: a
		// client trickling it is cut then (chat lifts the deadline once it
		// has the body). A ResponseWriter without deadlines (a test's
		// recorder) has no connection to hold.
		http.NewResponseController(w).SetReadDeadline(start.Add(s.opt.Config.BodyTimeout))
		ri := &reqInfo{id: newID()}
		w.Header().Set("X-Request-Id", ri.id)
		rec := &recorder{ResponseWriter: w}
		route := routeOf(r.URL.Path)
		s.metrics.inflight.Inc()
		h.ServeHTTP(rec, r.WithContext(context.WithValue(r.Context(), ctxKey{}, ri)))
		s.metrics.inflight.Dec()
		status := rec.status
		if status == 0 {
			status = http.StatusOK
		}
		if r.Context().Err() != nil && !rec.complete {
			status = 499 // the client went away first (nginx's code)
		}
		d := time.Since(start)
		s.metrics.observe(route, status, d)
		attrs := append([]slog.Attr{slog.String("request_id", ri.id), slog.String("method", r.Method),
			slog.String("path", cut(r.URL.Path, 200)), slog.Int("status", status), slog.Float64("ms", float64(d.Microseconds())/1000),
			slog.Int64("bytes", rec.bytes), slog.String("remote", r.RemoteAddr)}, ri.attrs...)
		s.log.LogAttrs(context.Background(), slog.LevelInfo, "serve: request", attrs...)
	})
}

// routeOf is the metrics label of a path: the endpoint, never the raw path.
func routeOf(path string) string {
	switch {
	case path == "/v1/chat/completions", path == "/v1/models", path == "/healthz", path == "/readyz", path == "/metrics":
		return path
	case strings.HasPrefix(path, "/v1/models/"):
		return "/v1/models/{id}"
	}
	return "other"
}

// recorder remembers the status and size of a response and passes flushes
// through (streaming needs them).
type recorder struct {
	http.ResponseWriter
	status   int
	bytes    int64
	complete bool // the handler wrote its whole response
}

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	n, err := r.ResponseWriter.Write(b)
	r.bytes += int64(n)
	return n, err
}

func (r *recorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// markComplete tells observe the response was written in full, so a client
// that hangs up right after is not logged as 499.
func markComplete(w http.ResponseWriter) {
	if r, ok := w.(*recorder); ok {
		r.complete = true
	}
}

func newID() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// writeJSON writes v with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":{"message":"serve: encoding the response failed","type":"server_error","param":null,"code":null}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", fmt.Sprint(len(b)+1))
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
	markComplete(w)
}

// Caps of an error's fields, in code points: an error may quote the
// client's input, never at length.
const (
	maxErrorMessage = 1000
	maxErrorParam   = 200
)

// writeError writes an error in OpenAI's shape, its message and param cut
// to maxErrorMessage and maxErrorParam.
func writeError(w http.ResponseWriter, e *apiError) {
	c := *e
	c.Message = cut(c.Message, maxErrorMessage)
	if c.Param != nil {
		c.Param = strp(cut(*c.Param, maxErrorParam))
	}
	writeJSON(w, c.Status, map[string]*apiError{"error": &c})
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if !s.ready.Load() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready"})
		return
	}
	active, waiting := s.opt.Backend.Stats()
	writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "active": active, "waiting": waiting})
}

// modelObject is an entry of GET /v1/models; recal's extras go in "recal".
type modelObject struct {
	ID      string     `json:"id"`
	Object  string     `json:"object"`
	Created int64      `json:"created"`
	OwnedBy string     `json:"owned_by"`
	Recal   modelExtra `json:"recal"`
}

type modelExtra struct {
	// Role is "router" (the model to ask) or "pool" (a model the router may
	// call; name it in recal.models).
	Role        string   `json:"role"`
	Description string   `json:"description,omitempty"`
	PriceIn     *float64 `json:"price_in_usd_per_mtok,omitempty"`
	PriceOut    *float64 `json:"price_out_usd_per_mtok,omitempty"`
	Provider    string   `json:"provider,omitempty"`
	Simulated   bool     `json:"simulated,omitempty"`
	MaxTurns    *int     `json:"max_turns,omitempty"`
}

func (s *Server) modelList() []modelObject {
	out := []modelObject{{ID: s.opt.Name, Object: "model", Created: s.created, OwnedBy: "recal",
		Recal: modelExtra{Role: "router", Description: "the routing policy: it calls the pool models and answers", MaxTurns: &s.opt.MaxTurns}}}
	for _, m := range s.opt.Models {
		out = append(out, modelObject{ID: m.Name, Object: "model", Created: s.created, OwnedBy: "recal-pool",
			Recal: modelExtra{Role: "pool", Description: m.Description, PriceIn: &m.PriceIn, PriceOut: &m.PriceOut,
				Provider: m.Provider, Simulated: m.Simulated}})
	}
	return out
}

func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": s.modelList()})
}

func (s *Server) model(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	for _, m := range s.modelList() {
		if m.ID == id {
			writeJSON(w, http.StatusOK, m)
			return
		}
	}
	writeError(w, &apiError{Status: http.StatusNotFound, Type: typeInvalid, Param: strp("model"), Code: strp("model_not_found"),
		Message: fmt.Sprintf("the model %q does not exist", cut(id, 100))})
}
