package trainer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/recal-project/recal/calibration"
	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/generate"
	"github.com/recal-project/recal/internal/procgroup"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/internal/runlock"
	"github.com/recal-project/recal/router"
	"github.com/recal-project/recal/torchbridge"
)

// ErrInterrupted is returned when training stopped on SIGINT/SIGTERM after
// saving a checkpoint; rerun with --resume to continue.
var ErrInterrupted = errors.New("trainer: interrupted; a checkpoint was saved, rerun with --resume to continue")

// ErrNonFiniteGradients is returned when train.max_skipped_updates optimizer
// updates in a row were skipped for a non-finite gradient norm.
var ErrNonFiniteGradients = errors.New("trainer: non-finite gradients")

// Options say where a run lives.
type Options struct {
	RunDir string
	// Resume continues the run in RunDir from checkpoints/last (or starts it
	// when it has none), with a configuration whose training keys match the
	// run's: the keys outside config.OperationalKeys.
	Resume bool
	// AllowConfigChange lets a resume change training keys: the change takes
	// effect at the step after the checkpoint and is recorded in
	// config-changes.jsonl and config-<step>.toml; config.toml is kept.
	AllowConfigChange bool
	Log               *slog.Logger
	// StopAfter, when > 0, ends the run after this many GRPO steps of this
	// invocation, as an interruption would (used by tests of --resume).
	StopAfter int
	// Group is this process's data-parallel process group (JoinGroup); nil
	// is one process. Every rank calls Train with the same configuration
	// and run folder (on a filesystem they share); rank 0 alone writes it.
	Group procgroup.Group
	// Device overrides policy.device for this process (RankDevice:
	// cuda:LOCAL_RANK for a rank of a job on GPUs); "" keeps it.
	Device string
}

