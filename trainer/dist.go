package trainer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/procgroup"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/llmpool"
	"github.com/recal-project/recal/router"
	"github.com/recal-project/recal/torchbridge"
)

// Data parallelism. N ranks compute what one process computes on the same
// global batch (docs/method.md, "Data parallelism"):
//
//   - every rank draws the same questions from the same sampler state and
//     rolls out its contiguous share of them (whole groups); sampling draws
//     depend on (seed, step, global row), never on the rank;
//   - the responses' records (text, calls, raw rewards) are all-gathered,
//     so calibration, the balance counts and the metrics see the whole
//     batch on every rank, in global row order;
//   - each rank backpropagates its rows with the loss scaled by the global
//     number of policy tokens; the gradients are summed over the ranks
//     (GradReducer) before clipping and AdamW, so every rank applies the
//     same update;
//   - rank 0 alone writes the run folder;
//   - a decision that ends or skips work (an interruption, a validation cut
//     short) is agreed by all ranks, so they always run the same
//     collectives in the same order.
//
// With dist.Single() every collective is an identity and the loop computes
// exactly what it computed before ranks existed.

// ranks is the training loop's view of its process group: the collectives
// on the records of a step and the gradient reducer bound to the policy.
type ranks struct {
	procgroup.Group
	grads procgroup.GradReducer
	// shard, when not nil, shards the policy's optimizer state over the
	// ranks (dist.shard_optimizer, ZeRO-1).
	shard *sharding
	// prepare allocates the optimizer state (and, on a group that has
	// them, the gradient buckets) before the first backward
	// (torchbridge.Policy.PrepareUpdate, ProcessGroup.PrepareUpdate).
	prepare func(ctx context.Context) error
}

// updatePreparer is a group that makes a policy's gradient buckets ahead of
// its first all-reduce (torchbridge.ProcessGroup).
type updatePreparer interface {
	PrepareUpdate(ctx context.Context, p *torchbridge.Policy) error
}

// optimizerSharder is a group that shards a policy's optimizer state over
// its ranks (torchbridge.ProcessGroup).
type optimizerSharder interface {
	GatherParams(ctx context.Context, p *torchbridge.Policy) error
	GatherState(ctx context.Context, p *torchbridge.Policy, root int) error
	DropGatheredState(ctx context.Context, p *torchbridge.Policy) error
}

// gradientSharder is a group that shards a policy's gradient sums over its
// ranks (torchbridge.ProcessGroup: ZeRO-2).
type gradientSharder interface {
	ShardGradients(ctx context.Context, p *torchbridge.Policy, on bool) error
	ReduceInBackward(ctx context.Context, p *torchbridge.Policy) error
}

// sharding is ZeRO-1 on one policy: after each optimizer step the ranks
// all-gather the parameters each updated, and before a checkpoint they
// gather the whole optimizer state on rank 0, which writes it. With grads
// (dist.shard_gradients, ZeRO-2) the gradient sums are sharded too, and
// each update's last backward on a rank reduces them as they complete.
type sharding struct {
	g     optimizerSharder
	p     *torchbridge.Policy
	guard func(string, func() error) error
	grads gradientSharder
}

// shardGradients turns ZeRO-2 on, once the buckets exist (after prepare).
func (s *sharding) shardGradients(ctx context.Context) error {
	if s == nil || s.grads == nil {
		return nil
	}
	return s.grads.ShardGradients(ctx, s.p, true)
}

// lastBackward arms the backward that completes this rank's gradients of
// an update (ZeRO-2); a no-op otherwise.
func (s *sharding) lastBackward(ctx context.Context) error {
	if s == nil || s.grads == nil {
		return nil
	}
	return s.grads.ReduceInBackward(ctx, s.p)
}

func (s *sharding) gatherParams(ctx context.Context) error {
	return s.guard("all-gather of the parameters", func() error { return s.g.GatherParams(ctx, s.p) })
}

