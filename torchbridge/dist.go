package torchbridge

/*
#include <stdlib.h>
#include "recal.h"
*/
import "C"

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// sigpipeOnce makes a write to a peer's closed socket fail with EPIPE
// instead of killing the process. Gloo writes from threads of its own (not
// Go's); without a Go handler wanting SIGPIPE, the runtime re-raises it
// there with the default action, so a rank whose peer died could die of
// the signal instead of reporting the failed collective. (Python, and so
// PyTorch, ignores SIGPIPE from the start.) Wanted by Notify, the signal is
// dropped when the channel is full and the write returns EPIPE, which Gloo
// turns into an error; writes to standard output or error then also fail
// with EPIPE rather than end the process.
var sigpipeOnce sync.Once

func catchSIGPIPE() {
	sigpipeOnce.Do(func() { signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE) })
}

// GroupOptions say how this process joins a process group.
type GroupOptions struct {
	Rank       int           // this process, 0 ≤ Rank < WorldSize
	WorldSize  int           // number of processes
	MasterAddr string        // host of the rendezvous store that rank 0 serves; "127.0.0.1" when empty
	MasterPort int           // its TCP port
	Timeout    time.Duration // bound on the rendezvous and on every collective; 300 s when 0
	// Backend is "gloo" (the default: CPU) or "nccl" (CUDA builds only):
	// with nccl, gradients on a GPU are all-reduced over NCCL; byte
	// collectives and barriers always go over Gloo.
	Backend string
	// BucketBytes is the size of the float32 buckets of the gradient
	// all-reduce; 25 MiB (PyTorch DDP's default) when 0.
	BucketBytes int
	// StorePrefix, when not empty, says that the launcher serves the
	// rendezvous store at MasterAddr:MasterPort (torchrun's agent store,
	// TORCHELASTIC_USE_AGENT_STORE=True): every rank, rank 0 included,
	// connects as a client and keys its entries under this prefix
	// (torchrun's "/worker/attempt_<restart count>"). Empty: rank 0 serves
	// the store.
	StorePrefix string
}

// DefaultTimeout bounds the rendezvous and every collective of a group
// whose options leave Timeout at 0.
const DefaultTimeout = 300 * time.Second

// ProcessGroup is this process's membership in a group of data-parallel
// ranks on libtorch's c10d (cgo/recal_dist.cc): a TCPStore rendezvous that
// rank 0 (or the launcher, GroupOptions.StorePrefix) serves, then a ProcessGroupGloo (and a ProcessGroupNCCL for GPU
// gradients in CUDA builds). It implements procgroup.Group and, with a policy
// bound, procgroup.GradReducer.
//
// Every rank must call the same collectives in the same order. Calls on one
// group are serialised by a mutex, so concurrent callers cannot interleave
// halves of two collectives, but their order across ranks is the caller's
// to keep. Each collective waits at most the group's timeout, so a dead or
// stuck peer surfaces as an error naming the operation and the rank, never
// as a hang; after a failure the group is unusable (later calls return that
// failure) and should be closed. A ctx cancelled before a collective starts
// returns ctx.Err(); once started it runs to the end or to the timeout
// (c10d cannot abort it).
//
// Threads: the gradient all-reduce reads and writes the policy's gradients,
// so it runs on the torch thread like every other policy call. The byte
// collectives and Barrier run on the calling goroutine: they use only CPU
// buffers they copy in and out within the call and no thread-local torch
// state, and so do not hold up the torch thread while waiting for peers.
type ProcessGroup struct {
	mu         sync.Mutex // held for the length of each call; Close waits for it
	h          *C.rc_dist
	rank, size int
}

// NewProcessGroup joins a group: it blocks until all WorldSize ranks have
// joined, the timeout passes (an error naming the address and rank) or ctx
// is done (ctx.Err(); a rendezvous still under way is then left in the
// background and freed when it ends).
func NewProcessGroup(ctx context.Context, opt GroupOptions) (*ProcessGroup, error) {
	if opt.MasterAddr == "" {
		opt.MasterAddr = "127.0.0.1"
	}
	if opt.Timeout == 0 {
		opt.Timeout = DefaultTimeout
	}
	if opt.Backend == "" {
		opt.Backend = "gloo"
	}
	if opt.Timeout < 0 {
		return nil, fmt.Errorf("torchbridge: process group: timeout %v: want a positive duration", opt.Timeout)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	catchSIGPIPE()
	type result struct {
		h   *C.rc_dist
		err error
	}
	done := make(chan result, 1)
	go func() {
		addr, backend := C.CString(opt.MasterAddr), C.CString(opt.Backend)
		defer C.free(unsafe.Pointer(addr))
		defer C.free(unsafe.Pointer(backend))
		co := C.rc_dist_opts{
			rank: C.int32_t(opt.Rank), world_size: C.int32_t(opt.WorldSize),
			master_addr: addr, master_port: C.int32_t(opt.MasterPort),
			timeout_s: C.double(opt.Timeout.Seconds()), backend: backend,
			bucket_bytes: C.int64_t(opt.BucketBytes),
		}
		if opt.StorePrefix != "" {
			prefix := C.CString(opt.StorePrefix)
			defer C.free(unsafe.Pointer(prefix))
			co.store_prefix = prefix
		}
		var r result
		var msg *C.char
		r.err = status(C.rc_dist_new(&co, &r.h, &msg), msg)
		done <- r
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return nil, r.err
		}
		return &ProcessGroup{h: r.h, rank: opt.Rank, size: opt.WorldSize}, nil
	case <-ctx.Done():
		go func() {
			if r := <-done; r.h != nil {
				C.rc_dist_free(r.h)
			}
		}()
		return nil, ctx.Err()
	}
}

