package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestServe(t *testing.T) {
	cases := []struct {
		name    string
		text    string
		sets    []string
		wantErr string
		check   func(Serve) bool
	}{
		{name: "defaults", text: base, check: func(s Serve) bool {
			return reflect.DeepEqual(s, DefaultServe()) && len(s.AllowedOrigins) == 0 && len(s.AllowedHosts) == 0 && s.MaxBodyBytes == 1<<20 && !s.LogContent && s.BodyTimeout == 10*time.Second &&
				s.MaxBodyReads == 64 && s.MaxSamplings == 4 && s.MetricsAddr == "" && !s.MetricsOpen
		}},
		{name: "body bounds, samplings and metrics", text: base + "\n[serve]\nbody_timeout = \"2s\"\nmax_body_reads = 8\nmax_samplings = 1\nmetrics_addr = \"127.0.0.1:9100\"\nmetrics_open = true\n",
			check: func(s Serve) bool {
				return s.BodyTimeout == 2*time.Second && s.MaxBodyReads == 8 && s.MaxSamplings == 1 && s.MetricsAddr == "127.0.0.1:9100" && s.MetricsOpen
			}},
		{name: "durations and sets", text: base + "\n[serve]\nrequest_timeout = \"5s\"\ndrain_timeout = \"250ms\"\n",
			sets: []string{"serve.max_batch=4", "serve.addr=0.0.0.0:9000", "serve.log_content=true"},
			check: func(s Serve) bool {
				return s.RequestTimeout == 5*time.Second && s.DrainTimeout == 250*time.Millisecond && s.MaxBatch == 4 &&
					s.Addr == "0.0.0.0:9000" && s.LogContent
			}},
		{name: "unknown key", text: base + "\n[serve]\nmax_batches = 3\n", wantErr: `unknown key "serve.max_batches"`},
		{name: "address without port", text: base, sets: []string{"serve.addr=localhost"}, wantErr: "serve.addr"},
		{name: "no rows", text: base, sets: []string{"serve.max_batch=0"}, wantErr: "serve.max_batch"},
		{name: "negative queue", text: base, sets: []string{"serve.max_queue=-1"}, wantErr: "serve.max_queue"},
		{name: "tiny body limit", text: base, sets: []string{"serve.max_body_bytes=10"}, wantErr: "serve.max_body_bytes"},
		{name: "no question", text: base, sets: []string{"serve.max_question_chars=0"}, wantErr: "serve.max_question_chars"},
		{name: "negative timeout", text: base, sets: []string{`serve.request_timeout="-1s"`}, wantErr: "serve.request_timeout"},
		{name: "timeout not a duration", text: base, sets: []string{`serve.drain_timeout="soon"`}, wantErr: "drain_timeout"},
		{name: "no body timeout", text: base, sets: []string{`serve.body_timeout="0s"`}, wantErr: "serve.body_timeout"},
		{name: "negative body timeout", text: base, sets: []string{`serve.body_timeout="-1s"`}, wantErr: "serve.body_timeout"},
		{name: "no body reads", text: base, sets: []string{"serve.max_body_reads=0"}, wantErr: "serve.max_body_reads"},
		{name: "no samplings", text: base, sets: []string{"serve.max_samplings=0"}, wantErr: "serve.max_samplings"},
		{name: "samplings not a number", text: base, sets: []string{`serve.max_samplings="many"`}, wantErr: "max_samplings"},
		{name: "metrics address without port", text: base, sets: []string{"serve.metrics_addr=localhost"}, wantErr: "serve.metrics_addr"},
		{name: "both on a free port", text: base, sets: []string{"serve.addr=127.0.0.1:0", "serve.metrics_addr=127.0.0.1:0"},
			check: func(s Serve) bool { return s.Addr == "127.0.0.1:0" && s.MetricsAddr == "127.0.0.1:0" }},
		{name: "origins and hosts", text: base + "\n[serve]\nallowed_origins = [\"https://app.example.com\", \"http://localhost:3000\"]\nallowed_hosts = [\"localhost\", \"127.0.0.1\", \"[::1]\"]\n",
			check: func(s Serve) bool { return len(s.AllowedOrigins) == 2 && len(s.AllowedHosts) == 3 }},
		{name: "origin with a path", text: base, sets: []string{`serve.allowed_origins=["https://a.example/x"]`}, wantErr: `serve.allowed_origins[0] = "https://a.example/x": want scheme://host[:port]`},
		{name: "origin without a scheme", text: base, sets: []string{`serve.allowed_origins=["a.example"]`}, wantErr: "serve.allowed_origins[0]"},
		{name: "host with a port", text: base, sets: []string{`serve.allowed_hosts=["localhost:8080"]`}, wantErr: `serve.allowed_hosts[0] = "localhost:8080": want a host name`},
		{name: "metrics on the API's address", text: base, sets: []string{"serve.addr=127.0.0.1:9000", "serve.metrics_addr=127.0.0.1:9000"}, wantErr: "serve.metrics_addr"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := Parse("test.toml", []byte(c.text), c.sets)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one mentioning %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !c.check(cfg.Serve) {
				t.Errorf("[serve] = %+v: not what the file and sets say", cfg.Serve)
			}
		})
	}
}

// The resolved config written next to a run keeps [serve] readable.
func TestServeRoundTrip(t *testing.T) {
	cfg, err := Parse("test.toml", []byte(base), []string{`serve.request_timeout="7s"`})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := cfg.Write(path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(path, b, nil)
	if err != nil {
		t.Fatalf("the written config does not parse again: %v", err)
	}
	if !reflect.DeepEqual(back.Serve, cfg.Serve) {
		t.Errorf("[serve] after a round trip = %+v, want %+v", back.Serve, cfg.Serve)
	}
}

func TestServeAPIKey(t *testing.T) {
	t.Setenv("RECAL_TEST_SERVE_KEY", "s3cret")
	t.Setenv("RECAL_TEST_SERVE_EMPTY", "")
	t.Setenv("RECAL_TEST_SERVE_CRLF", "s3cret\r\n")
	cases := []struct {
		env, want, wantErr string
	}{
		{"", "", ""},
		{"RECAL_TEST_SERVE_KEY", "s3cret", ""},
		{"RECAL_TEST_SERVE_EMPTY", "", "the variable is set but empty"},
		{"RECAL_TEST_SERVE_CRLF", "", "holds a control character"},
		{"RECAL_TEST_SERVE_UNSET_X", "", "not set"},
	}
	for _, c := range cases {
		t.Run(c.env, func(t *testing.T) {
			got, err := Serve{APIKeyEnv: c.env}.APIKey()
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) || strings.Contains(err.Error(), "s3cret") {
					t.Fatalf("error %v, want one saying the variable is %s (and never its value)", err, c.wantErr)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("APIKey() = %q, %v; want %q", got, err, c.want)
			}
		})
	}
}
