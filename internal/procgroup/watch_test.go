package procgroup

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// hub is an in-process group of n ranks for tests: broadcasts only, which
// is all Watch needs.
type hub struct {
	mu   sync.Mutex
	cond *sync.Cond
	vals map[int][]byte // round → root's data
	n    int
}

type member struct {
	h     *hub
	rank  int
	round int
}

func newHub(n int) []*member {
	h := &hub{vals: map[int][]byte{}, n: n}
	h.cond = sync.NewCond(&h.mu)
	ms := make([]*member, n)
	for r := range ms {
		ms[r] = &member{h: h, rank: r}
	}
	return ms
}

func (m *member) Rank() int { return m.rank }
func (m *member) Size() int { return m.h.n }
func (m *member) AllGather(context.Context, []byte) ([][]byte, error) {
	return nil, errors.New("hub: no all-gather")
}
func (m *member) Broadcast(_ context.Context, data []byte, root int) ([]byte, error) {
	m.h.mu.Lock()
	defer m.h.mu.Unlock()
	round := m.round
	m.round++
	if m.rank == root {
		m.h.vals[round] = append([]byte{}, data...)
		m.h.cond.Broadcast()
	}
	for m.h.vals[round] == nil {
		m.h.cond.Wait()
	}
	return m.h.vals[round], nil
}
func (m *member) Barrier(context.Context) error { return nil }
func (m *member) Close() error                  { return nil }

