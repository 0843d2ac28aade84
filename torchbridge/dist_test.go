package torchbridge_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/recal-project/recal/internal/procgroup"
	"github.com/recal-project/recal/internal/testing/ranktest"
	"github.com/recal-project/recal/torchbridge"
)

var _ procgroup.Group = (*torchbridge.ProcessGroup)(nil)

// The multi-rank tests re-run this test binary as one process per rank, each
// running only TestDistHelper with the launch in torchrun's variables and
// the scenario in helperEnv.
const helperEnv = "RECAL_DIST_HELPER"

// launch starts world ranks of scenario, writing into dir, and returns their
// commands (started) and outputs.
func launch(t *testing.T, ctx context.Context, scenario, dir string, world int) ([]*exec.Cmd, []*bytes.Buffer) {
	t.Helper()
	return launchAt(t, ctx, scenario, dir, world, ranktest.FreePort(t))
}

// launchAt is launch with the store at port and extra variables for every
// rank.
func launchAt(t *testing.T, ctx context.Context, scenario, dir string, world, port int, extra ...string) ([]*exec.Cmd, []*bytes.Buffer) {
	t.Helper()
	return ranktest.Launch(t, ctx, "TestDistHelper", world, port, append([]string{helperEnv + "=" + scenario, "RECAL_DIST_DIR=" + dir}, extra...)...)
}

// helperCase is a policy the collectives scenario all-reduces.
type helperCase struct {
	name      string
	dtype     string
	tied      bool
	noGradOn1 bool // rank 1 runs no backward: its gradients count as zeros
}

var helperCases = []helperCase{
	{name: "f32-tied", dtype: "float32", tied: true},
	{name: "bf16-untied", dtype: "bfloat16", tied: false},
	{name: "rank1-without-grads", dtype: "float32", tied: true, noGradOn1: true},
}

// pattern is rank r's all-gather payload: lengths differ between ranks, and
// rank 0's is empty in the second round.
func pattern(r, round int) []byte {
	n := []int{5000 + 3*r, 13 * r}[round]
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + r*31 + round)
	}
	return b
}

// Two ranks on loopback: the gradient all-reduce equals the sum of both
// ranks' gradients (for float32 and bfloat16 policies, across several
// buckets, and with a rank that has none), identical AdamW steps then keep
// the replicas bitwise equal, and all-gather, broadcast and barrier deliver
// what each rank sent.
func TestDistTwoRanks(t *testing.T) {
	if os.Getenv(helperEnv) != "" {
		t.Skip("inside a helper rank")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dir := t.TempDir()
	cmds, outs := launch(t, ctx, "collectives", dir, 2)
	for r, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("rank %d: %v\n%s", r, err, outs[r])
		}
	}
	for _, c := range helperCases {
		t.Run(c.name, func(t *testing.T) {
			read := func(what string, r int) []float32 {
				b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("%s-%s-%d", c.name, what, r)))
				if err != nil {
					t.Fatal(err)
				}
				v := make([]float32, len(b)/4)
				for i := range v {
					v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
				}
				return v
			}
			pre0, pre1 := read("pre", 0), read("pre", 1)
			if c.noGradOn1 {
				for i, v := range pre1 {
					if v != 0 {
						t.Fatalf("rank 1 had gradient %g at %d before the all-reduce; the case needs none", v, i)
					}
				}
			} else if slicesEqual(pre0, pre1) {
				t.Fatalf("both ranks had the same gradients; the test needs different ones to check a sum")
			}
			for r := 0; r < 2; r++ {
				post := read("post", r)
				if len(post) != len(pre0) {
					t.Fatalf("rank %d: %d gradient values after, %d before", r, len(post), len(pre0))
				}
				for i := range post {
					want := pre0[i] + pre1[i]
					if math.Abs(float64(post[i]-want)) > 1e-6*math.Max(1, math.Abs(float64(want))) {
						t.Fatalf("rank %d: gradient value %d is %g after the all-reduce, want %g + %g = %g (the sum over ranks)",
							r, i, post[i], pre0[i], pre1[i], want)
					}
				}
			}
			p0, p1 := read("params", 0), read("params", 1)
			if !slicesEqual(p0, p1) {
				t.Fatalf("the ranks' parameters differ after the same AdamW step on all-reduced gradients: the replicas drifted apart")
			}
		})
	}
}

