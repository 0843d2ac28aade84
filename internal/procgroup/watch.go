package procgroup

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A collective that fails because a peer died or hangs says so from this
// rank's side ("connection closed by peer", a timeout), not which rank was
// lost. The watchdog tells: every rank keeps a TCP connection to rank 0
// (its own, beside the process group's) and reports, once per interval
// and whenever it enters or leaves a collective, how many collectives it
// has entered; rank 0 sends everyone the table of all ranks. Rank 0
// listens on its own address on the route to the rendezvous host only, and
// a connection must first present the job's token (random, made by rank 0
// and broadcast over the process group; never logged) before it counts as
// a rank or is sent anything. A rank whose
// connection closed died (or its host did); one whose reports stopped is
// stopped or its host hangs; one that never reached the collective the
// others wait in is stuck before it. Guard wraps a collective's error with
// that finding.

// WatchOptions configure a Watchdog.
type WatchOptions struct {
	// Interval between reports; 1 s when 0.
	Interval time.Duration
	// Silent is how long without a report makes a rank unresponsive; 10
	// intervals when 0.
	Silent time.Duration
	Log    *slog.Logger // nil: slog.Default()
}

// Watchdog watches the ranks of a group; see Watch.
type Watchdog struct {
	rank, size int
	opt        WatchOptions
	log        *slog.Logger

	mu       sync.Mutex
	self     report            // this rank's state
	peers    []peer            // rank 0: every rank's state; other ranks: rank 0's latest table
	updated  time.Time         // when peers last changed
	rootGone string            // other ranks: why the connection to rank 0 ended ("" while it is up)
	ln       net.Listener      // rank 0
	token    string            // the job's token (secret: never logged)
	conns    map[int]*wire     // rank 0: the other ranks' connections
	pending  map[net.Conn]bool // rank 0: connections yet to say hello
	up       *wire             // other ranks: the connection to rank 0
	closed   bool
	stop     chan struct{}
	wg       sync.WaitGroup
}

// report is what a rank says of itself.
type report struct {
	Rank int    `json:"rank"`
	Seq  int64  `json:"seq"` // collectives entered
	Op   string `json:"op"`  // the last one
	In   bool   `json:"in"`  // inside it now
	Bye  bool   `json:"bye,omitempty"`
}

// peer is a rank as rank 0 sees it.
type peer struct {
	report
	Joined bool    `json:"joined"`
	Gone   string  `json:"gone,omitempty"` // why its connection ended
	Quiet  float64 `json:"quiet_s"`        // seconds since its last report (rank 0's clock)
	last   time.Time
}

// hello is a rank's first line to rank 0: who it is and the job's token.
type hello struct {
	Rank  int    `json:"rank"`
	Token string `json:"token"`
}

// rendezvous is what rank 0 broadcasts: where it listens ("" when it
// cannot) and the job's token.
type rendezvous struct {
	Addr  string `json:"addr"`
	Token string `json:"token"`
}

// helloTimeout bounds how long rank 0 waits for a new connection's hello.
const helloTimeout = 10 * time.Second

// table is what rank 0 sends.
type table struct {
	Peers []peer `json:"peers"`
}

type wire struct {
	mu sync.Mutex
	c  net.Conn
	w  *bufio.Writer
}

func (w *wire) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := w.w.Write(append(b, '\n')); err != nil {
		return err
	}
	return w.w.Flush()
}

