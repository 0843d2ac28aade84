package config

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"
	"unicode"
)

// Serve configures `recal serve`, the OpenAI-compatible HTTP server ([serve]).
type Serve struct {
	// Addr is the host:port the server listens on; --addr overrides it.
	// Default "127.0.0.1:8080" (local only).
	Addr string `toml:"addr"`
	// MaxBatch is the most requests decoding together (rows of the policy's
	// batch). Default 32.
	MaxBatch int `toml:"max_batch"`
	// MaxQueue is the most requests waiting for a row; a request beyond
	// max_batch + max_queue is answered 429 with Retry-After. Default 256.
	MaxQueue int `toml:"max_queue"`
	// RequestTimeout bounds one request, queueing included (duration; "0s" =
	// none). A request that runs out is answered 504. Default "120s".
	RequestTimeout time.Duration `toml:"request_timeout"`
	// DrainTimeout is how long SIGTERM/SIGINT waits for requests in flight
	// before closing their connections (duration). Default "30s".
	DrainTimeout time.Duration `toml:"drain_timeout"`
	// MaxBodyBytes caps a request body (bytes); a larger one is answered 413.
	// Default 1048576 (1 MiB).
	MaxBodyBytes int64 `toml:"max_body_bytes"`
	// BodyTimeout bounds how long a request's body may take to arrive,
	// counted from the end of its headers (duration, > 0). A slower body is
	// answered 408 and its connection closed, so a client trickling bytes
	// holds its connection for this long at most. Default "10s".
	BodyTimeout time.Duration `toml:"body_timeout"`
	// MaxBodyReads is the most request bodies being read at once (each may
	// buffer up to max_body_bytes, for up to body_timeout). A chat request
	// beyond it is answered 503 with Retry-After at once, without reading
	// its body, and its connection closed. Default 64.
	MaxBodyReads int `toml:"max_body_reads"`
	// MaxSamplings is the most distinct sampling settings (temperature,
	// top_p) decoding together: each is a decode call of its own every
	// step. A request with another setting waits for a row until every row
	// of one of them has ended, and the requests behind it wait too (first
	// come, first served). Greedy requests share one setting whatever their
	// top_p. Default 4.
	MaxSamplings int `toml:"max_samplings"`
	// MaxQuestionChars caps the question (the last user message), in Unicode
	// code points; a longer one is answered 400. Default 4000.
	MaxQuestionChars int `toml:"max_question_chars"`
	// APIKeyEnv names an environment variable holding the bearer token
	// clients must send (Authorization: Bearer ...) to /v1/ endpoints and
	// /metrics (see metrics_open); the
	// variable must then be set. Empty (the default) means no
	// authentication. The token itself never goes in a file.
	APIKeyEnv string `toml:"api_key_env"`
	// MetricsAddr, when not empty, is a host:port that serves GET /metrics
	// alone, and addr then does not serve it (a private interface for the
	// scraper, say). Default "": /metrics is served on addr.
	MetricsAddr string `toml:"metrics_addr"`
	// MetricsOpen serves /metrics without the bearer token when
	// api_key_env is set. Default false: /metrics, on addr or metrics_addr,
	// needs the same token as /v1/ (a scraper sends it as a bearer token).
	MetricsOpen bool `toml:"metrics_open"`
	// LogContent puts questions and answers in the access log lines.
	// Default false: the log holds ids, status, timing, models and cost only.
	LogContent bool `toml:"log_content"`
	// AllowedOrigins lists the web origins (each scheme://host[:port],
	// exactly as a browser sends it in its Origin header) whose pages may
	// call the server. A request carrying an Origin header not listed is
	// answered 403, so that a web page a user opens cannot make the local
	// server spend pool money; a listed origin gets CORS headers and its
	// preflight requests answered. Default empty: every request from a web
	// page is refused (SDKs, curl and other programs send no Origin).
	AllowedOrigins []string `toml:"allowed_origins"`
	// AllowedHosts, when not empty, lists the host names (the Host header,
	// port aside, such as "localhost" or "127.0.0.1") requests must be
	// addressed to; another is answered 403. It guards a server without
	// api_key_env against DNS rebinding (a web page's name made to point at
	// 127.0.0.1). Default empty: any Host.
	AllowedHosts []string `toml:"allowed_hosts"`
}