func slicesEqual(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// A rank that dies (SIGKILL, no clean-up) makes the survivor's next
// collective fail promptly with an error naming the operation, rather than
// hang; later calls report the same failure, and Close returns: for a byte
// collective and for the gradient all-reduce (recal's own Gloo work items
// on the CPU).
func TestDistDeadPeer(t *testing.T) {
	if os.Getenv(helperEnv) != "" {
		t.Skip("inside a helper rank")
	}
	for _, scenario := range []string{"dead-peer", "dead-peer-grads", "dead-peer-large"} {
		t.Run(scenario, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cmds, outs := launch(t, ctx, scenario, t.TempDir(), 2)
			err1 := cmds[1].Wait()
			var ee *exec.ExitError
			if !errors.As(err1, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("rank 1 should have died of SIGKILL, got %v\n%s", err1, outs[1])
			}
			if err := cmds[0].Wait(); err != nil {
				t.Fatalf("surviving rank 0: %v\n%s", err, outs[0])
			}
			t.Logf("rank 0:\n%s", outs[0])
		})
	}
}

// Under torchrun's agent store (its static rendezvous) the launcher serves
// the store on MASTER_PORT and every rank, rank 0 included, must join as a
// client under "/worker/attempt_<restart count>": a rank 0 that tried to
// serve would find the port taken. The test plays the agent.
func TestDistAgentStore(t *testing.T) {
	if os.Getenv(helperEnv) != "" {
		t.Skip("inside a helper rank")
	}
	srv, err := torchbridge.ServeStore(0, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmds, outs := launchAt(t, ctx, "agent-store", t.TempDir(), 2, srv.Port(),
		"TORCHELASTIC_USE_AGENT_STORE=True", "TORCHELASTIC_RESTART_COUNT=3")
	for r, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("rank %d under the agent's store: %v\n%s", r, err, outs[r])
		}
	}
	// A second attempt (torchrun restarted the workers) on the same store
	// starts afresh under its own prefix.
	cmds, outs = launchAt(t, ctx, "agent-store", t.TempDir(), 2, srv.Port(),
		"TORCHELASTIC_USE_AGENT_STORE=True", "TORCHELASTIC_RESTART_COUNT=4")
	for r, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("rank %d, second attempt on the agent's store: %v\n%s", r, err, outs[r])
		}
	}
}

// TestDistHelper is one rank of a multi-rank test; it runs only when a test
// above launched it.
func TestDistHelper(t *testing.T) {
	scenario := os.Getenv(helperEnv)
	if scenario == "" {
		t.Skip("run by TestDistTwoRanks and TestDistDeadPeer as a rank")
	}
	threads := 1
	if v := os.Getenv("RECAL_DIST_THREADS"); v != "" {
		threads, _ = strconv.Atoi(v)
	}
	if err := torchbridge.SetThreads(threads); err != nil {
		t.Fatal(err)
	}
	l, err := procgroup.FromEnv()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// The dead-peer scenarios measure the group's 5 s timeout; the others
	// only need their peers, which a loaded machine (3 ranks on 2 cores, a
	// second test run beside them) can take longer than 5 s to start.
	timeout := 60 * time.Second
	if strings.HasPrefix(scenario, "dead-peer") {
		timeout = 5 * time.Second
	}
	g, err := torchbridge.NewProcessGroup(ctx, torchbridge.GroupOptions{
		Rank: l.Rank, WorldSize: l.WorldSize, MasterAddr: l.MasterAddr, MasterPort: l.MasterPort, StorePrefix: l.StorePrefix,
		Timeout: timeout, BucketBytes: 5000, // several buckets, some holding one parameter larger than a bucket
	})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if g.Rank() != l.Rank || g.Size() != l.WorldSize {
		t.Fatalf("group is rank %d of %d, launched as %d of %d", g.Rank(), g.Size(), l.Rank, l.WorldSize)
	}
	switch scenario {
	case "collectives":
		helperCollectives(t, ctx, g, os.Getenv("RECAL_DIST_DIR"))
	case "dead-peer":
		helperDeadPeer(t, ctx, g, false, 0)
	case "dead-peer-grads":
		helperDeadPeer(t, ctx, g, true, 0)
	case "dead-peer-large":
		helperDeadPeer(t, ctx, g, false, 16<<20)
	case "zero":
		helperZeRO(t, ctx, g, os.Getenv("RECAL_DIST_DIR"))
	case "zero-resume":
		helperZeROResume(t, ctx, g, os.Getenv("RECAL_DIST_DIR"))
	case "agent-store":
		if !strings.HasPrefix(l.StorePrefix, "/worker/attempt_") {
			t.Fatalf("launched with TORCHELASTIC_USE_AGENT_STORE=True, the store prefix is %q, want torchrun's /worker/attempt_N", l.StorePrefix)
		}
		parts, err := g.AllGather(ctx, []byte{byte(g.Rank())})
		if err != nil || len(parts) != 2 || parts[0][0] != 0 || parts[1][0] != 1 {
			t.Fatalf("all-gather under the agent's store: %v, %v; want [[0] [1]]", parts, err)
		}
		if err := g.Barrier(ctx); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("unknown scenario %q", scenario)
	}
}