// Watch starts watching the ranks of g, which all call it right after
// joining: rank 0 listens on a free port of its address on the route to
// host (the rendezvous address, MASTER_ADDR: under torchrun's agent store
// rank 0 need not run on host), not on every interface, and sends that
// address and a random token to the others over g (a broadcast), who
// connect to it and present the token. Watching is best effort: when a
// rank cannot connect, it warns and its errors go unnamed.
func Watch(ctx context.Context, g Group, host string, opt WatchOptions) (*Watchdog, error) {
	if opt.Interval <= 0 {
		opt.Interval = time.Second
	}
	if opt.Silent <= 0 {
		opt.Silent = 10 * opt.Interval
	}
	w := &Watchdog{rank: g.Rank(), size: g.Size(), opt: opt, log: opt.Log, stop: make(chan struct{})}
	if w.log == nil {
		w.log = slog.Default()
	}
	w.self.Rank = w.rank
	if host == "" {
		host = "127.0.0.1"
	}
	var rv rendezvous
	if w.rank == 0 {
		ip := localAddr(host)
		token := make([]byte, 32)
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err == nil {
			_, err = rand.Read(token)
			if err != nil {
				ln.Close()
			}
		}
		if err != nil {
			w.log.Warn("dist: watchdog: cannot listen; a lost rank will not be named", "addr", ip, "err", err)
		} else {
			w.ln, w.token = ln, hex.EncodeToString(token)
			w.conns, w.pending = map[int]*wire{}, map[net.Conn]bool{}
			w.peers = make([]peer, w.size)
			for r := range w.peers {
				w.peers[r].Rank = r
			}
			w.peers[0].Joined = true
			rv = rendezvous{Addr: net.JoinHostPort(ip, strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)), Token: w.token}
		}
	}
	rv, err := BroadcastOf(ctx, g, rv, 0)
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("dist: watchdog: %w", err)
	}
	switch {
	case w.rank == 0 && w.ln != nil:
		w.wg.Add(2)
		go w.accept()
		go w.tick()
	case w.rank != 0 && rv.Addr != "":
		c, err := net.DialTimeout("tcp", rv.Addr, 10*time.Second)
		if err != nil {
			w.log.Warn("dist: watchdog: cannot reach rank 0; a lost rank will not be named", "addr", rv.Addr, "err", err)
			break
		}
		w.up, w.updated = &wire{c: c, w: bufio.NewWriter(c)}, time.Now()
		w.up.send(hello{Rank: w.rank, Token: rv.Token})
		w.up.send(w.self)
		w.wg.Add(2)
		go w.listen()
		go w.tick()
	}
	return w, nil
}

// localAddr is this host's address on the route to host (a UDP "dial"
// sends nothing); host itself when there is no route.
func localAddr(host string) string {
	c, err := net.Dial("udp", net.JoinHostPort(host, "9"))
	if err != nil {
		return host
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP.String()
}

// accept takes the other ranks' connections (rank 0).
func (w *Watchdog) accept() {
	defer w.wg.Done()
	for {
		c, err := w.ln.Accept()
		if err != nil {
			return
		}
		w.wg.Add(1)
		go w.serve(c)
	}
}

// serve reads one rank's reports (rank 0), after its hello: a connection
// that does not present the job's token within helloTimeout is closed
// unheard, and is never sent the table.
func (w *Watchdog) serve(c net.Conn) {
	defer w.wg.Done()
	defer c.Close()
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.pending[c] = true // Close ends the wait for its hello
	w.mu.Unlock()
	sc := bufio.NewScanner(c)
	c.SetReadDeadline(time.Now().Add(helloTimeout))
	var h hello
	ok := sc.Scan() && json.Unmarshal(sc.Bytes(), &h) == nil &&
		subtle.ConstantTimeCompare([]byte(h.Token), []byte(w.token)) == 1 && h.Rank > 0 && h.Rank < w.size
	w.mu.Lock()
	delete(w.pending, c)
	closed := w.closed
	w.mu.Unlock()
	if !ok {
		if !closed {
			w.log.Warn("dist: watchdog: refused a connection without the job's token", "from", c.RemoteAddr().String())
		}
		return
	}
	c.SetReadDeadline(time.Time{})
	r := -1
	for sc.Scan() {
		var rp report
		if json.Unmarshal(sc.Bytes(), &rp) != nil || rp.Rank != h.Rank {
			return
		}
		w.mu.Lock()
		if r < 0 {
			r = rp.Rank
			w.conns[r] = &wire{c: c, w: bufio.NewWriter(c)}
			w.peers[r].Joined = true
		}
		p := &w.peers[r]
		p.report, p.last = rp, time.Now()
		if rp.Bye {
			p.Gone = "left"
		}
		w.updated = time.Now()
		w.mu.Unlock()
	}
	if r < 0 {
		return
	}
	w.mu.Lock()
	delete(w.conns, r)
	if w.peers[r].Gone == "" && !w.closed {
		w.peers[r].Gone = "its connection closed: the process ended or its host is unreachable"
		w.updated = time.Now()
	}
	w.mu.Unlock()
	w.push() // everyone learns at once
}

// listen reads rank 0's tables (other ranks).
func (w *Watchdog) listen() {
	defer w.wg.Done()
	sc := bufio.NewScanner(w.up.c)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var t table
		if json.Unmarshal(sc.Bytes(), &t) != nil {
			continue
		}
		w.mu.Lock()
		w.peers, w.updated = t.Peers, time.Now()
		w.mu.Unlock()
	}
	w.mu.Lock()
	if !w.closed {
		w.rootGone = "its connection closed: the process ended or its host is unreachable"
		w.updated = time.Now()
	}
	w.mu.Unlock()
}