// DefaultServe returns the [serve] defaults.
func DefaultServe() Serve {
	return Serve{Addr: "127.0.0.1:8080", MaxBatch: 32, MaxQueue: 256, RequestTimeout: 120 * time.Second,
		DrainTimeout: 30 * time.Second, MaxBodyBytes: 1 << 20, BodyTimeout: 10 * time.Second, MaxBodyReads: 64,
		MaxSamplings: 4, MaxQuestionChars: 4000}
}

// Validate names the first bad [serve] key.
func (s Serve) Validate() error {
	if _, _, err := net.SplitHostPort(s.Addr); err != nil {
		return fmt.Errorf("serve.addr = %q: want host:port: %w", s.Addr, err)
	}
	if s.MetricsAddr != "" {
		_, port, err := net.SplitHostPort(s.MetricsAddr)
		if err != nil {
			return fmt.Errorf("serve.metrics_addr = %q: want host:port, or \"\" to serve /metrics on serve.addr: %w", s.MetricsAddr, err)
		}
		if s.MetricsAddr == s.Addr && port != "0" { // port 0 picks a free port for each
			return fmt.Errorf("serve.metrics_addr = %q: the same as serve.addr; leave it \"\" to serve /metrics there", s.MetricsAddr)
		}
	}
	checks := []struct {
		bad bool
		msg string
	}{
		{s.MaxBatch < 1, fmt.Sprintf("serve.max_batch = %d: must be ≥ 1", s.MaxBatch)},
		{s.MaxQueue < 0, fmt.Sprintf("serve.max_queue = %d: must be ≥ 0", s.MaxQueue)},
		{s.RequestTimeout < 0, fmt.Sprintf("serve.request_timeout = %s: must be ≥ 0", s.RequestTimeout)},
		{s.DrainTimeout < 0, fmt.Sprintf("serve.drain_timeout = %s: must be ≥ 0", s.DrainTimeout)},
		{s.MaxBodyBytes < 1024, fmt.Sprintf("serve.max_body_bytes = %d: must be ≥ 1024", s.MaxBodyBytes)},
		{s.BodyTimeout <= 0, fmt.Sprintf("serve.body_timeout = %s: must be > 0 (a body that never ends would hold its connection)", s.BodyTimeout)},
		{s.MaxBodyReads < 1, fmt.Sprintf("serve.max_body_reads = %d: must be ≥ 1", s.MaxBodyReads)},
		{s.MaxSamplings < 1, fmt.Sprintf("serve.max_samplings = %d: must be ≥ 1", s.MaxSamplings)},
		{s.MaxQuestionChars < 1, fmt.Sprintf("serve.max_question_chars = %d: must be ≥ 1", s.MaxQuestionChars)},
	}
	for _, c := range checks {
		if c.bad {
			return fmt.Errorf("%s", c.msg)
		}
	}
	for i, o := range s.AllowedOrigins {
		u, err := url.Parse(o)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Path != "" || u.RawQuery != "" || u.User != nil {
			return fmt.Errorf("serve.allowed_origins[%d] = %q: want scheme://host[:port] (http or https, no path), as a browser's Origin header", i, o)
		}
	}
	for i, h := range s.AllowedHosts {
		if h == "" || strings.ContainsAny(h, ":/ ") && !strings.HasPrefix(h, "[") {
			return fmt.Errorf("serve.allowed_hosts[%d] = %q: want a host name or address without a port (\"localhost\", \"127.0.0.1\", \"[::1]\")", i, h)
		}
	}
	return nil
}

// APIKey returns the client bearer token named by APIKeyEnv ("" when
// APIKeyEnv is empty), or an error when the variable is unset or empty: a
// server meant to require a token never starts without one.
func (s Serve) APIKey() (string, error) {
	if s.APIKeyEnv == "" {
		return "", nil
	}
	v, ok := os.LookupEnv(s.APIKeyEnv)
	switch {
	case !ok:
		return "", fmt.Errorf("config: serve.api_key_env = %q: the variable is not set (unset api_key_env to serve without authentication)", s.APIKeyEnv)
	case strings.TrimSpace(v) == "":
		return "", fmt.Errorf("config: serve.api_key_env = %q: the variable is set but empty (unset api_key_env to serve without authentication)", s.APIKeyEnv)
	case strings.IndexFunc(v, unicode.IsControl) >= 0:
		return "", fmt.Errorf("config: serve.api_key_env = %q: the variable holds a control character (a line break?); a bearer token is one line", s.APIKeyEnv)
	}
	return v, nil
}