// Train runs the whole job: the optional supervised warm-up, then GRPO with
// ReCal's calibrated advantages (or the algorithm train.algorithm names),
// with validation, checkpoints and logs in opt.RunDir. With a process group
// of N ranks it computes what one process computes (see dist.go).
func Train(ctx context.Context, cfg config.Training, opt Options) error {
	log := opt.Log
	if log == nil {
		log = slog.Default()
	}
	tc := cfg.Train
	device := cfg.Policy.Device
	if opt.Device != "" {
		device = opt.Device
	}
	algo, err := newAlgorithm(cfg) // train.algorithm: "grpo" or "ppo" (algorithm.go)
	if err != nil {
		return err
	}
	if opt.Group != nil {
		if err := checkWorld(cfg, opt.Group.Size()); err != nil {
			return err
		}
	}
	// One process at a time works in a run folder: rank 0 locks it (a
	// second `recal train` on it stops here, naming the holder) until Train
	// returns; a lock left by a process that died is taken over.
	if opt.RunDir == "" {
		return fmt.Errorf("trainer: no run folder")
	}
	if opt.Group == nil || opt.Group.Rank() == 0 {
		lock, err := runlock.Acquire(opt.RunDir, "recal train")
		if err != nil {
			return fmt.Errorf("trainer: run folder: %w", err)
		}
		defer lock.Release()
	}
	// Everything is checked and loaded before the run folder is written, so
	// that a job failing at start leaves nothing a second attempt trips on.
	plan, err := inspectRun(opt.RunDir, cfg, opt.Resume, opt.AllowConfigChange)
	if err != nil {
		return err
	}
	// The pool reads its API keys from the environment: a missing one stops
	// the job here.
	if err := rollout.CheckPool(cfg.Pool); err != nil {
		return err
	}

	// Data: training questions shuffled by a resumable sampler, validation
	// questions held out of the training files.
	trainSet, valSet, err := cfg.Data.LoadTrain()
	if err != nil {
		return err
	}
	sampler, err := data.NewSampler(trainSet, tc.Seed)
	if err != nil {
		return err
	}

	// The policy starts from the configured checkpoint or, on --resume, from
	// the last checkpoint of the run with its optimizer and trainer state.
	st := State{Balance: router.NewBalance(tc.EMADecay, nil)}
	start := cfg.Policy.Checkpoint
	if plan.last != "" {
		start = plan.last
	}
	eng, err := rollout.OpenEngine(start, torchbridge.Options{Device: device, DType: cfg.Policy.DType, EagerDecode: cfg.Policy.EagerDecode})
	if err != nil {
		return err
	}
	defer eng.Close()
	r, err := newRanks(opt.Group, eng.Policy, cfg.Dist.ShardOptimizer, cfg.Dist.ShardGradients)
	if err != nil {
		return err
	}
	if err := eng.Policy.SetCheckpointing(cfg.Policy.GradientCheckpointing); err != nil {
		return err
	}
	// Collective: every rank continues from the same checkpoint.
	if err := r.samePlan(ctx, plan); err != nil {
		return err
	}
	if err := algo.prepare(eng.Policy, start, plan.last != ""); err != nil { // PPO: the value head
		return err
	}
	// Each rank gets its share of the pool's global limits.
	ec := cfg.Rollout()
	ec.Pool = SharePool(cfg.Pool, r.Rank(), r.Size(), log)
	env, err := rollout.NewEnv(ec, eng, rollout.AnswerBank(trainSet, valSet), log)
	if err != nil {
		return err
	}
	defer env.Close()
	if plan.last != "" {
		if err := loadState(plan.last, eng.Policy, &st, sampler); err != nil {
			return err
		}
		st.Balance.Decay = tc.EMADecay // an allowed change of train.ema_decay applies from here
		log.Info("resumed", "checkpoint", plan.last, "step", st.Step, "sft_done", st.SFTDone)
	} else {
		for _, m := range env.Pool.Models() {
			st.Balance.Counts[strings.ToLower(m.Name)] = 0
		}
	}
	if len(plan.changes) > 0 {
		keys := make([]string, len(plan.changes))
		for i, c := range plan.changes {
			keys[i] = c.Key
		}
		log.Warn("resuming with a changed configuration", "from_step", st.Step+1, "keys", strings.Join(keys, ","))
	}
	// Rank 0 writes the run folder; the other ranks only read it.
	run := followRun(plan)
	if r.leader() {
		if run, err = openRun(plan, cfg); err != nil {
			return err
		}
	}
	defer run.Close()
	j := &job{cfg: cfg, r: r, algo: algo, env: env, eng: eng, st: &st, sampler: sampler, run: run, log: log,
		adam:     algo.adamW(torchbridge.AdamW{LR: tc.LR, Beta1: tc.Beta1, Beta2: tc.Beta2, Eps: tc.AdamEps, WeightDecay: tc.WeightDecay, MaxGradNorm: tc.MaxGradNorm}),
		sampling: generate.Sampling{Temperature: tc.Temperature, TopP: tc.TopP}, best: plan.best}
	j.rollEnv = rolloutEnv(env, tc)

	// Stage 1: supervised warm-up on format demonstrations.
	if cfg.SFT.Steps > 0 && !st.SFTDone {
		if err := r.prepare(ctx); err != nil { // the optimizer state before the first backward
			return err
		}
		if err := runSFT(ctx, cfg, env, r, trainSet, run, log); err != nil {
			if errors.Is(err, ErrInterrupted) || ctx.Err() != nil {
				return ErrInterrupted // the SFT stage restarts on --resume
			}
			return err
		}
		st.SFTDone = true
		// The stage is done: finish it to its checkpoint even if interrupted now.
		work := context.WithoutCancel(ctx)
		if err := eng.Policy.ZeroGrad(work); err != nil {
			return err
		}
		// GRPO starts with a fresh AdamW, as a separate RL job would
		// (train.reset_optimizer_after_sft). The checkpoint holds that
		// state, so a run resumed after the warm-up starts GRPO the same way.
		if tc.ResetOptimizerAfterSFT {
			if err := eng.Policy.ResetOptimizer(work); err != nil {
				return err
			}
		}
		if err := j.checkpoint(ctx, "sft"); err != nil {
			return err
		}
	}

	// The KL reference is the frozen policy at the start of GRPO, loaded on
	// every rank when the algorithm's KL coefficient (train.kl_coef, or
	// ppo.kl_coef for PPO) is > 0: kept for the run, or with
	// policy.reload_reference loaded for each step's scoring.
	if cfg.KLCoef() > 0 {
		refDir := cfg.Policy.Checkpoint
		if st.SFTDone {
			refDir = filepath.Join(run.dir, "checkpoints", "sft")
		}
		if j.ref, err = openReference(refDir, torchbridge.Options{Device: device, DType: cfg.Policy.DType}, cfg.Policy.ReloadReference); err != nil {
			return err
		}
		defer j.ref.Close()
	}

	// ZeRO-1: from here each rank holds its share of the optimizer state
	// (the warm-up above ran whole on every rank, with no all-reduce).
	if r.shard != nil {
		if err := eng.Policy.ShardOptimizer(r.Rank(), r.Size()); err != nil {
			return err
		}
	}

	// The optimizer state (this rank's share) and, with several ranks, the
	// gradient buckets exist before GRPO's first backward, as the memory
	// plan counts them (torchbridge.Policy.PrepareUpdate).
	if err := r.prepare(ctx); err != nil {
		return err
	}
	// ZeRO-2: the buckets made, their sums are sharded too.
	if err := r.shard.shardGradients(ctx); err != nil {
		return err
	}

	progress := newProgress(tc.Steps, tc.LogEvery, log)
	done := 0
	for st.Step < tc.Steps {
		// Collective: the ranks stop together, after a checkpoint, when any
		// of them was interrupted.
		// (Not on ctx: once cancelled it would fail the very exchange that
		// says so, and the run would end without its checkpoint.)
		stop, err := r.anyOf(context.WithoutCancel(ctx), ctx.Err() != nil || (opt.StopAfter > 0 && done >= opt.StopAfter))
		if err != nil {
			return err
		}
		if stop {
			if err := j.checkpoint(ctx, ""); err != nil {
				return err
			}
			return ErrInterrupted
		}

		// One GRPO step: sample, roll out, score, calibrate, update.
		s, err := j.step(ctx)
		if err != nil {
			return fmt.Errorf("trainer: step %d: %w", st.Step+1, err)
		}
		if s == nil {
			continue // interrupted during the rollouts: redone on --resume
		}
		done++

		// Log (rank 0): metrics.jsonl, rollouts.jsonl (every rank's
		// responses, in global row order), progress.
		if err := run.logStep(s.metrics, s.batch.qs, tc.GroupSize, s.batch.samples, s.batch.rewards, s.batch.logged, s.batch.ppo); err != nil {
			return err
		}
		if r.leader() {
			progress.update(s.metrics)
		}
		if tc.MaxSkippedUpdates > 0 && st.ConsecutiveSkips >= tc.MaxSkippedUpdates {
			// No checkpoint: the newest one predates the trouble.
			return fmt.Errorf("%w: step %d: %d consecutive optimizer updates skipped (train.max_skipped_updates = %d); the weights or the batch hold NaN/Inf",
				ErrNonFiniteGradients, st.Step, st.ConsecutiveSkips, tc.MaxSkippedUpdates)
		}

		// Validation (each rank answers its share; rank 0 logs the
		// merged table) and checkpoints. A validation better than every
		// earlier one (train.keep_best) makes its step a checkpoint, then
		// named by checkpoints/best; every rank decides alike, on the
		// gathered scores.
		last := st.Step == tc.Steps
		save := st.Step%tc.CheckpointEvery == 0 || last
		newBest := false
		if (tc.ValidateEvery > 0 && st.Step%tc.ValidateEvery == 0) || last {
			v, ok, err := validateShared(ctx, r, env, valSet, cfg.EvalBatch, st.Step)
			if err != nil {
				return err
			}
			if ok {
				if err := run.logValidation(v); err != nil {
					return err
				}
				if tc.KeepBest && j.best.improvedBy(v) {
					j.best, newBest, save = bestOf(v), true, true
				}
				if r.leader() {
					log.Info("validation", "step", st.Step, "em", fmt.Sprintf("%.3f", v.Avg.EM), "f1", fmt.Sprintf("%.3f", v.Avg.F1),
						"well_formed", fmt.Sprintf("%.3f", v.Avg.WellFormed), "f1_well_formed", fmt.Sprintf("%.3f", v.Avg.F1WellFormed), "best", newBest)
				}
			}
		}
		if save {
			if err := j.checkpoint(ctx, ""); err != nil {
				return err
			}
		}
		if newBest {
			if err := j.keepBest(ctx); err != nil {
				return err
			}
		}
	}
	if r.leader() {
		progress.finish()
	}
	return nil
}