func (s *sharding) gatherState(ctx context.Context) error {
	return s.guard("gather of the optimizer state", func() error { return s.g.GatherState(ctx, s.p, 0) })
}

func (s *sharding) dropState(ctx context.Context) error { return s.g.DropGatheredState(ctx, s.p) }

// policyReducer is a group that sums a policy's gradients over its ranks
// (torchbridge.ProcessGroup).
type policyReducer interface {
	AllReduceGrads(ctx context.Context, p *torchbridge.Policy) error
}

// newRanks binds g's gradient all-reduce to p, and with shard the sharding
// of p's optimizer state (dist.shard_optimizer: ZeRO-1, when g has several
// ranks and can shard) and with grads its gradient sums' too
// (dist.shard_gradients: ZeRO-2); g nil is one process. A watched group's
// collectives run under its watchdog.
func newRanks(g procgroup.Group, p *torchbridge.Policy, shard, grads bool) (ranks, error) {
	if g == nil {
		g = procgroup.Single()
	}
	inner, guard := g, func(_ string, fn func() error) error { return fn() }
	if w, ok := g.(*procgroup.Watched); ok {
		inner, guard = w.Unwrap(), w.Guard
	}
	switch gr := inner.(type) {
	case policyReducer:
		r := ranks{Group: g, grads: procgroup.GradReducerFunc(func(ctx context.Context) error {
			return guard("all-reduce of the gradients", func() error { return gr.AllReduceGrads(ctx, p) })
		}), prepare: p.PrepareUpdate}
		if up, ok := inner.(updatePreparer); ok && g.Size() > 1 {
			r.prepare = func(ctx context.Context) error { return up.PrepareUpdate(ctx, p) }
		}
		if sh, ok := inner.(optimizerSharder); ok && shard && g.Size() > 1 {
			r.shard = &sharding{g: sh, p: p, guard: guard}
			if gs, ok := inner.(gradientSharder); ok && grads {
				r.shard.grads = gs
			}
		}
		return r, nil
	case procgroup.GradReducer:
		return ranks{Group: g, grads: gr, prepare: p.PrepareUpdate}, nil
	}
	return ranks{}, fmt.Errorf("trainer: process group %T cannot sum the policy's gradients", g)
}

// leader reports whether this rank writes the run folder (rank 0).
func (r ranks) leader() bool { return r.Rank() == 0 }

// share is this rank's contiguous part [lo, hi) of n items; the parts of
// ranks 0..size-1 cover 0..n in order.
func (r ranks) share(n int) (lo, hi int) { return shareOf(n, r.Rank(), r.Size()) }

func shareOf(n, rank, size int) (lo, hi int) { return n * rank / size, n * (rank + 1) / size }

// anyOf reports, on every rank, whether flag is true on at least one rank:
// how ranks agree to stop or to skip work together.
func (r ranks) anyOf(ctx context.Context, flag bool) (bool, error) {
	parts, err := allGather(ctx, r, "decisions to stop", flag)
	if err != nil {
		return false, err
	}
	for _, p := range parts {
		if p {
			return true, nil
		}
	}
	return false, nil
}

// samePlan checks that every rank continues the run from the same
// checkpoint: the run folder must be one folder that every rank sees.
func (r ranks) samePlan(ctx context.Context, p runPlan) error {
	type view struct {
		Last string
		Step int
	}
	parts, err := allGather(ctx, r, "checkpoints to continue from", view{p.last, p.state.Step})
	if err != nil {
		return err
	}
	for k, v := range parts {
		if v != parts[0] {
			return fmt.Errorf("trainer: rank %d would continue from checkpoint %q (step %d) and rank 0 from %q (step %d): the run folder must be on a filesystem every rank shares",
				k, v.Last, v.Step, parts[0].Last, parts[0].Step)
		}
	}
	return nil
}

