// Package procgroup is what a data-parallel training loop needs from its process
// group, without cgo: the Group of ranks that exchange bytes (rollout
// records, rewards, statistics) and reach barriers together, the
// GradReducer that sums the policy's gradients over them, a single-process
// implementation whose collectives are identities, and the launch
// environment (torchrun or Slurm) that says which rank this process is.
// torchbridge.ProcessGroup implements both interfaces on libtorch's c10d.
//
// As with torch.distributed, every rank must call the same collectives in
// the same order.
package procgroup

import (
	"context"
	"fmt"
)

// Group is this process's membership in a group of ranks, like
// torch.distributed's ProcessGroup.
type Group interface {
	// Rank is this process's rank, in [0, Size()).
	Rank() int
	// Size is the number of ranks.
	Size() int
	// AllGather returns every rank's data, of any length, in rank order.
	AllGather(ctx context.Context, data []byte) ([][]byte, error)
	// Broadcast returns root's data on every rank; data is read on root only.
	Broadcast(ctx context.Context, data []byte, root int) ([]byte, error)
	// Barrier returns when every rank has reached it.
	Barrier(ctx context.Context) error
	// Close leaves the group; safe to call twice.
	Close() error
}

// GradReducer sums the policy's accumulated gradients over the ranks, in
// place, once per optimizer step, before the step. The trainer gets one with
// the policy already bound, so it needs no import of torchbridge.
type GradReducer interface {
	AllReduceGrads(ctx context.Context) error
}

// GradReducerFunc adapts a function to GradReducer, e.g.
//
//	procgroup.GradReducerFunc(func(ctx context.Context) error { return pg.AllReduceGrads(ctx, policy) })
type GradReducerFunc func(ctx context.Context) error

// AllReduceGrads calls f.
func (f GradReducerFunc) AllReduceGrads(ctx context.Context) error { return f(ctx) }

// Single returns the group of one process: rank 0 of 1, whose collectives
// are identities. It is a GradReducer too (one rank's sum is its own
// gradient).
func Single() *SingleGroup { return &SingleGroup{} }

// SingleGroup is the group of one process; see Single.
type SingleGroup struct{}

var (
	_ Group       = (*SingleGroup)(nil)
	_ GradReducer = (*SingleGroup)(nil)
)

// Rank is 0.
func (*SingleGroup) Rank() int { return 0 }

// Size is 1.
func (*SingleGroup) Size() int { return 1 }

// AllGather returns a copy of data as the only part.
func (*SingleGroup) AllGather(ctx context.Context, data []byte) ([][]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return [][]byte{append([]byte{}, data...)}, nil
}

// Broadcast returns a copy of data; root must be 0.
func (*SingleGroup) Broadcast(ctx context.Context, data []byte, root int) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if root != 0 {
		return nil, fmt.Errorf("dist: broadcast from root %d in a group of 1", root)
	}
	return append([]byte{}, data...), nil
}

// Barrier returns at once.
func (*SingleGroup) Barrier(ctx context.Context) error { return ctx.Err() }

// AllReduceGrads leaves the gradients as they are.
func (*SingleGroup) AllReduceGrads(ctx context.Context) error { return ctx.Err() }

// Close does nothing.
func (*SingleGroup) Close() error { return nil }