// job is what the steps of a training run share.
type job struct {
	cfg      config.Training
	r        ranks
	algo     algorithm
	env      *rollout.Env
	rollEnv  *rollout.Env // env with train.no_repeat_ngram: the GRPO rollouts' protocol
	eng      *rollout.Engine
	ref      *reference // the KL reference (nil without one)
	st       *State
	sampler  *data.Sampler
	run      *runDir
	log      *slog.Logger
	adam     torchbridge.AdamW // at train.lr; each step scales it (scaleLR)
	sampling generate.Sampling
	best     bestCheckpoint // the best validation so far (train.keep_best)
}

// rolloutEnv is env for the GRPO rollouts: the same prompt and protocol
// but train.no_repeat_ngram in place of router.no_repeat_ngram, which
// validation (and evaluation, serving) keep, and train.model_subsets, which
// they never use (they list the full pool). It decodes at most
// train.rollout_rows responses at once.
func rolloutEnv(env *rollout.Env, tc config.Train) *rollout.Env {
	if env.Router.NoRepeatNGram == tc.NoRepeatNGram && tc.RolloutRows == 0 && tc.ModelSubsets == 0 {
		return env
	}
	rc := env.Router
	rc.NoRepeatNGram = tc.NoRepeatNGram
	e := env.WithPrompt(env.Prompt, rc)
	e.MaxRows = tc.RolloutRows
	e.ModelSubsets = tc.ModelSubsets
	return e
}