// Rank is this process's rank, in [0, Size()).
func (g *ProcessGroup) Rank() int { return g.rank }

// Size is the number of ranks.
func (g *ProcessGroup) Size() int { return g.size }

// begin takes the group for one call; the caller must unlock g.mu.
func (g *ProcessGroup) begin(ctx context.Context) error {
	g.mu.Lock()
	if g.h == nil {
		g.mu.Unlock()
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		g.mu.Unlock()
		return err
	}
	return nil
}

// onPolicy runs call, a bridge call on this group and p that reports its
// status with a message, on the torch thread while the group is held open.
func (g *ProcessGroup) onPolicy(ctx context.Context, p *Policy, call func(h *C.rc_policy, msg **C.char) C.int) error {
	if err := g.begin(ctx); err != nil {
		return err
	}
	defer g.mu.Unlock()
	return p.call(ctx, func(h *C.rc_policy) error {
		var msg *C.char
		return status(call(h, &msg), msg)
	})
}

// AllReduceGrads replaces the accumulated gradients of p with their sum over
// the ranks (in float32; a rank without a gradient adds zeros), so that the
// same optimizer step on every rank keeps the replicas identical. Every rank
// passes a policy of the same shapes. It runs on the torch thread. The
// first call moves p's gradient sums into float32 buckets of
// GroupOptions.BucketBytes, where p keeps them from then on (PyTorch DDP's
// gradient_as_bucket_view: later backward passes add into them, and each
// step zeroes them); every call all-reduces the buckets in place, all of
// them started before any is waited for. On the CPU with Debian's libtorch,
// Gloo's ring runs each bucket in pipeline steps of up to 4 MiB instead of
// c10d's 1 MiB (cgo/recal_dist.cc, SegmentedAllreduce): the same messages'
// bytes in fewer hand-overs, faster for a bucket as large as the embedding.
func (g *ProcessGroup) AllReduceGrads(ctx context.Context, p *Policy) error {
	return g.onPolicy(ctx, p, func(h *C.rc_policy, msg **C.char) C.int { return C.rc_dist_allreduce_grads(g.h, h, msg) })
}

// PrepareUpdate is Policy.PrepareUpdate that also makes p's float32
// gradient sums the buckets AllReduceGrads all-reduces (of
// GroupOptions.BucketBytes), zeroed, before the first backward instead of
// at the first all-reduce. Backwards then add into them; no value changes.
// Local: no communication.
func (g *ProcessGroup) PrepareUpdate(ctx context.Context, p *Policy) error {
	return g.onPolicy(ctx, p, func(h *C.rc_policy, msg **C.char) C.int { return C.rc_dist_prepare_update(g.h, h, msg) })
}

// GatherParams gives every rank the parameter elements the other ranks
// updated, after Policy.Step on a policy whose optimizer state is sharded
// over this group (Policy.ShardOptimizer(g.Rank(), g.Size())): ZeRO-1's
// all-gather of the parameters, in rounds of about GroupOptions.BucketBytes
// of parameters (its buffers hold one round). A no-op for a policy sharded
// over one rank.
func (g *ProcessGroup) GatherParams(ctx context.Context, p *Policy) error {
	return g.onPolicy(ctx, p, func(h *C.rc_policy, msg **C.char) C.int { return C.rc_dist_gather_params(g.h, h, msg) })
}

// ShardGradients turns ZeRO-2 on (or off) for p on the CPU: p's float32
// gradient sums, already in buckets (PrepareUpdate) and with its optimizer
// state sharded over this group (Policy.ShardOptimizer(g.Rank(),
// g.Size())), are sharded too. AllReduceGrads (and a backward armed by
// ReduceInBackward) all-reduces each bucket as before, keeps the terms of
// the gradient norm Policy.Step clips by, and gives back the bucket's pages
// that hold none of this rank's shares; the step reads only this rank's
// shares. The same weights bit for bit as ZeRO-1. Closing the group or the
// policy ends it. Local: no communication.
func (g *ProcessGroup) ShardGradients(ctx context.Context, p *Policy, on bool) error {
	var v C.int32_t
	if on {
		v = 1
	}
	return g.onPolicy(ctx, p, func(h *C.rc_policy, msg **C.char) C.int { return C.rc_dist_shard_gradients(g.h, h, v, msg) })
}