func helperCollectives(t *testing.T, ctx context.Context, g *torchbridge.ProcessGroup, dir string) {
	rank := g.Rank()
	for round := 0; round < 2; round++ {
		parts, err := g.AllGather(ctx, pattern(rank, round))
		if err != nil {
			t.Fatal(err)
		}
		for r := range parts {
			if !bytes.Equal(parts[r], pattern(r, round)) {
				t.Fatalf("all-gather round %d: rank %d's part has %d bytes, want its %d-byte payload", round, r, len(parts[r]), len(pattern(r, round)))
			}
		}
	}
	if parts, err := g.AllGather(ctx, nil); err != nil || len(parts) != 2 || len(parts[0])+len(parts[1]) != 0 {
		t.Fatalf("all-gather of nothing: %v, %v; want two empty parts", parts, err)
	}
	for _, root := range []int{1, 0} {
		payload := pattern(root+7, 0)
		if root == 0 {
			payload = nil // an empty broadcast
		}
		in := payload
		if rank != root {
			in = []byte("ignored: read on the root only")
		}
		got, err := g.Broadcast(ctx, in, root)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, payload) {
			t.Fatalf("broadcast from %d: got %d bytes, want the root's %d", root, len(got), len(payload))
		}
	}
	if _, err := g.Broadcast(ctx, nil, 2); err == nil || !strings.Contains(err.Error(), "root 2") {
		t.Fatalf("broadcast from root 2 of 2: %v, want an error naming the root", err)
	}
	if err := g.Barrier(ctx); err != nil {
		t.Fatal(err)
	}

	for _, c := range helperCases {
		p, err := torchbridge.NewPolicy(tinyConfig(64, c.tied), torchbridge.Options{DType: c.dtype})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if err := p.InitRandom(11, 0.2); err != nil { // the same weights on every rank
			t.Fatal(err)
		}
		if !(c.noGradOn1 && rank == 1) {
			rng := rand.New(rand.NewSource(int64(100 + rank))) // different data per rank
			var seqs []torchbridge.Sequence
			for b := 0; b < 3; b++ {
				toks := randomSeq(rng, 9+b, 64)
				mask := make([]float32, len(toks))
				for i := 3; i < len(mask); i++ {
					mask[i] = 1
				}
				seqs = append(seqs, torchbridge.Sequence{Tokens: toks, Mask: mask, Advantage: float32(b) - 1 + 0.5*float32(rank)})
			}
			if _, err := p.Backward(ctx, seqs, torchbridge.LossOptions{ClipEps: 0.2, Scale: 0.1}); err != nil {
				t.Fatal(err)
			}
		}
		dump := func(what string, prefix string) {
			var buf []byte
			for _, pr := range p.Params() {
				b := make([]byte, 4*pr.Numel())
				if err := p.GetParam(prefix+pr.Name, "F32", b); err != nil {
					t.Fatal(err)
				}
				buf = append(buf, b...)
			}
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%s-%d", c.name, what, rank)), buf, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		dump("pre", "grad/")
		if err := g.AllReduceGrads(ctx, p); err != nil {
			t.Fatal(err)
		}
		dump("post", "grad/")
		if _, err := p.Step(ctx, torchbridge.AdamW{LR: 1e-2, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.1, MaxGradNorm: 1}); err != nil {
			t.Fatal(err)
		}
		dump("params", "")
	}
	helperTwoPolicies(t, ctx, g)
	if err := g.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if err := g.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := g.AllGather(ctx, []byte("x")); !errors.Is(err, torchbridge.ErrClosed) {
		t.Fatalf("all-gather after Close: %v, want ErrClosed", err)
	}
}

// After an all-reduce a policy's gradients live in the group's buckets: an
// all-reduce of a second policy must not overwrite them, and a second
// all-reduce of the first (gradients already in place) must sum again.
func helperTwoPolicies(t *testing.T, ctx context.Context, g *torchbridge.ProcessGroup) {
	grads := func(p *torchbridge.Policy) []float32 {
		var all []float32
		for _, pr := range p.Params() {
			all = append(all, getF32(t, p, "grad/"+pr.Name, pr.Numel())...)
		}
		return all
	}
	var pols []*torchbridge.Policy
	for i := 0; i < 2; i++ {
		p := newTinyOn(t, "cpu", 64, true, 5) // the ranks share the machine (and Gloo runs on the CPU)
		seq := []int32{1, 2, 3, 4, 5, int32(10 + 7*i + g.Rank())}
		if _, _, err := p.BackwardNLL(ctx, [][]int32{seq}, [][]float32{{0, 1, 1, 1, 1, 1}}, 1, 0); err != nil {
			t.Fatal(err)
		}
		pols = append(pols, p)
	}
	if err := g.AllReduceGrads(ctx, pols[0]); err != nil {
		t.Fatal(err)
	}
	first := grads(pols[0])
	if err := g.AllReduceGrads(ctx, pols[1]); err != nil {
		t.Fatal(err)
	}
	if !slicesEqual(first, grads(pols[0])) {
		t.Fatalf("all-reducing a second policy changed the first one's reduced gradients")
	}
	if err := g.AllReduceGrads(ctx, pols[0]); err != nil {
		t.Fatal(err)
	}
	again := grads(pols[0])
	for i := range again {
		if again[i] != 2*first[i] {
			t.Fatalf("a second all-reduce of equal gradients on both ranks gave %g at %d, want 2 × %g", again[i], i, first[i])
		}
	}
}