// stepResult is what a GRPO step leaves for the log.
type stepResult struct {
	batch   *stepBatch // the whole batch: every rank's responses, rewards and advantages
	metrics Metrics
}

// step runs GRPO step st.Step+1 on this rank's share of the batch and
// applies the update every rank applies. It returns nil, on every rank,
// when a rank's rollouts were interrupted: nothing changed and the sampler
// is back where it was.
func (j *job) step(ctx context.Context) (*stepResult, error) {
	tc, st, r, env := j.cfg.Train, j.st, j.r, j.env
	step := st.Step + 1
	t0 := time.Now()
	usage0 := env.Pool.Usage()
	samplerBefore := j.sampler.State()

	// 1. Sample a batch of questions across datasets; every rank draws the
	// same ones and takes its contiguous share of whole groups.
	qs := j.sampler.Next(tc.BatchSize)
	ph := newPhases(j.eng.Policy.Options().Device)
	qlo, qhi := r.share(len(qs))
	lo, hi := qlo*tc.GroupSize, qhi*tc.GroupSize // this rank's global rows

	// 2. G rollouts per question (blocking: decoding on the torch thread,
	// pool calls fanned out concurrently meanwhile). Rows sample as the
	// same global rows of one process would.
	local, rstats, err := j.rollEnv.RollRows(ctx, qs[qlo:qhi], tc.GroupSize, j.sampling, stepSeed(tc.Seed, step), true, lo)
	ph.mark("rollout")
	interrupted := false
	if err != nil {
		if ctx.Err() == nil {
			return nil, err
		}
		interrupted = true
	}

	// 3. Raw rewards of this rank's responses, with the balance counts from
	// before this step, and their sequences for the loss (prompt +
	// response, policy tokens masked in). seqs is indexed by global row;
	// only this rank's rows are filled.
	mine := rankRollout{Interrupted: interrupted, Wall: rstats.Wall}
	seqs := make([]torchbridge.Sequence, tc.BatchSize*tc.GroupSize)
	dearest := map[int]float64{} // by question: the pool's dearest single call about it, USD (the cost reward's scale)
	for k := 0; k < len(local) && !interrupted; k++ {
		i := lo + k
		q := qs[i/tc.GroupSize]
		if _, ok := dearest[i/tc.GroupSize]; !ok {
			pq := rollout.Question(q)
			dearest[i/tc.GroupSize] = env.Pool.DearestCall(&pq)
		}
		// The prompt and the model names RollRows gave the response
		// (train.model_subsets): a name it was not shown is not well formed.
		prompt, _, known, err := j.rollEnv.RowPrompt(q, stepSeed(tc.Seed, step))
		if err != nil {
			return nil, err
		}
		rw := router.Score(&local[k], q.Golden, j.cfg.Router.MaxTurns, dearest[i/tc.GroupSize], known, st.Balance)
		seqs[i] = sequence(prompt, local[k], 0)
		mine.Rows = append(mine.Rows, record(local[k], rw, policyTokens(seqs[i])))
	}

	// 4. Collective: all-gather the responses and rewards of every rank,
	// in global row order. An interruption on any rank drops the step on
	// all of them (it is redone on --resume).
	all, err := r.gatherRollouts(context.WithoutCancel(ctx), mine)
	if err != nil {
		return nil, err
	}
	if all.interrupted {
		return nil, j.sampler.Restore(samplerBefore)
	}
	samples, rewards, tokens := all.samples, all.rewards, all.tokens
	rstats.Wall = all.wall // rollout_time_s: the slowest rank's
	var stepCalls []string
	for _, s := range samples {
		stepCalls = append(stepCalls, s.CalledModels()...)
	}
	// From here on the step runs to its end even when interrupted, so a
	// checkpoint never holds a half-applied update.
	work := context.WithoutCancel(ctx)
	ph.mark("score")  // the rewards and the gather
	if j.ref != nil { // KL reference log-probs (a forward pass of the frozen policy)
		if err := j.ref.score(work, seqs[lo:hi], tc.MicroBatch); err != nil {
			return nil, err
		}
		ph.mark("reference")
	}

	// 5. The advantages the loss uses, computed on the whole batch on every
	// rank: ReCal's calibration (GRPO) or GAE with the value head (PPO, one
	// rank only).
	adv := &stepBatch{qs: qs, g: tc.GroupSize, samples: samples, rewards: rewards, seqs: seqs, st: st}
	if err := j.algo.advantages(work, j.eng.Policy, adv); err != nil {
		return nil, err
	}
	ph.mark("score")

	// 6. Loss and backward over this rank's micro-batches, scaled by the
	// mini-batch's policy tokens over all ranks; then the gradients are
	// summed over the ranks and every rank takes the same optimizer step
	// (the expensive part: forward+backward through libtorch) at this
	// step's learning rate (train.lr_schedule, train.warmup_steps): a
	// function of the step alone, so a resumed run continues the schedule.
	// Every mini-batch holds responses of every group (miniBatches), so
	// every rank has its share of each and none idles at the all-reduce.
	adam := scaleLR(j.adam, tc.LRFactor(step))
	var gradNorms []float64
	skipped := 0 // optimizer updates of this step skipped for a non-finite gradient norm
	var mineLoss rankLoss
	mbs := miniBatches(len(qs), tc.GroupSize, tc.MiniBatches)
	for mbi, mb := range mbs {
		total := 0.0
		var rows []int // this rank's rows of the mini-batch, in global row order
		for _, i := range mb {
			total += tokens[i]
			if i >= lo && i < hi {
				rows = append(rows, i)
			}
		}
		mineLoss.Micro = append(mineLoss.Micro, nil)
		j.log.Debug("mini-batch", "step", step, "mini_batch", mbi+1, "of", len(mbs), "rank", r.Rank(), "rows", len(rows), "all_rows", len(mb),
			"policy_tokens", total)
		if total == 0 {
			continue
		}
		lopt := j.algo.loss(torchbridge.LossOptions{ClipEps: tc.ClipEps, KLCoef: tc.KLCoef, EntropyCoef: tc.EntropyCoef, Scale: 1 / total, HeadChunk: tc.HeadChunk})
		micros := chunks(rows, tc.MicroBatch)
		for mi, micro := range micros {
			part := make([]torchbridge.Sequence, len(micro))
			for k, i := range micro {
				part[k] = seqs[i]
			}
			if mi == len(micros)-1 { // ZeRO-2: this backward completes the sums
				if err := r.shard.lastBackward(work); err != nil {
					return nil, err
				}
			}
			ls, err := j.eng.Policy.Backward(work, part, lopt)
			if err != nil {
				return nil, err
			}
			mineLoss.Micro[mbi] = append(mineLoss.Micro[mbi], ls)
		}
		ph.mark("update")
		// Collective: the sum of every rank's gradients, before clipping.
		if err := r.grads.AllReduceGrads(work); err != nil {
			return nil, err
		}
		gn, err := j.eng.Policy.Step(work, adam)
		if err != nil {
			return nil, err
		}
		// Collective (ZeRO-1): each rank updated its share; all get all.
		if r.shard != nil {
			if err := r.shard.gatherParams(work); err != nil {
				return nil, err
			}
		}
		ph.mark("step")
		if torchbridge.Skipped(gn) {
			// A NaN/Inf gradient: the bridge left the weights and the
			// optimizer untouched. Count it, say so, and stop after
			// train.max_skipped_updates in a row.
			skipped++
			st.SkippedUpdates++
			st.ConsecutiveSkips++
			j.log.Warn("optimizer update skipped: non-finite gradient norm", "step", step, "mini_batch", mbi+1,
				"grad_norm", fmt.Sprint(gn), "consecutive", st.ConsecutiveSkips, "total", st.SkippedUpdates)
			continue
		}
		st.ConsecutiveSkips = 0
		gradNorms = append(gradNorms, gn)
	}
	// Collective: the loss statistics and pool usage of every rank.
	mineLoss.Usage = env.Pool.Usage().Sub(usage0)
	loss, usage, err := r.gatherLoss(work, mineLoss)
	if err != nil {
		return nil, err
	}

	// 7. Bookkeeping: EMA routing counts (every rank's calls), metrics,
	// step counter.
	st.Balance.Update(stepCalls)
	st.Step = step
	m := stepMetrics(step, samples, rewards, adv.logged, loss, gradNorms, rstats, usage, len(qs), time.Since(t0), env.Pool.Models())
	m.SkippedUpdates, m.SkippedUpdatesTotal = skipped, st.SkippedUpdates
	m.ScoreTime, m.UpdateTime = ph.secs["score"]+ph.secs["reference"], ph.secs["update"]+ph.secs["step"]
	m.DevicePeakGiB = ph.gib
	m.LR = adam.LR
	j.algo.metrics(adv, loss, &m)
	return &stepResult{batch: adv, metrics: m}, nil
}

