package serve

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// stackCount counts the goroutines whose stack holds frame (a function's
// qualified name followed by "(").
func stackCount(frame string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), frame)
		}
		buf = make([]byte, 2*len(buf))
	}
}

// bodiesBeingRead counts the server's handlers reading a request body.
func bodiesBeingRead() int { return stackCount("/serve.readBody(") }

// connGoroutines counts the server's connections (one goroutine each).
func connGoroutines() int { return stackCount("net/http.(*conn).serve(") }

// slowClient sends a chat request's headers and the start of its body, then
// a byte at a time (trickle), and reads whatever the server answers.
type slowClient struct {
	conn  net.Conn
	start time.Time
	got   chan slowResult
}

type slowResult struct {
	status     int
	retryAfter string
	after      time.Duration // from the headers sent to the response read
	closed     bool          // the server closed the connection after it
	closedAt   time.Duration // from the headers sent to the close
	err        error
}

func (r slowResult) String() string {
	if r.err != nil {
		return fmt.Sprintf("no response after %s: %v", r.after.Round(time.Millisecond), r.err)
	}
	return fmt.Sprintf("%d (Retry-After %q) after %s, connection closed: %v (after %s)", r.status, r.retryAfter,
		r.after.Round(time.Millisecond), r.closed, r.closedAt.Round(time.Millisecond))
}

// dialSlow opens a slow client whose body (Content-Length 100,000) would
// take far longer than any test to arrive.
func dialSlow(t *testing.T, addr string) *slowClient {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := &slowClient{conn: conn, start: time.Now(), got: make(chan slowResult, 1)}
	head := "POST /v1/chat/completions HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n" + `{"messages":[`
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(c.start.Add(10 * time.Second)) // the old server never answers: do not wait forever
	go func() {
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			c.got <- slowResult{err: err, after: time.Since(c.start)}
			return
		}
		r := slowResult{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), after: time.Since(c.start)}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		_, err = br.ReadByte()
		// A reset is a close too: the client was still sending.
		r.closed, r.closedAt = err == io.EOF || errors.Is(err, syscall.ECONNRESET), time.Since(c.start)
		c.got <- r
	}()
	return c
}

// trickler writes one byte of JSON whitespace to each of its clients every
// 20 ms, until stopped: a client that keeps sending, too slowly to finish.
type trickler struct {
	mu      sync.Mutex
	clients []*slowClient
	stop    chan struct{}
	done    chan struct{}
}

func newTrickler(t *testing.T) *trickler {
	tr := &trickler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(tr.done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-tr.stop:
				return
			case <-tick.C:
			}
			tr.mu.Lock()
			live := tr.clients[:0]
			for _, c := range tr.clients {
				c.conn.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
				if _, err := c.conn.Write([]byte(" ")); err == nil {
					live = append(live, c)
				}
			}
			tr.clients = live
			tr.mu.Unlock()
		}
	}()
	t.Cleanup(func() { close(tr.stop); <-tr.done })
	return tr
}

func (tr *trickler) add(cs ...*slowClient) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.clients = append(tr.clients, cs...)
}