// tick reports (other ranks) or sends the table (rank 0) every interval.
func (w *Watchdog) tick() {
	defer w.wg.Done()
	t := time.NewTicker(w.opt.Interval)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
		if w.rank == 0 {
			w.push()
		} else {
			w.sendSelf()
		}
	}
}

// push sends the table to every rank (rank 0).
func (w *Watchdog) push() {
	w.mu.Lock()
	now := time.Now()
	w.peers[0].report, w.peers[0].last = w.self, now
	for i := range w.peers {
		if w.peers[i].Joined {
			w.peers[i].Quiet = now.Sub(w.peers[i].last).Seconds()
		}
	}
	t := table{Peers: slices.Clone(w.peers)}
	conns := make([]*wire, 0, len(w.conns))
	for _, c := range w.conns {
		conns = append(conns, c)
	}
	w.mu.Unlock()
	for _, c := range conns {
		c.send(t)
	}
}

func (w *Watchdog) sendSelf() {
	w.mu.Lock()
	rp, up := w.self, w.up
	w.mu.Unlock()
	if up != nil {
		up.send(rp)
	}
}

// Guard runs the collective fn, named op, as this rank's next collective.
// When it fails, Guard waits up to a few intervals for the watchdog to
// name the rank that was lost and returns a LostError wrapping fn's
// error, or fn's error alone when no rank can be named.
func (w *Watchdog) Guard(op string, fn func() error) error {
	w.mu.Lock()
	w.self.Seq++
	w.self.Op, w.self.In = op, true
	seq := w.self.Seq
	w.mu.Unlock()
	if w.rank != 0 {
		w.sendSelf()
	}
	err := fn()
	w.mu.Lock()
	w.self.In = false
	w.mu.Unlock()
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	failed := time.Now()
	deadline := failed.Add(3 * w.opt.Interval)
	for {
		if lost := w.lost(seq, failed); len(lost) > 0 {
			return &LostError{Op: op, Rank: w.rank, Lost: lost, Err: err}
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(w.opt.Interval / 10)
	}
}

// lost names the ranks that explain a failure of collective seq: ranks
// whose connection ended, then ranks gone quiet, then (only when the table
// is newer than the failure) ranks that never reached the collective.
func (w *Watchdog) lost(seq int64, failed time.Time) []Lost {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.rootGone != "" {
		return []Lost{{Rank: 0, Why: w.rootGone}}
	}
	if w.up != nil && time.Since(w.updated) > w.opt.Silent {
		return []Lost{{Rank: 0, Why: fmt.Sprintf("no report for %.0f s: the process is stopped or hangs", time.Since(w.updated).Seconds())}}
	}
	var gone, quiet, behind []Lost
	for _, p := range w.peers {
		if p.Rank == w.rank || p.Gone == "left" {
			continue
		}
		switch {
		case p.Gone != "":
			gone = append(gone, Lost{p.Rank, p.Gone})
		case p.Joined && p.Quiet > w.opt.Silent.Seconds():
			quiet = append(quiet, Lost{p.Rank, fmt.Sprintf("no report for %.0f s: the process is stopped or hangs", p.Quiet)})
		case !p.Joined:
			quiet = append(quiet, Lost{p.Rank, "it never reported to the watchdog"})
		case p.Seq < seq && w.updated.After(failed):
			why := "it never reached this collective"
			if p.Op != "" {
				state := "after"
				if p.In {
					state = "inside"
				}
				why = fmt.Sprintf("it never reached this collective (it is %s collective #%d, %s, of the #%d this one is): stuck before it", state, p.Seq, p.Op, seq)
			}
			behind = append(behind, Lost{p.Rank, why})
		}
	}
	switch {
	case len(gone) > 0:
		return gone
	case len(quiet) > 0:
		return quiet
	}
	return behind
}

// Close stops watching; the other ranks see this rank leave, not fail.
// Safe to call twice.
func (w *Watchdog) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	w.self.Bye = true
	up, ln, bye := w.up, w.ln, w.self
	var conns []*wire
	for _, c := range w.conns {
		conns = append(conns, c)
	}
	for c := range w.pending {
		c.Close()
	}
	w.mu.Unlock()
	close(w.stop)
	if up != nil {
		up.send(bye)
		up.c.Close()
	}
	if ln != nil {
		ln.Close()
		w.push()
		for _, c := range conns {
			c.c.Close()
		}
	}
	w.wg.Wait()
	return nil
}