// checkpoint has rank 0 write checkpoints/<name> (step-N when name is "")
// and the other ranks wait for it: they may read it next (the KL
// reference), and a failed write stops them all.
func (j *job) checkpoint(ctx context.Context, name string) error {
	work := context.WithoutCancel(ctx)
	// Collective (ZeRO-1): the optimizer state is written whole, gathered
	// on rank 0 (a no-op before the state is sharded).
	if j.r.shard != nil {
		if err := j.r.shard.gatherState(work); err != nil {
			return err
		}
	}
	if j.r.leader() {
		err := j.run.checkpoint(j.eng, j.st, j.sampler, name)
		if j.r.shard != nil {
			if derr := j.r.shard.dropState(work); err == nil {
				err = derr
			}
		}
		if err != nil {
			return err
		}
	}
	return j.r.barrier(work)
}

// keepBest has rank 0 point checkpoints/best at j.best, checkpointed
// just before, and the other ranks wait for it: a failed write stops them all.
func (j *job) keepBest(ctx context.Context) error {
	if j.r.leader() {
		if err := j.run.keepBest(j.best); err != nil {
			return err
		}
	}
	return j.r.barrier(context.WithoutCancel(ctx))
}

// scaleLR returns the optimizer settings with the policy's and the value
// head's learning rates (ppo.value_lr; 0 follows the policy's) times f.
func scaleLR(a torchbridge.AdamW, f float64) torchbridge.AdamW {
	a.LR *= f
	a.ValueLR *= f
	return a
}