// helperDeadPeer: with large > 0, the survivor sends large bytes at once,
// still writing when the peer dies: writes into a reset connection raise
// SIGPIPE on Gloo's own threads (the survivor must report the failed
// collective, not die of the signal).
func helperDeadPeer(t *testing.T, ctx context.Context, g *torchbridge.ProcessGroup, grads bool, large int) {
	p := newTinyOn(t, "cpu", 64, true, 1)
	if grads { // gradients in the buckets, then a backward the dead peer never sums
		for i := 0; i < 2; i++ {
			if _, _, err := p.BackwardNLL(ctx, [][]int32{{1, 2, 3, 4}}, [][]float32{{0, 1, 1, 1}}, 1, 0); err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				if err := g.AllReduceGrads(ctx, p); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if err := g.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	if g.Rank() == 1 {
		syscall.Kill(os.Getpid(), syscall.SIGKILL) // die without closing anything
		time.Sleep(time.Minute)
	}
	msg := []byte("anyone there?")
	if large > 0 {
		msg = make([]byte, large)
	}
	op, call := "allgather", func() error {
		_, err := g.AllGather(ctx, msg)
		return err
	}
	if grads {
		op, call = "allreduce_grads", func() error { return g.AllReduceGrads(ctx, p) }
	}
	start := time.Now()
	err := call()
	took := time.Since(start)
	t.Logf("%s with a dead peer: %v after %v", op, err, took)
	if err == nil || !strings.Contains(err.Error(), op+" (rank 0 of 2)") {
		t.Fatalf("%s with a dead peer: %v, want an error naming the %s and the rank", op, err, op)
	}
	if took > 5*time.Second+2*time.Second {
		t.Fatalf("the error took %v, more than the group's 5 s timeout", took)
	}
	err = g.AllReduceGrads(ctx, p)
	if err == nil || !strings.Contains(err.Error(), "the group failed earlier: "+op) {
		t.Fatalf("all-reduce after the failure: %v, want the earlier failure", err)
	}
	start = time.Now()
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("Close took %v", time.Since(start))
}

// In one process: a group of one works (collectives are identities), and
// bad options or a missing peer give errors naming the problem.
func TestProcessGroupOneProcess(t *testing.T) {
	if os.Getenv(helperEnv) != "" {
		t.Skip("inside a helper rank")
	}
	ctx := context.Background()
	g, err := torchbridge.NewProcessGroup(ctx, torchbridge.GroupOptions{WorldSize: 1, MasterPort: ranktest.FreePort(t), Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	parts, err := g.AllGather(ctx, []byte("only me"))
	if err != nil || len(parts) != 1 || string(parts[0]) != "only me" {
		t.Fatalf("all-gather in a group of one: %q, %v", parts, err)
	}
	if b, err := g.Broadcast(ctx, []byte("me"), 0); err != nil || string(b) != "me" {
		t.Fatalf("broadcast in a group of one: %q, %v", b, err)
	}
	if err := g.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	p := newTinyOn(t, "cpu", 64, true, 3) // Gloo's gradients are on the CPU (TestDeviceNCCLOneRank: NCCL's)
	if _, _, err := p.BackwardNLL(ctx, [][]int32{{1, 2, 3, 4}}, [][]float32{{0, 1, 1, 1}}, 1, 0); err != nil {
		t.Fatal(err)
	}
	name := "grad/" + p.Params()[0].Name
	before := getF32(t, p, name, p.Params()[0].Numel())
	if err := g.AllReduceGrads(ctx, p); err != nil {
		t.Fatal(err)
	}
	if !slicesEqual(before, getF32(t, p, name, p.Params()[0].Numel())) {
		t.Fatalf("the all-reduce over one rank changed the gradient")
	}
	// ZeRO-2 needs ranks to shard over: a group of one is refused, naming why.
	if err := p.ShardOptimizer(0, 1); err != nil {
		t.Fatal(err)
	}
	if err := g.PrepareUpdate(ctx, p); err != nil {
		t.Fatal(err)
	}
	if err := g.ShardGradients(ctx, p, true); err == nil || !strings.Contains(err.Error(), "at least 2") {
		t.Fatalf("sharded gradients over one rank: %v, want an error asking for at least 2 ranks", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := g.Barrier(cancelled); !errors.Is(err, context.Canceled) {
		t.Fatalf("barrier with a cancelled ctx: %v, want context.Canceled", err)
	}
	g.Close()
	if err := g.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := g.Barrier(ctx); !errors.Is(err, torchbridge.ErrClosed) {
		t.Fatalf("barrier after Close: %v, want ErrClosed", err)
	}

	port := ranktest.FreePort(t)
	tests := []struct {
		name string
		ctx  context.Context
		opt  torchbridge.GroupOptions
		want string
	}{
		{"rank past world", ctx, torchbridge.GroupOptions{Rank: 2, WorldSize: 2, MasterPort: port}, "rank 2: want 0 to 1"},
		{"no ranks", ctx, torchbridge.GroupOptions{WorldSize: 0, MasterPort: port}, "world size 0"},
		{"no port", ctx, torchbridge.GroupOptions{WorldSize: 1}, "master port 0"},
		{"unknown backend", ctx, torchbridge.GroupOptions{WorldSize: 1, MasterPort: port, Backend: "mpi"}, `backend "mpi": want gloo or nccl`},
		{"negative timeout", ctx, torchbridge.GroupOptions{WorldSize: 1, MasterPort: port, Timeout: -time.Second}, "timeout -1s"},
		{"cancelled", cancelled, torchbridge.GroupOptions{WorldSize: 1, MasterPort: port}, "context canceled"},
		// Rank 0 of 2 alone: the rendezvous times out, naming where.
		{"missing peer", ctx, torchbridge.GroupOptions{WorldSize: 2, MasterPort: port, Timeout: 1500 * time.Millisecond},
			fmt.Sprintf("process group at 127.0.0.1:%d (rank 0 of 2, gloo): rendezvous: ", port)},
	}
	if cuda, _ := torchbridge.CUDAAvailable(); !cuda {
		tests = append(tests, struct {
			name string
			ctx  context.Context
			opt  torchbridge.GroupOptions
			want string
		}{"nccl without CUDA", ctx, torchbridge.GroupOptions{WorldSize: 1, MasterPort: port, Backend: "nccl"}, `backend "nccl"`})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			g, err := torchbridge.NewProcessGroup(tt.ctx, tt.opt)
			if err == nil {
				g.Close()
				t.Fatalf("NewProcessGroup(%+v) succeeded, want an error containing %q", tt.opt, tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("NewProcessGroup(%+v) error = %v, want one containing %q", tt.opt, err, tt.want)
			}
			if tt.opt.Timeout > 0 && time.Since(start) > tt.opt.Timeout+5*time.Second {
				t.Fatalf("the error took %v with a %v timeout", time.Since(start), tt.opt.Timeout)
			}
			t.Logf("after %v: %v", time.Since(start).Round(time.Millisecond), err)
		})
	}
}

// Once the gradient sums live in buckets, the first backward after a step
// (or after PrepareUpdate made them) adds the output head's gradient
// straight into the zeroed sums, and the embedding's backward adds its rows
// in place, instead of adding dense [vocab, hidden] gradients whole. A policy all-reduced in a group of one
// must still follow, bit for bit, the same policy trained without a group
// (whose sums are tensors of their own): float32 and bfloat16, tied and
// untied, repeated tokens (their rows summed in order), two micro-batches
// per step, a ZeroGrad that drops a backward, and a value head added once
// the buckets exist.
func TestBucketedGradientsMatchUnbucketed(t *testing.T) {
	if os.Getenv(helperEnv) != "" {
		t.Skip("inside a helper rank")
	}
	ctx := context.Background()
	g, err := torchbridge.NewProcessGroup(ctx, torchbridge.GroupOptions{WorldSize: 1, MasterPort: ranktest.FreePort(t),
		Timeout: 5 * time.Second, BucketBytes: 5000}) // several buckets
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for _, dtype := range []string{"float32", "bfloat16"} {
		for _, tied := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s-tied=%v", dtype, tied), func(t *testing.T) {
				var pols [2]*torchbridge.Policy // 0: no group; 1: all-reduced in the group of one
				for i := range pols {
					p, err := torchbridge.NewPolicy(tinyConfig(64, tied), torchbridge.Options{DType: dtype})
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { p.Close() })
					if err := p.InitRandom(7, 0.2); err != nil {
						t.Fatal(err)
					}
					pols[i] = p
				}
				// The buckets made before the first backward (as recal train
				// does): the first step's backward writes into them too.
				if err := g.PrepareUpdate(ctx, pols[1]); err != nil {
					t.Fatal(err)
				}
				state := func(p *torchbridge.Policy, prefix string) []float32 {
					var all []float32
					for _, pr := range p.Params() {
						all = append(all, getF32(t, p, prefix+pr.Name, pr.Numel())...)
					}
					return all
				}
				for step := 0; step < 4; step++ {
					ppo := step >= 2
					if step == 2 {
						for _, p := range pols {
							if err := p.AddValueHead(); err != nil {
								t.Fatal(err)
							}
						}
					}
					rng := rand.New(rand.NewSource(int64(step)))
					batch := func() []torchbridge.Sequence {
						var seqs []torchbridge.Sequence
						for b := 0; b < 3; b++ {
							toks := randomSeq(rng, 9+b, 12) // 12 of 64 tokens: repeats, and rows no token touches
							s := torchbridge.Sequence{Tokens: toks, Mask: make([]float32, len(toks)), Advantage: float32(b) - 1}
							for i := 3; i < len(toks); i++ {
								s.Mask[i] = 1
							}
							if ppo {
								s.TokenAdv, s.Returns = make([]float32, len(toks)), make([]float32, len(toks))
								for i := range toks {
									s.TokenAdv[i], s.Returns[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
								}
							}
							seqs = append(seqs, s)
						}
						return seqs
					}
					micro := [][]torchbridge.Sequence{batch(), batch()}
					dropped := batch()
					opt := torchbridge.LossOptions{ClipEps: 0.2, EntropyCoef: 0.01, Scale: 0.1, VFCoef: 0.5}
					for i, p := range pols {
						if ppo { // a backward dropped by ZeroGrad (at step 2 before the value head is in a bucket)
							if _, err := p.Backward(ctx, dropped, opt); err != nil {
								t.Fatal(err)
							}
							if err := p.ZeroGrad(ctx); err != nil {
								t.Fatal(err)
							}
						}
						for _, seqs := range micro {
							if _, err := p.Backward(ctx, seqs, opt); err != nil {
								t.Fatal(err)
							}
						}
						if i == 1 {
							if err := g.AllReduceGrads(ctx, p); err != nil {
								t.Fatal(err)
							}
						}
					}
					if !slicesEqual(state(pols[0], "grad/"), state(pols[1], "grad/")) {
						t.Fatalf("step %d: the bucketed policy's gradients differ from the unbucketed one's after the same backward passes: "+
							"data-parallel ranks would not compute what one process computes", step)
					}
					for _, p := range pols {
						if _, err := p.Step(ctx, torchbridge.AdamW{LR: 1e-2, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.1, MaxGradNorm: 1}); err != nil {
							t.Fatal(err)
						}
					}
					if !slicesEqual(state(pols[0], ""), state(pols[1], "")) {
						t.Fatalf("step %d: the bucketed policy's weights differ from the unbucketed one's after the same step", step)
					}
				}
			})
		}
	}
}

// A tied policy's embedding gradient is the output head's plus the token
// embedding's, added once per backward call: bit for bit what an untied twin
// with both matrices equal computes apart (its embedding's gradient from
// autograd's dense embedding backward), whether the rows go into a head
// gradient of the call's own, or, in a group, straight into the zeroed sum.
func TestTiedGradientIsHeadPlusEmbedding(t *testing.T) {
	if os.Getenv(helperEnv) != "" {
		t.Skip("inside a helper rank")
	}
	ctx := context.Background()
	g, err := torchbridge.NewProcessGroup(ctx, torchbridge.GroupOptions{WorldSize: 1, MasterPort: ranktest.FreePort(t),
		Timeout: 5 * time.Second, BucketBytes: 5000})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	const embed, head = "model.embed_tokens.weight", "lm_head.weight"
	for _, dtype := range []string{"float32", "bfloat16"} {
		for _, grouped := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s-grouped=%v", dtype, grouped), func(t *testing.T) {
				newPolicy := func(tied bool) *torchbridge.Policy {
					p, err := torchbridge.NewPolicy(tinyConfig(64, tied), torchbridge.Options{DType: dtype})
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { p.Close() })
					return p
				}
				tied, twin := newPolicy(true), newPolicy(false)
				if err := tied.InitRandom(9, 0.2); err != nil {
					t.Fatal(err)
				}
				for _, pr := range tied.Params() {
					v := getF32(t, tied, pr.Name, pr.Numel())
					setF32(t, twin, pr.Name, v)
					if pr.Name == embed {
						setF32(t, twin, head, v)
					}
				}
				rng := rand.New(rand.NewSource(3))
				batch := func() []torchbridge.Sequence {
					var seqs []torchbridge.Sequence
					for b := 0; b < 2; b++ {
						toks := randomSeq(rng, 10, 12) // repeated tokens
						s := torchbridge.Sequence{Tokens: toks, Mask: make([]float32, len(toks)), Advantage: float32(b) - 0.5}
						for i := 2; i < len(toks); i++ {
							s.Mask[i] = 1
						}
						seqs = append(seqs, s)
					}
					return seqs
				}
				opt := torchbridge.LossOptions{ClipEps: 0.2, EntropyCoef: 0.01, Scale: 0.1}
				if grouped { // the sums into buckets, then zeroed: the next backward writes into them
					if _, err := tied.Backward(ctx, batch(), opt); err != nil {
						t.Fatal(err)
					}
					if err := g.AllReduceGrads(ctx, tied); err != nil {
						t.Fatal(err)
					}
					if err := tied.ZeroGrad(ctx); err != nil {
						t.Fatal(err)
					}
				}
				var n int64
				for _, pr := range tied.Params() {
					if pr.Name == embed {
						n = pr.Numel()
					}
				}
				var want []float32 // the tied sum so far
				for micro := 0; micro < 2; micro++ {
					seqs := batch()
					for _, p := range []*torchbridge.Policy{tied, twin} {
						if _, err := p.Backward(ctx, seqs, opt); err != nil {
							t.Fatal(err)
						}
					}
					h, e := getF32(t, twin, "grad/"+head, n), getF32(t, twin, "grad/"+embed, n)
					for i := range h {
						v := h[i] + e[i] // the call's head and embedding gradients, added once
						if micro == 0 {
							want = append(want, v)
						} else {
							want[i] += v
						}
					}
					if got := getF32(t, tied, "grad/"+embed, n); !slicesEqual(got, want) {
						t.Fatalf("backward %d: the tied gradient differs from the untied twin's head + embedding gradients: "+
							"the embedding's rows were not summed as autograd's dense gradient sums them", micro)
					}
					if err := twin.ZeroGrad(ctx); err != nil {
						t.Fatal(err)
					}
				}
			})
		}
	}
}

