package serve

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/recal-project/recal/config"
)

// Run serves while the decode loop runs: the server is ready once Run calls
// ready; a loop that stops on its own stops the server with an error saying
// so; a cancelled ctx drains the server, then stops the loop, and Run
// returns nil.
func TestRun(t *testing.T) {
	cases := []struct {
		name   string
		decode func(ctx context.Context) error // the loop
		cancel bool                            // cancel Run's ctx once ready
		want   string                          // "" = nil
	}{
		{"the loop fails", func(context.Context) error { return errors.New("out of memory") }, false, "serve: out of memory"},
		{"the loop ends", func(context.Context) error { return nil }, false, "serve: the decode loop stopped"},
		{"a signal drains", func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }, true, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv, err := New(Options{Config: config.DefaultServe(), Name: "r", Models: simPool(t, 0).Models(), Backend: errBackend{}})
			if err != nil {
				t.Fatal(err)
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ready, serving := make(chan struct{}), make(chan struct{})
			// The loop ends only once the server answered a request, as a
			// libtorch error would come while serving.
			decode := func(ctx context.Context) error { <-serving; return c.decode(ctx) }
			done := make(chan error, 1)
			go func() { done <- srv.Run(ctx, ln, decode, func() { close(ready) }) }()
			<-ready
			client := http.Client{Timeout: 30 * time.Second}
			resp, err := client.Get("http://" + ln.Addr().String() + "/readyz")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Errorf("readyz once ready was called: %d, want 200", resp.StatusCode)
			}
			close(serving)
			if c.cancel {
				cancel()
			}
			select {
			case err := <-done:
				if (c.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), c.want) {
					t.Errorf("Run: %v, want %q", err, c.want)
				}
			case <-time.After(time.Minute):
				t.Fatal("Run did not return within a minute")
			}
		})
	}
}