// stepSeed derives the sampling seed of a step, so that a resumed run draws
// exactly what the uninterrupted run would have.
func stepSeed(seed int64, step int) uint64 {
	z := uint64(seed)*0x9E3779B97F4A7C15 + uint64(step)*0xBF58476D1CE4E5B9
	z ^= z >> 31
	return z
}

// rawOf lays out a response's raw rewards in calibration's component order.
func rawOf(r router.Rewards) [calibration.NumComponents]float64 {
	var v [calibration.NumComponents]float64
	for k, m := range router.Components {
		v[k] = r.Get(m)
	}
	return v
}

// sequence lays out prompt + response for the loss.
func sequence(prompt []int32, s router.Sample, adv float32) torchbridge.Sequence {
	n := len(prompt) + len(s.Tokens)
	seq := torchbridge.Sequence{Tokens: make([]int32, 0, n), Mask: make([]float32, n), OldLogp: make([]float32, n), Advantage: adv}
	seq.Tokens = append(append(seq.Tokens, prompt...), s.Tokens...)
	copy(seq.Mask[len(prompt):], s.Mask)
	// The rollout's log-probs are the behaviour policy's (untempered), the
	// same weights the first mini-batch starts from.
	copy(seq.OldLogp[len(prompt):], s.Logp)
	return seq
}

