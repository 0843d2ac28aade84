package config

import (
	"fmt"
	"time"
)

// Dist configures how the ranks of a data-parallel job talk ([dist]); read
// only when recal runs as more than one process (recal train --nproc N,
// torchrun or Slurm; see docs/distributed.md). None of it
// changes what is computed, so a resume may change it.
type Dist struct {
	// Timeout bounds the rendezvous and every collective (duration): a rank
	// that died or hangs makes the others stop with an error naming it
	// within this time. Default "300s".
	Timeout time.Duration `toml:"timeout"`
	// Backend carries the gradient all-reduce: "auto" (nccl when the policy
	// is on a CUDA device, "cuda" or "cuda:N"; gloo for any other), "gloo"
	// or "nccl" (CUDA builds only). Byte collectives (rollout records,
	// rewards) always go over Gloo.
	Backend string `toml:"backend"`
	// BucketBytes is the size of the float32 buckets the gradients are
	// all-reduced in (bytes); each bucket is sent while the next is filled.
	// Default 26214400 (25 MiB, PyTorch DDP's). The gradient sums live in
	// these buckets (no copy per step).
	BucketBytes int `toml:"bucket_bytes"`
	// ShardOptimizer shards the AdamW moments and float32 master weights
	// over the ranks (ZeRO-1): each rank holds and updates 1/N of every
	// parameter's elements, then the ranks all-gather the parameters. The
	// same weights bit for bit as unsharded (the update is elementwise);
	// checkpoints are written whole, so a run resumes with another number
	// of ranks or without sharding. Memory per rank: see docs/memory.md.
	// Ignored by a job of one process.
	ShardOptimizer bool `toml:"shard_optimizer"`
	// ShardGradients also shards the float32 gradient sums (ZeRO-2; needs
	// shard_optimizer; CPU policies only): each bucket is all-reduced as
	// soon as its gradients are complete (with
	// policy.gradient_checkpointing, layer by layer during the update's
	// last backward; otherwise after it), then gives back the memory of the
	// elements other ranks update. The same weights bit for bit. Memory per
	// rank: see docs/memory.md. Ignored by a job of one process.
	ShardGradients bool `toml:"shard_gradients"`
}

// DefaultDist returns the [dist] defaults.
func DefaultDist() Dist {
	return Dist{Timeout: 300 * time.Second, Backend: "auto", BucketBytes: 25 << 20}
}

// Validate checks the [dist] table, naming the bad key.
func (d Dist) Validate() error {
	switch {
	case d.Timeout <= 0:
		return fmt.Errorf("dist.timeout = %v: must be > 0", d.Timeout)
	case d.Backend != "auto" && d.Backend != "gloo" && d.Backend != "nccl":
		return fmt.Errorf("dist.backend = %q: want \"auto\", \"gloo\" or \"nccl\"", d.Backend)
	case d.BucketBytes < 1024:
		return fmt.Errorf("dist.bucket_bytes = %d: must be ≥ 1024", d.BucketBytes)
	case d.ShardGradients && !d.ShardOptimizer:
		return fmt.Errorf("dist.shard_gradients = true needs dist.shard_optimizer = true (ZeRO-2 shards the gradients of the optimizer's shares)")
	}
	return nil
}