// watchAll starts a watchdog on every member of a hub of n.
func watchAll(t *testing.T, n int) []*Watchdog {
	t.Helper()
	ms := newHub(n)
	ws := make([]*Watchdog, n)
	var wg sync.WaitGroup
	for r := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w, err := Watch(context.Background(), ms[r], "127.0.0.1", WatchOptions{Interval: 20 * time.Millisecond, Silent: 5 * time.Second})
			if err != nil {
				t.Error(err)
			}
			ws[r] = w
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	t.Cleanup(func() {
		for _, w := range ws {
			w.Close()
		}
	})
	// Every rank reported at least once.
	deadline := time.Now().Add(5 * time.Second)
	for {
		ws[0].mu.Lock()
		joined := 0
		for _, p := range ws[0].peers {
			if p.Joined {
				joined++
			}
		}
		ws[0].mu.Unlock()
		if joined == n {
			return ws
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d ranks joined the watchdog", joined, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

var errCollective = errors.New("connection closed by peer")

// A collective that fails is named after the rank that was lost: a rank
// whose connection closed (its process died), or one that never reached
// the collective the others are in; without either, the error is the
// collective's own. A rank that left (Close) is not lost.
func TestWatchdogNamesTheLostRank(t *testing.T) {
	t.Run("a dead rank", func(t *testing.T) {
		ws := watchAll(t, 3)
		ws[2].up.c.Close() // as a killed process would: no goodbye
		for _, r := range []int{0, 1} {
			err := ws[r].Guard("all-gather", func() error { return errCollective })
			var le *LostError
			if !errors.As(err, &le) || len(le.Lost) != 1 || le.Lost[0].Rank != 2 || !strings.Contains(le.Lost[0].Why, "connection closed") {
				t.Fatalf("rank %d: %v; want a LostError naming rank 2, whose connection closed", r, err)
			}
			if !errors.Is(err, errCollective) || !strings.Contains(err.Error(), "lost rank 2 (") {
				t.Errorf("rank %d: %q should wrap the collective's error and say \"lost rank 2 (\"", r, err)
			}
		}
	})
	t.Run("rank 0 dead", func(t *testing.T) {
		ws := watchAll(t, 2)
		ws[0].ln.Close()
		ws[0].mu.Lock()
		var conns []*wire
		for _, c := range ws[0].conns {
			conns = append(conns, c)
		}
		ws[0].closed = true
		ws[0].mu.Unlock()
		for _, c := range conns {
			c.c.Close()
		}
		err := ws[1].Guard("barrier", func() error { return errCollective })
		var le *LostError
		if !errors.As(err, &le) || le.Lost[0].Rank != 0 {
			t.Fatalf("rank 1: %v; want a LostError naming rank 0", err)
		}
	})
	t.Run("a rank that never reaches the collective", func(t *testing.T) {
		ws := watchAll(t, 3)
		// Ranks 0 and 2 enter collective #1; rank 1 never does. Rank 0's
		// collective times out.
		other := make(chan error)
		go func() {
			other <- ws[2].Guard("all-gather", func() error { time.Sleep(200 * time.Millisecond); return errCollective })
		}()
		err := ws[0].Guard("all-gather", func() error { time.Sleep(100 * time.Millisecond); return errCollective })
		<-other
		var le *LostError
		if !errors.As(err, &le) || len(le.Lost) != 1 || le.Lost[0].Rank != 1 || !strings.Contains(le.Lost[0].Why, "never reached") {
			t.Fatalf("rank 0: %v; want a LostError naming rank 1, which never reached the collective", err)
		}
	})
	t.Run("a rank that left is not lost", func(t *testing.T) {
		ws := watchAll(t, 2)
		ws[1].Close()
		time.Sleep(50 * time.Millisecond)
		err := ws[0].Guard("barrier", func() error { return errCollective })
		if err != errCollective {
			t.Fatalf("rank 0: %v; want the collective's own error (rank 1 left cleanly)", err)
		}
	})
	t.Run("success passes through", func(t *testing.T) {
		ws := watchAll(t, 2)
		if err := ws[1].Guard("barrier", func() error { return nil }); err != nil {
			t.Fatal(err)
		}
	})
}

// Rank 0's watchdog listens on its own address on the route to the
// rendezvous host, not on every interface, and a connection that does not
// present the job's token (sent over the process group) is closed unheard:
// it is never counted as a rank, never changes the table, and never
// receives it. The token is never logged.
func TestWatchdogAdmitsOnlyTheJobsRanks(t *testing.T) {
	var logs bytes.Buffer
	var logMu sync.Mutex
	ms := newHub(2)
	ws := make([]*Watchdog, 2)
	var wg sync.WaitGroup
	for r := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			log := slog.New(slog.NewTextHandler(&lockedWriter{mu: &logMu, w: &logs}, &slog.HandlerOptions{Level: slog.LevelDebug}))
			w, err := Watch(context.Background(), ms[r], "127.0.0.1", WatchOptions{Interval: 20 * time.Millisecond, Silent: 5 * time.Second, Log: log})
			if err != nil {
				t.Error(err)
			}
			ws[r] = w
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	t.Cleanup(func() {
		for _, w := range ws {
			w.Close()
		}
	})
	addr := ws[0].ln.Addr().(*net.TCPAddr)
	if !addr.IP.Equal(net.IPv4(127, 0, 0, 1)) {
		t.Errorf("rank 0's watchdog listens on %v, want 127.0.0.1 (its address on the route to the rendezvous host): listening on every interface exposes it to any host", addr)
	}
	if len(ws[0].token) < 32 {
		t.Fatalf("rank 0's token %d characters long, want a random one of at least 32", len(ws[0].token))
	}

	for _, c := range []struct {
		name  string
		lines []string
	}{
		{"no hello: a report at once", []string{`{"rank":1,"seq":99,"op":"intruder"}`}},
		{"a wrong token", []string{`{"rank":1,"token":"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}`, `{"rank":1,"seq":99,"op":"intruder"}`}},
		{"no token", []string{`{"rank":1}`, `{"rank":1,"seq":99,"op":"intruder"}`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr.String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			for _, l := range c.lines {
				conn.Write([]byte(l + "\n"))
			}
			conn.SetReadDeadline(time.Now().Add(3 * time.Second))
			b, err := io.ReadAll(conn)
			if len(b) > 0 || (err != nil && !errors.Is(err, syscall.ECONNRESET)) { // a reset: closed with our lines unread
				t.Errorf("a connection without the job's token read %d bytes, starting %.200q (%v); want the connection closed with nothing sent: the table names the job's ranks", len(b), b, err)
			}
			ws[0].mu.Lock()
			op := ws[0].peers[1].Op
			ws[0].mu.Unlock()
			if op == "intruder" {
				t.Errorf("rank 0's table took the report of a connection without the job's token as rank 1's")
			}
		})
	}
	// The real rank 1 is still watched.
	if err := ws[1].Guard("barrier", func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		ws[0].mu.Lock()
		op := ws[0].peers[1].Op
		ws[0].mu.Unlock()
		if op == "barrier" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rank 0 never saw rank 1's report (op %q), want the job's own rank admitted", op)
		}
		time.Sleep(10 * time.Millisecond)
	}
	logMu.Lock()
	defer logMu.Unlock()
	if strings.Contains(logs.String(), ws[0].token) {
		t.Errorf("the job's token appears in the log:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "refused a connection without the job's token") {
		t.Errorf("the refused connections were not logged:\n%s", logs.String())
	}
}

// lockedWriter serialises writes of several loggers to one buffer.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