func policyTokens(s torchbridge.Sequence) float64 {
	var n float64
	for t, m := range s.Mask {
		if m > 0 && t > 0 {
			n++
		}
	}
	return n
}

// miniBatches deals the rows of a step (questions × g responses, row
// q·g + r for response r of question q) into k mini-batches, each in
// global row order. The rows are taken response by response (response 0
// of every question, then response 1, …) and cut into k contiguous runs
// of that order: with k dividing g, mini-batch m holds responses
// [m·g/k, (m+1)·g/k) of every group. Since a rank holds whole groups,
// every rank then has the same share of every mini-batch, whatever the
// number of ranks; and the mini-batches do not depend on it, so N ranks
// update as one process does. k = 1 is every row in order.
func miniBatches(questions, g, k int) [][]int {
	n := questions * g
	order := make([]int, 0, n)
	for r := 0; r < g; r++ {
		for q := 0; q < questions; q++ {
			order = append(order, q*g+r)
		}
	}
	var out [][]int
	for m := 0; m < k; m++ {
		mb := slices.Clone(order[m*n/k : (m+1)*n/k])
		if len(mb) > 0 {
			slices.Sort(mb)
			out = append(out, mb)
		}
	}
	return out
}

func chunks(idx []int, size int) [][]int {
	var out [][]int
	for len(idx) > 0 {
		n := min(size, len(idx))
		out = append(out, idx[:n])
		idx = idx[n:]
	}
	return out
}

func finite(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return v
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