// ReduceInBackward arms p's next backward, the last of this rank's update
// before AllReduceGrads, under ShardGradients: with checkpointed layers
// (Policy.SetCheckpointing) it all-reduces each bucket as soon as the
// backward has made every gradient in it, from the top layer down, and
// gives back its pages outside this rank's shares, so that the whole sums
// never exist at once; AllReduceGrads, which every rank then calls,
// reduces the rest. Every rank reduces the buckets in the same order
// wherever it does, so a rank that arms no backward still meets the
// others. Local: no communication until the backward.
func (g *ProcessGroup) ReduceInBackward(ctx context.Context, p *Policy) error {
	return g.onPolicy(ctx, p, func(h *C.rc_policy, msg **C.char) C.int { return C.rc_dist_reduce_in_backward(g.h, h, msg) })
}

// GatherState gathers a sharded policy's whole optimizer state on rank
// root, where SaveOptimizer can then write it; every rank calls it, and
// root calls DropGatheredState when the checkpoint is written. A no-op for
// an unsharded policy.
func (g *ProcessGroup) GatherState(ctx context.Context, p *Policy, root int) error {
	if root < 0 || root >= g.size {
		return fmt.Errorf("torchbridge: gather state: root %d of %d ranks", root, g.size)
	}
	return g.onPolicy(ctx, p, func(h *C.rc_policy, msg **C.char) C.int { return C.rc_dist_gather_state(g.h, h, C.int32_t(root), msg) })
}

// DropGatheredState frees what GatherState gathered on this rank.
func (g *ProcessGroup) DropGatheredState(ctx context.Context, p *Policy) error {
	return g.onPolicy(ctx, p, func(h *C.rc_policy, msg **C.char) C.int { return C.rc_dist_gather_state(g.h, h, -1, msg) })
}

// AllGather returns every rank's data, of any length, in rank order; this
// rank's own data is included (as a copy).
func (g *ProcessGroup) AllGather(ctx context.Context, data []byte) ([][]byte, error) {
	if err := g.begin(ctx); err != nil {
		return nil, err
	}
	defer g.mu.Unlock()
	lens := make([]int64, g.size)
	var out unsafe.Pointer
	var msg *C.char
	rc := C.rc_dist_allgather(g.h, bytesPtr(data), C.int64_t(len(data)), &out, ptrI64(lens), &msg)
	if err := status(rc, msg); err != nil {
		return nil, err
	}
	var total int64
	for _, n := range lens {
		total += n
	}
	all := cBytes(out, total)
	parts := make([][]byte, g.size)
	var off int64
	for r, n := range lens {
		parts[r] = all[off : off+n : off+n]
		off += n
	}
	return parts, nil
}

// Broadcast returns root's data on every rank; data is read on root only.
func (g *ProcessGroup) Broadcast(ctx context.Context, data []byte, root int) ([]byte, error) {
	if err := g.begin(ctx); err != nil {
		return nil, err
	}
	defer g.mu.Unlock()
	var out unsafe.Pointer
	var n C.int64_t
	var msg *C.char
	rc := C.rc_dist_broadcast(g.h, C.int32_t(root), bytesPtr(data), C.int64_t(len(data)), &out, &n, &msg)
	if err := status(rc, msg); err != nil {
		return nil, err
	}
	return cBytes(out, int64(n)), nil
}

// Barrier returns when every rank has reached it.
func (g *ProcessGroup) Barrier(ctx context.Context) error {
	if err := g.begin(ctx); err != nil {
		return err
	}
	defer g.mu.Unlock()
	var msg *C.char
	return status(C.rc_dist_barrier(g.h, &msg), msg)
}

// Close leaves the group, after any call in flight. Safe to call twice.
func (g *ProcessGroup) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.h != nil {
		C.rc_dist_free(g.h)
		g.h = nil
	}
	return nil
}

// StoreServer is a c10d TCPStore server alone, as torchrun's agent serves
// one for its workers (GroupOptions.StorePrefix): a launcher, or a test
// playing one, starts it before the ranks.
type StoreServer struct {
	mu   sync.Mutex
	h    *C.rc_store
	port int
}

// ServeStore starts a store server on port (0: a free port; see Port) of
// every interface.
func ServeStore(port int, timeout time.Duration) (*StoreServer, error) {
	var h *C.rc_store
	var got C.int32_t
	var msg *C.char
	if err := status(C.rc_store_serve(C.int32_t(port), C.double(timeout.Seconds()), &h, &got, &msg), msg); err != nil {
		return nil, err
	}
	return &StoreServer{h: h, port: int(got)}, nil
}

// Port is the TCP port the server listens on.
func (s *StoreServer) Port() int { return s.port }

// Close stops the server. Safe to call twice.
func (s *StoreServer) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.h != nil {
		C.rc_store_free(s.h)
		s.h = nil
	}
	return nil
}

func bytesPtr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}

// cBytes copies n bytes of malloc'd C memory into Go and frees it.
func cBytes(p unsafe.Pointer, n int64) []byte {
	b := make([]byte, n)
	if p != nil {
		copy(b, unsafe.Slice((*byte)(p), n))
		C.free(p)
	}
	return b
}