// Clients that send their headers and then trickle their bodies are bounded
// in count and time: at most serve.max_body_reads bodies are read at once
// (the clients beyond are answered 503 with Retry-After at once and
// disconnected, so their goroutines end), each is cut with 408 after
// serve.body_timeout however steadily it trickles, and normal clients are
// served meanwhile: at once while a body slot is free, and after a prompt
// 503 and a retry (as the OpenAI SDKs do) once the slow bodies are cut.
// The server before these bounds read all 24 bodies at once, forever.
func TestSlowBodies(t *testing.T) {
	const bound, slow = 4, 24
	const timeout = 3 * time.Second
	f := newFixture(t, simPool(t, 0), 0, func(o *Options) { o.Config.MaxBodyReads, o.Config.BodyTimeout = bound, timeout })
	addr := f.http.Listener.Addr().String()
	tr := newTrickler(t)

	// (a) The bodies being read never exceed the bound.
	stopWatch, peak := make(chan struct{}), make(chan int, 1)
	go func() {
		most := 0
		defer func() { peak <- most }()
		for {
			most = max(most, bodiesBeingRead())
			select {
			case <-stopWatch:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()

	// Below the bound, slow bodies do not delay a normal request.
	var clients []*slowClient
	for range bound - 1 {
		clients = append(clients, dialSlow(t, addr))
	}
	tr.add(clients...)
	waitFor(t, fmt.Sprintf("%d slow bodies being read", bound-1), func() bool { return bodiesBeingRead() == bound-1 })
	t0 := time.Now()
	if resp, b := f.post(t, chatBody("q", "")); resp.StatusCode != 200 || time.Since(t0) > timeout/2 {
		t.Errorf("a normal request beside %d slow bodies: %d after %s (%s), want 200 at once", bound-1, resp.StatusCode, time.Since(t0), b)
	}

	// Beyond it, the others are turned away at once.
	more := []*slowClient{}
	for range slow - (bound - 1) {
		more = append(more, dialSlow(t, addr))
	}
	tr.add(more...)
	turnedAway := 0
	holders := clients[: bound-1 : bound-1] // the first ones hold a body slot each
	time.Sleep(timeout / 2)
	for _, c := range more {
		select {
		case r := <-c.got:
			if r.status != http.StatusServiceUnavailable || r.retryAfter == "" || !r.closed || r.after > timeout/2 {
				t.Errorf("a slow client beyond the bound got %v; want 503 with Retry-After within %s and its connection closed", r, timeout/2)
			}
			turnedAway++
		default:
			holders = append(holders, c) // it holds a body slot (or the server has no bound)
		}
	}
	if turnedAway != slow-bound {
		t.Errorf("%d of %d slow clients were turned away at once; want the %d beyond serve.max_body_reads = %d", turnedAway, slow, slow-bound, bound)
	}
	// The turned-away connections are closed (lingerClose after their
	// response): the server holds a goroutine for the bound's connections
	// only (plus the normal client's idle one).
	deadline := time.Now().Add(timeout / 4)
	for connGoroutines() > bound+2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := connGoroutines(); n > bound+2 {
		t.Errorf("%d connection goroutines with %d slow clients; want at most %d (the bound's, and an idle keep-alive)", n, slow, bound+2)
	}
	if resp, _ := f.get(t, "/healthz"); resp.StatusCode != 200 {
		t.Errorf("GET /healthz while the body slots are full: %d, want 200", resp.StatusCode)
	}

	// (c) A normal client, retrying as the SDKs do, is served once the
	// slow bodies are cut; its first refusal comes at once.
	type outcome struct {
		ok       bool
		what     string
		first    time.Duration // until the first answer, a refusal or not
		refusals int
	}
	served := make(chan outcome, 1)
	go func() {
		start := time.Now()
		var first time.Duration
		for attempt := 0; ; attempt++ {
			resp, err := f.http.Client().Post(f.http.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("q", "")))
			if err != nil {
				served <- outcome{what: err.Error()}
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if attempt == 0 {
				first = time.Since(start)
			}
			if resp.StatusCode == 200 {
				served <- outcome{ok: true, what: fmt.Sprintf("200 after %d refusals", attempt), first: first, refusals: attempt}
				return
			}
			ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
			if resp.StatusCode != http.StatusServiceUnavailable || err != nil || !strings.Contains(string(b), `"code":"server_busy"`) || time.Since(start) > 3*timeout {
				served <- outcome{what: fmt.Sprintf("%d %q %s after %s", resp.StatusCode, resp.Header.Get("Retry-After"), b, time.Since(start))}
				return
			}
			time.Sleep(time.Duration(ra) * time.Second / 2) // half Retry-After, to finish sooner
		}
	}()

	// (b) The slot holders are cut after the time bound, although they
	// never stopped sending.
	for _, c := range holders {
		r := <-c.got
		if r.status != http.StatusRequestTimeout || !r.closed || r.after < timeout-100*time.Millisecond || r.after > timeout+time.Second {
			t.Errorf("a slow body being read ended with %v; want 408 after serve.body_timeout (%s) and its connection closed", r, timeout)
		}
	}
	if len(holders) != bound {
		t.Errorf("%d slow bodies were read for the time bound; want %d", len(holders), bound)
	}
	got := <-served
	if !got.ok || got.first > timeout/2 {
		t.Errorf("the normal client: %s, its first answer after %s; want 200 once the slow bodies are cut, and any refusal within %s",
			got.what, got.first.Round(time.Millisecond), timeout/2)
	}
	close(stopWatch)
	if most := <-peak; most > bound {
		t.Errorf("%d bodies were read at once; want at most serve.max_body_reads = %d", most, bound)
	}
	_, m := f.get(t, "/metrics")
	for _, want := range []string{
		fmt.Sprintf(`recal_serve_body_refused_total{reason="busy"} %d`, slow-bound+got.refusals),
		fmt.Sprintf(`recal_serve_body_refused_total{reason="timeout"} %d`, bound),
		"recal_serve_body_reads 0",
	} {
		if !strings.Contains(string(m), want) {
			t.Errorf("metrics lack %q:\n%s", want, grep(string(m), "recal_serve_body"))
		}
	}
}

// Once the body is in, its deadline is lifted: an answer that takes longer
// than serve.body_timeout is not cut, plain or streamed.
func TestBodyDeadlineLifted(t *testing.T) {
	f := newFixture(t, simPool(t, 0), 1, func(o *Options) { o.Config.BodyTimeout = 100 * time.Millisecond })
	f.backend.decode = 400 * time.Millisecond
	for _, extra := range []string{"", `"stream":true`} {
		resp, b := f.post(t, chatBody("q", extra))
		if resp.StatusCode != 200 || !strings.Contains(string(b), "echo: q") {
			t.Errorf("%s: status %d %s; want 200 with the answer, 4x body_timeout after the body arrived", extra, resp.StatusCode, b)
		}
	}
	if n := f.backend.canceled.Load(); n != 0 {
		t.Errorf("%d answers were cancelled; want 0 (the body's deadline must not cut the answer)", n)
	}
}