// Lost is a rank the watchdog found lost, and why.
type Lost struct {
	Rank int
	Why  string
}

// LostError is a collective that failed with ranks lost.
type LostError struct {
	Op   string // the collective
	Rank int    // this rank
	Lost []Lost
	Err  error // the collective's own error
}

func (e *LostError) Error() string {
	var parts []string
	for _, l := range e.Lost {
		parts = append(parts, fmt.Sprintf("rank %d (%s)", l.Rank, l.Why))
	}
	return fmt.Sprintf("dist: %s on rank %d failed: lost %s: %v", e.Op, e.Rank, strings.Join(parts, ", "), e.Err)
}

func (e *LostError) Unwrap() error { return e.Err }

// Watched is a Group whose collectives run under a Watchdog's Guard; its
// Close closes both.
type Watched struct {
	g Group
	w *Watchdog
}

var _ Group = (*Watched)(nil)

// Watch returns g with its collectives guarded by w (see Watchdog.Guard).
func (w *Watchdog) Watch(g Group) *Watched { return &Watched{g: g, w: w} }

// Unwrap returns the group itself, e.g. to reach its gradient all-reduce
// (which the caller runs under Guard).
func (g *Watched) Unwrap() Group { return g.g }

// Guard runs the collective fn under the watchdog; see Watchdog.Guard.
func (g *Watched) Guard(op string, fn func() error) error { return g.w.Guard(op, fn) }

func (g *Watched) Rank() int { return g.g.Rank() }
func (g *Watched) Size() int { return g.g.Size() }

func (g *Watched) AllGather(ctx context.Context, data []byte) (parts [][]byte, err error) {
	err = g.w.Guard("all-gather", func() error { parts, err = g.g.AllGather(ctx, data); return err })
	return parts, err
}

func (g *Watched) Broadcast(ctx context.Context, data []byte, root int) (out []byte, err error) {
	err = g.w.Guard("broadcast", func() error { out, err = g.g.Broadcast(ctx, data, root); return err })
	return out, err
}

func (g *Watched) Barrier(ctx context.Context) error {
	return g.w.Guard("barrier", func() error { return g.g.Barrier(ctx) })
}

// Close stops the watchdog, then leaves the group.
func (g *Watched) Close() error {
	return errors.Join(g.w.Close(), g.g.Close())
}