// sameWeights checks that every rank holds the same weights, bit for bit
// (after a stage every rank computed alone: the warm-up).
func (r ranks) sameWeights(ctx context.Context, p *torchbridge.Policy) error {
	if r.Size() == 1 {
		return nil
	}
	h := sha256.New()
	var buf []byte
	for _, prm := range p.Params() {
		n := int(prm.Numel()) * 4
		if cap(buf) < n {
			buf = make([]byte, n)
		}
		if err := p.GetParam(prm.Name, "F32", buf[:n]); err != nil {
			return err
		}
		h.Write(buf[:n])
	}
	sums, err := allGather(ctx, r, "weight digests", h.Sum(nil))
	if err != nil {
		return err
	}
	for k, s := range sums {
		if !bytes.Equal(s, sums[0]) {
			return fmt.Errorf("trainer: after the warm-up rank %d's weights differ from rank 0's: the ranks must compute alike (same threads per rank, same libtorch)", k)
		}
	}
	return nil
}

// barrier waits for every rank (after rank 0 wrote something they read).
func (r ranks) barrier(ctx context.Context) error {
	if r.Size() == 1 {
		return nil
	}
	return r.Barrier(ctx)
}

// allGather returns every rank's v, in rank order (dist.AllGatherOf);
// what names v in errors.
func allGather[T any](ctx context.Context, g procgroup.Group, what string, v T) ([]T, error) {
	parts, err := procgroup.AllGatherOf(ctx, g, v)
	if err != nil {
		return nil, fmt.Errorf("trainer: all-gather of the %s: %w", what, err)
	}
	return parts, nil
}

// checkWorld refuses, before any work, a job the world size cannot run:
// every rank must hold the same number of whole groups.
func checkWorld(cfg config.Training, size int) error {
	if size <= 1 {
		return nil
	}
	tc := cfg.Train
	if tc.BatchSize%size != 0 {
		return fmt.Errorf("trainer: train.batch_size = %d questions do not split into whole groups over %d ranks: use a batch size divisible by the world size", tc.BatchSize, size)
	}
	if tc.Algorithm != "grpo" {
		return fmt.Errorf("trainer: train.algorithm = %q runs in one process only; data-parallel training supports \"grpo\"", tc.Algorithm)
	}
	return nil
}

// rowRecord is what every rank needs of a response another rank rolled
// out: the response without its tokens and log-probs, its raw rewards and
// its number of policy tokens (the loss's normaliser).
type rowRecord struct {
	Sample  router.Sample
	Rewards router.Rewards
	Tokens  float64
}

// rankRollout is one rank's part of a step: its rows in order, or that its
// rollout was interrupted, and how long its rollout took.
type rankRollout struct {
	Interrupted bool
	Rows        []rowRecord
	Wall        time.Duration
}

// stepRollouts is the whole batch of a step, gathered from every rank.
type stepRollouts struct {
	samples []router.Sample
	rewards []router.Rewards
	tokens  []float64 // policy tokens per row
	// interrupted is true when any rank's rollout was interrupted (the
	// step is then dropped by all); the rows are then empty.
	interrupted bool
	// wall is the rollouts' wall time: the slowest rank's, which every
	// rank waited for at the gather.
	wall time.Duration
}

// gatherRollouts all-gathers the ranks' rows into the global batch, in
// global row order, the same on every rank.
func (r ranks) gatherRollouts(ctx context.Context, mine rankRollout) (stepRollouts, error) {
	parts, err := allGather(ctx, r, "rollouts", mine)
	if err != nil {
		return stepRollouts{}, err
	}
	var b stepRollouts
	for _, p := range parts {
		b.wall = max(b.wall, p.Wall)
		if p.Interrupted {
			b.interrupted = true
		}
	}
	if b.interrupted {
		return b, nil
	}
	for _, p := range parts {
		for _, row := range p.Rows {
			b.samples = append(b.samples, row.Sample)
			b.rewards = append(b.rewards, row.Rewards)
			b.tokens = append(b.tokens, row.Tokens)
		}
	}
	return b, nil
}