// Data-parallel ranks, and one process from one run to the next, group a
// step's rows into decode calls differently (pool replies arrive when they
// do). With log-probs asked for (training rollouts) a row's logits must be
// the same bits whatever rows share its call, whatever the thread count and
// whatever BLAS kernel the machine runs (make test-kernels runs this test
// under several OpenBLAS core types), or the rollouts' log-probs, and
// through the loss's ratio the weights, drift between runs. On CUDA the
// invariance cannot hold (libtorch's reductions pick their strategy by
// shape): there the rows must agree within cudaBound.
func TestLogpIndependentOfBatching(t *testing.T) {
	ctx := context.Background()
	cfg := tinyConfig(4032, true)
	cfg.HiddenSize, cfg.IntermediateSize, cfg.NumAttentionHeads, cfg.NumKeyValueHeads = 128, 384, 4, 2
	p, err := torchbridge.NewPolicy(cfg, onDevice(torchbridge.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.InitRandom(3, 0.2); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewSource(9))
	var prompts [][]int32
	// Rows 0, 5, 7 and rows 1, 6 have equal lengths throughout: rows of a
	// GRPO group look like that, and attending batched they would get other
	// bits (libtorch's batched product rounds rows of 9 or more columns
	// differently from one row alone: tried and rejected).
	for _, n := range []int{5, 9, 3, 12, 7, 5, 9, 5} {
		prompts = append(prompts, randomSeq(r, n, 4032))
	}
	s := torchbridge.Sampling{Temperature: 1}
	decode := func(groups [][]int, logp bool, workers int) [][][]float32 {
		c, err := p.NewCache(len(prompts), 64)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		out := make([][][]float32, len(prompts))
		feed := append([][]int32{}, prompts...)
		for step := 0; step < 8; step++ {
			for _, g := range groups {
				st := torchbridge.Step{Rows: g, Sampling: s, Seed: 5, WantLogp: logp, WantLogits: true, Workers: workers}
				for _, row := range g {
					st.Tokens = append(st.Tokens, feed[row])
				}
				res, err := c.Extend(ctx, st)
				if err != nil {
					t.Fatal(err)
				}
				if want := min(max(workers, 1), len(g), runtime.NumCPU()); res.Workers != want && !strings.HasPrefix(testDevice, "cuda") {
					t.Fatalf("%d rows with Workers %d ran on %d threads, want %d", len(g), workers, res.Workers, want)
				}
				for k, row := range g {
					out[row] = append(out[row], append(append([]float32{}, res.Logits[k]...), res.Logp[k]))
					feed[row] = []int32{res.Next[k]}
				}
			}
		}
		return out
	}
	compositions := map[string][][]int{
		"together": {{0, 1, 2, 3, 4, 5, 6, 7}},
		"alone":    {{3}, {0}, {4}, {1}, {2}, {7}, {5}, {6}},
		"pairs":    {{1, 0}, {2, 3}, {4, 7}, {6, 5}},
		"gapped":   {{0, 2, 4, 6}, {3, 1, 5, 7}},
		"equal":    {{5, 7, 0}, {1, 6}, {2, 3, 4}},
	}
	ref := decode(compositions["together"], true, 1)
	threads, err := torchbridge.Threads()
	if err != nil {
		t.Fatal(err)
	}
	defer torchbridge.SetThreads(threads)
	const cudaBound = 1e-3 // |Δ| of a logit or log-prob between compositions on CUDA (float32)
	for _, name := range []string{"alone", "pairs", "gapped", "equal", "together, 1 thread", "together, 2 workers", "together, 3 workers", "gapped, 2 workers"} {
		comp, workers := name, 1
		if c, w, ok := strings.Cut(name, ", "); ok {
			comp = c
			if strings.HasSuffix(w, "workers") {
				workers = int(w[0] - '0')
			}
		}
		if (workers > 1 || strings.HasSuffix(name, "1 thread")) && threads != 1 {
			// Row-parallel calls (Step.Workers) split a call's rows among
			// threads that run libtorch on one thread each, and only while
			// it runs one thread. The kernels' own threads split the
			// outputs of a product, never one output's arithmetic: one
			// thread computes the bits threads did (compared with ref).
			if err := torchbridge.SetThreads(1); err != nil {
				t.Fatal(err)
			}
			threads = 1
		}
		got := decode(compositions[comp], true, workers)
		differ, first, maxd := 0, "", 0.0
		for row := range got {
			for step := range got[row] {
				if !slicesEqual(got[row][step], ref[row][step]) {
					if differ == 0 {
						first = fmt.Sprintf("row %d step %d", row, step)
					}
					differ++
					for k, v := range got[row][step] {
						maxd = math.Max(maxd, math.Abs(float64(v-ref[row][step][k])))
					}
				}
			}
		}
		if differ == 0 {
			continue
		}
		msg := fmt.Sprintf("%s: %d of %d row steps (first: %s) differ from the rows decoded together on %d thread(s), by up to %.3g in a logit or log-prob: a rollout's log-probs would depend on the rows sharing its decode call", name, differ, len(got)*len(got[0]), first, threads, maxd)
		if strings.HasPrefix(testDevice, "cuda") {
			// libtorch's CUDA reductions (the norms' means, softmax,
			// logsumexp) pick their strategy by the tensor's shape, so
			// the rows of one call are not bit-for-bit those of another:
			// the invariance holds on the CPU only; on CUDA, a bound.
			if maxd > cudaBound {
				t.Errorf("on %s, beyond the bound %g: %s", testDevice, cudaBound, msg)
			} else {
				t.Logf("on %s (within %g, not bit for bit): %s", testDevice, cudaBound, msg)
			}
			continue
		}
		t.Error(msg)
	}
	// The inference path (no log-probs: evaluation, serving) decodes by
	// the same kernels: its answers do not depend on eval.batch, ranks or
	// the requests that share a step either, and its logits are those of
	// the log-prob path.
	plain, alone := decode(compositions["together"], false, 1), decode(compositions["alone"], false, 1)
	differ, maxd := 0, 0.0
	for row := range plain {
		for step := range plain[row] {
			a, b, r := plain[row][step][:4032], alone[row][step][:4032], ref[row][step][:4032]
			if !slicesEqual(a, b) || !slicesEqual(a, r) {
				differ++
				for k := range a {
					maxd = math.Max(maxd, math.Max(math.Abs(float64(a[k]-b[k])), math.Abs(float64(a[k]-r[k]))))
				}
			}
		}
	}
	if differ > 0 {
		msg := fmt.Sprintf("inference path: %d of %d row steps' logits differ between rows decoded together, alone, and with log-probs, by up to %.3g: an evaluation's answers would depend on eval.batch", differ, len(plain)*len(plain[0]), maxd)
		if strings.HasPrefix(testDevice, "cuda") {
			if maxd > cudaBound {
				t.Errorf("on %s, beyond the bound %g: %s", testDevice, cudaBound, msg)
			}
			return
		}
		t.Error(msg)
	}
}

// TestCheckKernels: the row-invariant kernels' AVX2 path computes the bits
// of their portable path, for every tile shape and length tail, so the
// decoding of a row is the same function of its inputs on every x86 CPU
// recal runs on, vector unit or not.
func TestCheckKernels(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		vector, err := torchbridge.CheckKernels(seed)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if !vector {
			t.Skip("this CPU has no AVX2 and FMA: only the portable path runs, nothing to compare")
		}
	}
}
