package trainer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/generate"
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
	// run's: the keys outside OperationalKeys.
	Resume bool
	// AllowConfigChange lets a resume change training keys: the change takes
	// effect at the step after the checkpoint and is recorded in
	// config-changes.jsonl and config-<step>.toml; config.toml is kept.
	AllowConfigChange bool
	Log               *slog.Logger
	// StopAfter, when > 0, ends the run after this many GRPO steps of this
	// invocation, as an interruption would (used by tests of --resume).
	StopAfter int
}

// Train runs the whole job: the optional supervised warm-up, then GRPO with
// ReCal's calibrated advantages (or the algorithm train.algorithm names),
// with validation, checkpoints and logs in opt.RunDir.
func Train(ctx context.Context, cfg config.Config, opt Options) error {
	log := opt.Log
	if log == nil {
		log = slog.Default()
	}
	tc := cfg.Train
	algo, err := newAlgorithm(cfg) // train.algorithm: "grpo" or "ppo" (algorithm.go)
	if err != nil {
		return err
	}
	// Everything is checked and loaded before the run folder is written, so
	// that a job failing at start leaves nothing a second attempt trips on.
	plan, err := inspectRun(opt.RunDir, cfg, opt.Resume, opt.AllowConfigChange)
	if err != nil {
		return err
	}
	// The pool reads its API keys from the environment: a missing one stops
	// the job here.
	if err := CheckPool(cfg); err != nil {
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
	eng, err := OpenEngine(start, torchbridge.Options{Device: cfg.Policy.Device, DType: cfg.Policy.DType})
	if err != nil {
		return err
	}
	defer eng.Close()
	if err := algo.prepare(eng.Policy, start, plan.last != ""); err != nil { // PPO: the value head
		return err
	}
	env, err := NewEnv(cfg, eng, AnswerBank(trainSet, valSet), log)
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
	run, err := openRun(plan, cfg)
	if err != nil {
		return err
	}
	defer run.Close()

	// Stage 1: supervised warm-up on format demonstrations.
	if cfg.SFT.Steps > 0 && !st.SFTDone {
		if err := runSFT(ctx, cfg, env, trainSet, run, log); err != nil {
			if ctx.Err() != nil {
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
		if err := run.checkpoint(eng, &st, sampler, "sft"); err != nil {
			return err
		}
	}

	// The KL reference is the frozen policy at the start of GRPO.
	var ref *torchbridge.Policy
	if tc.KLCoef > 0 {
		refDir := cfg.Policy.Checkpoint
		if st.SFTDone {
			refDir = filepath.Join(run.dir, "checkpoints", "sft")
		}
		if ref, err = torchbridge.LoadPolicy(refDir, torchbridge.Options{Device: cfg.Policy.Device, DType: cfg.Policy.DType}); err != nil {
			return err
		}
		defer ref.Close()
		if err := ref.SetTrainable(false); err != nil {
			return err
		}
	}

	progress := newProgress(tc.Steps, tc.LogEvery, log)
	adam := algo.adamW(torchbridge.AdamW{LR: tc.LR, Beta1: tc.Beta1, Beta2: tc.Beta2, Eps: tc.AdamEps, WeightDecay: tc.WeightDecay, MaxGradNorm: tc.MaxGradNorm})
	sampling := generate.Sampling{Temperature: tc.Temperature, TopP: tc.TopP}
	done := 0
	for st.Step < tc.Steps {
		if ctx.Err() != nil || (opt.StopAfter > 0 && done >= opt.StopAfter) {
			if err := run.checkpoint(eng, &st, sampler, ""); err != nil {
				return err
			}
			return ErrInterrupted
		}
		step := st.Step + 1
		t0 := time.Now()
		usage0 := env.Pool.Usage()
		samplerBefore := sampler.State()

		// 1. Sample a batch of questions across datasets.
		qs := sampler.Next(tc.BatchSize)

		// 2. G rollouts per question (blocking: decoding on the torch
		// thread, pool calls fanned out concurrently meanwhile).
		samples, rstats, err := env.Roll(ctx, qs, tc.GroupSize, sampling, stepSeed(tc.Seed, step), true)
		if err != nil {
			if ctx.Err() != nil {
				// The interrupted step is redone on --resume.
				if err := sampler.Restore(samplerBefore); err != nil {
					return err
				}
				continue
			}
			return err
		}

		// 3. Raw rewards, with the balance counts from before this step.
		rewards := make([]router.Rewards, len(samples))
		var stepCalls []string
		for i, s := range samples {
			q := qs[i/tc.GroupSize]
			calls := s.CalledModels()
			stepCalls = append(stepCalls, calls...)
			rewards[i] = router.Score(&samples[i], q.Golden, cfg.Router.MaxTurns, env.Known, st.Balance)
		}

		// 4. Sequences for the loss: prompt + response, policy tokens masked in.
		seqs := make([]torchbridge.Sequence, len(samples))
		for i, s := range samples {
			prompt, err := env.PromptTokens(qs[i/tc.GroupSize])
			if err != nil {
				return err
			}
			seqs[i] = sequence(prompt, s, 0)
		}
		// From here on the step runs to its end even when interrupted, so a
		// checkpoint never holds a half-applied update.
		work := context.WithoutCancel(ctx)
		if ref != nil { // KL reference log-probs (a forward pass of the frozen policy)
			if err := refLogp(work, ref, seqs, tc.MicroBatch); err != nil {
				return err
			}
		}

		// 5. The advantages the loss uses: ReCal's calibration (GRPO) or
		// GAE with the value head (PPO).
		adv := &stepBatch{qs: qs, g: tc.GroupSize, samples: samples, rewards: rewards, seqs: seqs, st: &st}
		if err := algo.advantages(work, eng.Policy, adv); err != nil {
			return err
		}

		// 6. Loss and backward over micro-batches, one optimizer step per
		// mini-batch (the expensive part: forward+backward through libtorch).
		var loss torchbridge.LossStats
		var gradNorms []float64
		skipped := 0 // optimizer updates of this step skipped for a non-finite gradient norm
		for j, mb := range split(len(seqs), tc.MiniBatches) {
			tokens := 0.0
			for _, i := range mb {
				tokens += policyTokens(seqs[i])
			}
			if tokens == 0 {
				continue
			}
			lo := algo.loss(torchbridge.LossOptions{ClipEps: tc.ClipEps, KLCoef: tc.KLCoef, EntropyCoef: tc.EntropyCoef, Scale: 1 / tokens, HeadChunk: tc.HeadChunk})
			for _, micro := range chunks(mb, tc.MicroBatch) {
				part := make([]torchbridge.Sequence, len(micro))
				for k, i := range micro {
					part[k] = seqs[i]
				}
				ls, err := eng.Policy.Backward(work, part, lo)
				if err != nil {
					return err
				}
				loss.Add(ls)
			}
			gn, err := eng.Policy.Step(work, adam)
			if err != nil {
				return err
			}
			if torchbridge.Skipped(gn) {
				// A NaN/Inf gradient: the bridge left the weights and the
				// optimizer untouched. Count it, say so, and stop below
				// after train.max_skipped_updates in a row.
				skipped++
				st.SkippedUpdates++
				st.ConsecutiveSkips++
				log.Warn("optimizer update skipped: non-finite gradient norm", "step", step, "mini_batch", j+1,
					"grad_norm", fmt.Sprint(gn), "consecutive", st.ConsecutiveSkips, "total", st.SkippedUpdates)
				continue
			}
			st.ConsecutiveSkips = 0
			gradNorms = append(gradNorms, gn)
		}

		// 7. Bookkeeping: EMA routing counts, logs, step counter.
		st.Balance.Update(stepCalls)
		st.Step = step
		done++
		m := stepMetrics(step, samples, rewards, adv.logged, loss, gradNorms, rstats, env.Pool.Usage().Sub(usage0), len(qs), time.Since(t0), env.Pool.Models())
		m.SkippedUpdates, m.SkippedUpdatesTotal = skipped, st.SkippedUpdates
		algo.metrics(adv, loss, &m)
		if err := run.logStep(m, qs, tc.GroupSize, samples, rewards, adv.logged, adv.ppo); err != nil {
			return err
		}
		progress.update(m)
		if tc.MaxSkippedUpdates > 0 && st.ConsecutiveSkips >= tc.MaxSkippedUpdates {
			// No checkpoint: the newest one predates the trouble.
			return fmt.Errorf("%w: step %d: %d consecutive optimizer updates skipped (train.max_skipped_updates = %d); the weights or the batch hold NaN/Inf",
				ErrNonFiniteGradients, step, st.ConsecutiveSkips, tc.MaxSkippedUpdates)
		}

		// 8. Validation and checkpoints.
		last := st.Step == tc.Steps
		if (tc.ValidateEvery > 0 && step%tc.ValidateEvery == 0) || last {
			v, err := Validate(ctx, env, valSet, cfg.Eval.Batch, step)
			if err != nil && ctx.Err() == nil {
				return err
			}
			if err == nil {
				if err := run.logValidation(v); err != nil {
					return err
				}
				log.Info("validation", "step", step, "em", fmt.Sprintf("%.3f", v.Avg.EM), "f1", fmt.Sprintf("%.3f", v.Avg.F1))
			}
		}
		if step%tc.CheckpointEvery == 0 || last {
			if err := run.checkpoint(eng, &st, sampler, ""); err != nil {
				return err
			}
		}
	}
	progress.finish()
	return nil
}

// stepSeed derives the sampling seed of a step, so that a resumed run draws
// exactly what the uninterrupted run would have.
func stepSeed(seed int64, step int) uint64 {
	z := uint64(seed)*0x9E3779B97F4A7C15 + uint64(step)*0xBF58476D1CE4E5B9
	z ^= z >> 31
	return z
}

func rawOf(r router.Rewards) [5]float64 {
	var v [5]float64
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

// refLogp fills RefLogp with the reference policy's log-probs of the policy tokens.
func refLogp(ctx context.Context, ref *torchbridge.Policy, seqs []torchbridge.Sequence, micro int) error {
	idx := make([]int, len(seqs))
	for i := range idx {
		idx[i] = i
	}
	for _, c := range chunks(idx, micro) {
		toks := make([][]int32, len(c))
		masks := make([][]float32, len(c))
		for k, i := range c {
			toks[k], masks[k] = seqs[i].Tokens, seqs[i].Mask
		}
		lp, _, err := ref.ScoreMasked(ctx, toks, masks)
		if err != nil {
			return err
		}
		for k, i := range c {
			seqs[i].RefLogp = lp[k]
		}
	}
	return nil
}

// split deals indices 0..n-1 into k contiguous mini-batches.
func split(n, k int) [][]int {
	var out [][]int
	for j := 0; j < k; j++ {
		lo, hi := j*n/k, (j+1)*n/k
		var mb []int
		for i := lo; i < hi; i++ {
			mb = append(mb, i)
		}
		if len(mb) > 0 {
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