// record is the part of a local response the other ranks need.
func record(s router.Sample, rw router.Rewards, tokens float64) rowRecord {
	s.Tokens, s.Logp = nil, nil // the loss of this row runs here
	return rowRecord{Sample: s, Rewards: rw, Tokens: tokens}
}

// rankLoss is one rank's loss statistics of a step, per mini-batch and
// micro-batch in order, and its pool usage.
type rankLoss struct {
	Micro [][]torchbridge.LossStats
	Usage llmpool.UsageMap
}

// gatherLoss sums the ranks' loss statistics in the order one process
// would (mini-batch by mini-batch, then global row order) and their pool
// usage, model by model.
func (r ranks) gatherLoss(ctx context.Context, mine rankLoss) (torchbridge.LossStats, llmpool.UsageMap, error) {
	parts, err := allGather(ctx, r, "loss statistics", mine)
	if err != nil {
		return torchbridge.LossStats{}, nil, err
	}
	var loss torchbridge.LossStats
	for j := range mine.Micro {
		for _, p := range parts {
			for _, ls := range p.Micro[j] {
				loss.Add(ls)
			}
		}
	}
	usage := llmpool.UsageMap{}
	for _, p := range parts {
		for m, u := range p.Usage {
			usage[m] = usage[m].Add(u)
		}
	}
	return loss, usage, nil
}

// validateShared answers this rank's share of the held-out questions and
// gathers every rank's answers; ok is false on every rank when any rank
// was interrupted (the validation is then skipped by all).
func validateShared(ctx context.Context, r ranks, env *rollout.Env, val []data.Example, batch, step int) (v rollout.ValidationResult, ok bool, err error) {
	lo, hi := r.share(len(val))
	type part struct {
		Interrupted bool
		Results     []rollout.QuestionResult
	}
	var mine part
	mine.Results, err = rollout.Answer(ctx, env, val[lo:hi], batch)
	if err != nil {
		if ctx.Err() == nil {
			return v, false, err
		}
		mine = part{Interrupted: true}
	}
	parts, err := allGather(context.WithoutCancel(ctx), r, "validation answers", mine)
	if err != nil {
		return v, false, err
	}
	var all []rollout.QuestionResult
	for _, p := range parts {
		if p.Interrupted {
			return v, false, nil
		}
		all = append(all, p.Results...)
	}
	per, avg := rollout.Summarize(all)
	return rollout.ValidationResult{Step: step, Datasets: per, Avg: avg}, true, nil
}

// SharePool gives this rank its share of the pool's global limits: the
// pool-wide and per-model concurrency and the per-model request rate are
// split over the ranks (each rank at least one request in flight), so N
// ranks together stay within what one process may send.
func SharePool(pc llmpool.Config, rank, size int, log *slog.Logger) llmpool.Config {
	if size <= 1 {
		return pc
	}
	part := func(limit int, key string) int {
		n := limit / size
		if rank < limit%size {
			n++
		}
		if n < 1 {
			if rank == 0 {
				log.Warn("a global pool limit is below the number of ranks; each rank gets 1", "key", key, "limit", limit, "ranks", size)
			}
			n = 1
		}
		return n
	}
	if pc.MaxConcurrency == 0 {
		pc.MaxConcurrency = llmpool.DefaultMaxConcurrency
	}
	pc.MaxConcurrency = part(pc.MaxConcurrency, "pool.max_concurrency")
	models := make([]llmpool.ModelConfig, len(pc.Models))
	for i, m := range pc.Models {
		if m.OpenAI != nil {
			o := *m.OpenAI
			if o.MaxConcurrency == 0 {
				o.MaxConcurrency = llmpool.DefaultOpenAIMaxConcurrency
			}
			o.MaxConcurrency = part(o.MaxConcurrency, "pool.models["+strconv.Itoa(i)+"].openai.max_concurrency")
			o.RequestsPerMinute /= float64(size)
			m.OpenAI = &o
		}
		models[i] = m
	}
	pc.Models = models
	return pc
}

