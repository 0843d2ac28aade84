package config

import (
	"os"
	"path/filepath"
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
		{name: "defaults", text: base, check: func(s Serve) bool { return s == DefaultServe() && s.MaxBodyBytes == 1<<20 && !s.LogContent }},
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
	if back.Serve != cfg.Serve {
		t.Errorf("[serve] after a round trip = %+v, want %+v", back.Serve, cfg.Serve)
	}
}

func TestServeAPIKey(t *testing.T) {
	t.Setenv("RECAL_TEST_SERVE_KEY", "s3cret")
	t.Setenv("RECAL_TEST_SERVE_EMPTY", "")
	cases := []struct {
		env, want, wantErr string
	}{
		{"", "", ""},
		{"RECAL_TEST_SERVE_KEY", "s3cret", ""},
		{"RECAL_TEST_SERVE_EMPTY", "", "not set"},
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