// Threads is the number of CPU threads one rank's libtorch should use when
// policy.threads (configured) is 0: the cores this process may run on,
// split between the ranks of its node (localRanks, e.g. torchrun's
// LOCAL_WORLD_SIZE). Slurm binds each task to its own cores already, so
// there localRanks is 1.
func Threads(configured, localRanks int) int {
	if configured > 0 {
		return configured
	}
	return max(1, runtime.NumCPU()/max(1, localRanks))
}

// LocalWorldSize is the number of ranks on this node as the launcher says
// it: LOCAL_WORLD_SIZE (torchrun and recal train --nproc), else 1.
func LocalWorldSize() int {
	if n, err := strconv.Atoi(os.Getenv("LOCAL_WORLD_SIZE")); err == nil && n > 0 {
		return n
	}
	return 1
}

// RankDevice is the device a rank's policy runs on: "cuda" becomes
// "cuda:LOCAL_RANK" when there are several ranks, so each local rank has
// its own GPU (the launcher gives every rank all of its node's GPUs).
// With several ranks an explicit "cuda:N" is refused: it would put every
// rank of a node on the same GPU. Any other setting is kept.
func RankDevice(device string, launch procgroup.Launch) (string, error) {
	if !launch.Distributed() || !isCUDA(device) {
		return device, nil
	}
	if device != "cuda" {
		return "", fmt.Errorf("trainer: policy.device = %q names one GPU, but this process is rank %d of %d: every rank of a node would run on it; "+
			"use policy.device = \"cuda\", which gives each rank cuda:LOCAL_RANK (here cuda:%d)", device, launch.Rank, launch.WorldSize, launch.LocalRank)
	}
	return "cuda:" + strconv.Itoa(launch.LocalRank), nil
}

// isCUDA reports whether device is a CUDA device ("cuda" or "cuda:N").
func isCUDA(device string) bool { return device == "cuda" || strings.HasPrefix(device, "cuda:") }

// groupBackend is the backend of the gradient all-reduce: dist.backend,
// with "auto" (or "") NCCL for a CUDA device and Gloo for any other.
func groupBackend(backend, device string) string {
	if backend != "auto" && backend != "" {
		return backend
	}
	if isCUDA(device) {
		return "nccl"
	}
	return "gloo"
}

// JoinGroup joins the process group of a launch (nil, nil for one
// process), with the [dist] settings: the gradient all-reduce on NCCL when
// dist.backend is "nccl", or "auto" with the policy on a CUDA device.
func JoinGroup(ctx context.Context, launch procgroup.Launch, dc config.Dist, device string) (procgroup.Group, error) {
	if !launch.Distributed() {
		return nil, nil
	}
	backend := groupBackend(dc.Backend, device)
	t0 := time.Now()
	pg, err := torchbridge.NewProcessGroup(ctx, torchbridge.GroupOptions{Rank: launch.Rank, WorldSize: launch.WorldSize,
		MasterAddr: launch.MasterAddr, MasterPort: launch.MasterPort, StorePrefix: launch.StorePrefix,
		Timeout: dc.Timeout, Backend: backend, BucketBytes: dc.BucketBytes})
	if err != nil {
		return nil, err
	}
	slog.Debug("joined the process group", "rank", launch.Rank, "world_size", launch.WorldSize, "backend", backend, "took", time.Since(t0).Round(time.Millisecond).String())
	// The watchdog names the rank a failed collective lost.
	w, err := procgroup.Watch(ctx, pg, launch.MasterAddr, procgroup.WatchOptions{})
	if err != nil {
		pg.Close()
		return nil, err
	}
	return w.Watch(pg), nil
}
