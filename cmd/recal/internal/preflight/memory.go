package preflight

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/internal/hfmodel"
)

// Job is the work whose memory a dry run plans.
type Job struct {
	// Train: training (rollouts, the update and the optimizer step);
	// otherwise inference with Rows responses decoding at once.
	Train bool
	// World is the job's ranks (1: one process).
	World int
	// Rows is the responses an inference job decodes at once, and RowsKey
	// the setting that says so (eval.batch, serve.max_batch); training
	// decodes its rank's share of the batch (train.rollout_rows).
	Rows    int
	RowsKey string
}

// Options are the plan's options for a job of cfg on a policy of m whose
// prompts take up to promptLen tokens (0: unknown) in a context of ctxLen
// (0: unbounded), each followed by up to capacity response tokens: per rank
// and per step, a micro-batch is train.micro_batch sequences (at most the
// rank's rows of a mini-batch) of prompt and response, padded to the
// longest; the rollout decodes the rank's share of train.batch_size ×
// train.group_size responses at once, or train.rollout_rows of them.
func Options(cfg config.Config, job Job, promptLen, capacity int, ctxLen int64) hfmodel.MemoryOptions {
	world := max(job.World, 1)
	cuda := strings.HasPrefix(cfg.Policy.Device, "cuda")
	o := hfmodel.MemoryOptions{DType: cfg.Policy.DType, CUDA: cuda, Train: job.Train, World: world,
		Checkpointing: cfg.Policy.GradientCheckpointing, ShardOptimizer: cfg.Dist.ShardOptimizer, ShardGradients: cfg.Dist.ShardGradients,
		HeadChunk: cfg.Train.HeadChunk, PromptLen: promptLen, BucketBytes: int64(cfg.Dist.BucketBytes), Runtime: hfmodel.CPURuntime}
	if cuda {
		o.Runtime = hfmodel.CUDARuntime
	}
	o.Capacity = promptLen + capacity
	if ctxLen > 0 {
		o.Capacity = min(o.Capacity, int(ctxLen))
	}
	if !job.Train {
		o.RolloutRows = job.Rows
		return o
	}
	t := cfg.Train
	o.KLReference = cfg.KLCoef() > 0
	o.ReloadReference = cfg.Policy.ReloadReference
	rows := t.BatchSize * t.GroupSize / world // the rank's responses of a step
	o.RolloutRows = rows
	if t.RolloutRows > 0 {
		o.RolloutRows = min(rows, t.RolloutRows)
	}
	perMini := (rows + max(t.MiniBatches, 1) - 1) / max(t.MiniBatches, 1)
	o.MicroSeqs = min(max(t.MicroBatch, 1), perMini)
	o.MicroBatches = (perMini + o.MicroSeqs - 1) / max(o.MicroSeqs, 1)
	o.SeqLen = o.Capacity
	return o
}

// ReadDevice returns a GPU's total memory in bytes ("cuda", "cuda:N"); the
// commands pass one that asks the device (torchbridge.DeviceMemory).
type ReadDevice func(device string) (int64, error)

// DeviceMemory is the memory a rank's policy may use on device, in bytes,
// and where that number comes from: policy.device_memory when set, else on
// a GPU the card's total memory as read (read, when not nil and the card
// answers; each rank has a card of its own), else on the CPU the machine's
// MemTotal (meminfo is /proc/meminfo's text) divided among the ranks that
// share it (world); 0 when unknown (a GPU without policy.device_memory
// that could not be read).
func DeviceMemory(pc config.Policy, world int, meminfo string, read ReadDevice) (int64, string) {
	if pc.DeviceMemory > 0 {
		return int64(pc.DeviceMemory * (1 << 30)), "policy.device_memory"
	}
	if strings.HasPrefix(pc.Device, "cuda") {
		if read == nil {
			return 0, ""
		}
		if b, err := read(pc.Device); err == nil && b > 0 {
			return b, pc.Device + "'s memory, as read"
		}
		return 0, ""
	}
	for _, l := range strings.Split(meminfo, "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil || kb <= 0 {
				return 0, ""
			}
			if world > 1 {
				return (kb << 10) / int64(world), fmt.Sprintf("MemTotal / %d ranks", world)
			}
			return kb << 10, "MemTotal"
		}
	}
	return 0, ""
}

// Memory prints the memory plan per rank of job with cfg on a policy of m,
// phase by phase, and whether its peak fits the device (DeviceMemory): a
// plan that does not fit is a problem, with settings that would make it
// fit when the search (Remedy) finds some.
func (c *Check) Memory(cfg config.Config, m *hfmodel.Config, job Job) {
	promptLen := 0
	if c.prompt != nil && c.tok != nil && c.longest != "" {
		if ids, err := c.prompt.Tokens(c.tok, c.longest); err == nil {
			promptLen = len(ids)
		}
	}
	o := Options(cfg, job, promptLen, c.capacity, c.ctxLen)
	meminfo, _ := os.ReadFile("/proc/meminfo")
	avail, source := DeviceMemory(cfg.Policy, o.World, string(meminfo), c.readDevice)
	plan := m.PlanMemory(o)
	c.Line("memory       per rank (%s)", Describe(o, promptLen > 0))
	for _, ph := range plan.Phases() {
		c.Line("  %s", ph)
	}
	verdict, fits := Verdict(plan, avail, source)
	c.Line("  %s", verdict)
	if fits {
		return
	}
	msg := fmt.Sprintf("memory: %s", verdict)
	// (the settings named leave Headroom of the device free)
	if !job.Train {
		msg += fmt.Sprintf("; lower %s (rows decoding at once) or use a bigger device", job.RowsKey)
	} else if sets, _ := Remedy(cfg, m, job, promptLen, c.capacity, c.ctxLen, avail); sets != nil {
		msg += "; it fits with " + strings.Join(sets, " ")
	} else {
		msg += "; no setting of policy.gradient_checkpointing, dist.shard_optimizer, dist.shard_gradients, policy.reload_reference, train.head_chunk, train.micro_batch or train.rollout_rows makes it fit with 10% to spare: use more ranks, a bigger device or bfloat16"
	}
	c.Problem("%s", msg)
}

// Describe says what a plan is for, in one line.
func Describe(o hfmodel.MemoryOptions, promptKnown bool) string {
	var b []string
	dev := "cpu"
	if o.CUDA {
		dev = "cuda"
	}
	dt := o.DType
	if dt == "" {
		dt = "float32"
	}
	b = append(b, fmt.Sprintf("%d rank(s), %s on %s", max(o.World, 1), dt, dev))
	prompt := fmt.Sprintf("%d-token prompts", o.PromptLen)
	if !promptKnown {
		prompt = "prompt length unknown"
	}
	b = append(b, fmt.Sprintf("rollout %d rows × %d positions (%s)", o.RolloutRows, o.Capacity, prompt))
	if o.Train {
		b = append(b, fmt.Sprintf("update %d × %d-token micro-batch(es) of %d sequences", o.MicroBatches, o.SeqLen, o.MicroSeqs),
			fmt.Sprintf("head_chunk %d", o.HeadChunk), onOff("checkpointing", o.Checkpointing),
			onOff("optimizer sharded", o.ShardOptimizer && o.World > 1), klReference(o))
		if o.ShardOptimizer && o.ShardGradients && o.World > 1 && !o.CUDA {
			b = append(b, "gradients sharded")
		}
	}
	return strings.Join(b, ", ")
}

func klReference(o hfmodel.MemoryOptions) string {
	if o.KLReference && o.ReloadReference {
		return "KL reference reloaded each step"
	}
	return onOff("KL reference", o.KLReference)
}

func onOff(name string, on bool) string {
	if on {
		return name + " on"
	}
	return name + " off"
}

// Verdict says whether plan's peak fits avail bytes (0: unknown) named by
// source.
func Verdict(plan hfmodel.MemoryPlan, avail int64, source string) (string, bool) {
	peak, at := int64(0), ""
	for _, ph := range plan.Phases() {
		if ph.Peak() > peak {
			peak, at = ph.Peak(), ph.Name
		}
	}
	if avail <= 0 {
		return fmt.Sprintf("peak %.2f GiB (%s); the device's memory is unknown: set policy.device_memory (GiB) for a verdict", hfmodel.GiB(peak), at), true
	}
	if peak <= avail {
		return fmt.Sprintf("peak %.2f GiB (%s) of %.2f GiB (%s): fits, %.2f GiB to spare", hfmodel.GiB(peak), at, hfmodel.GiB(avail), source, hfmodel.GiB(avail-peak)), true
	}
	return fmt.Sprintf("peak %.2f GiB (%s) of %.2f GiB (%s): does NOT fit, %.2f GiB over", hfmodel.GiB(peak), at, hfmodel.GiB(avail), source, hfmodel.GiB(peak-avail)), false
}

// Headroom is the share of the device Remedy leaves free: the plan is an
// estimate (bench/memory measures it within about 15% on the CPU), and
// allocators fragment.
const Headroom = 0.10

// Remedy searches for training settings that make the job fit (1 −
// Headroom) of avail bytes: for the reference scoring, the update and the
// step, in turn activation checkpointing, sharding the optimizer (several
// ranks), sharding the gradients (several ranks on the CPU), reloading the
// KL reference each step, train.head_chunk 256 and
// halving train.micro_batch, as far as needed;
// then for the rollout the largest train.rollout_rows that fits. It
// returns them as --set flags with the config they make, or nil when these
// do not suffice (or the job is not training).
func Remedy(cfg config.Config, m *hfmodel.Config, job Job, promptLen, capacity int, ctxLen, avail int64) ([]string, config.Config) {
	if avail <= 0 || !job.Train {
		return nil, cfg
	}
	target := int64(float64(avail) * (1 - Headroom))
	var sets []string
	plan := func() hfmodel.MemoryPlan { return m.PlanMemory(Options(cfg, job, promptLen, capacity, ctxLen)) }
	trainFits := func() bool { p := plan(); return max(p.Reference.Peak(), p.Update.Peak(), p.Step.Peak()) <= target }
	if !trainFits() && !cfg.Policy.GradientCheckpointing {
		cfg.Policy.GradientCheckpointing = true
		sets = append(sets, "--set policy.gradient_checkpointing=true")
	}
	if !trainFits() && job.World > 1 && !cfg.Dist.ShardOptimizer {
		cfg.Dist.ShardOptimizer = true
		sets = append(sets, "--set dist.shard_optimizer=true")
	}
	if !trainFits() && job.World > 1 && !cfg.Dist.ShardGradients && !strings.HasPrefix(cfg.Policy.Device, "cuda") {
		cfg.Dist.ShardGradients = true
		sets = append(sets, "--set dist.shard_gradients=true")
	}
	if !trainFits() && cfg.KLCoef() > 0 && !cfg.Policy.ReloadReference {
		cfg.Policy.ReloadReference = true
		sets = append(sets, "--set policy.reload_reference=true")
	}
	if !trainFits() && cfg.Train.HeadChunk > 256 {
		cfg.Train.HeadChunk = 256
		sets = append(sets, "--set train.head_chunk=256")
	}
	if micro := cfg.Train.MicroBatch; !trainFits() && micro > 1 {
		for !trainFits() && cfg.Train.MicroBatch > 1 {
			cfg.Train.MicroBatch /= 2
		}
		sets = append(sets, fmt.Sprintf("--set train.micro_batch=%d", cfg.Train.MicroBatch))
	}
	if !trainFits() {
		return nil, cfg
	}
	if plan().Rollout.Peak() > target {
		// The rollout's peak grows with its rows: bisect for the largest
		// count that fits (a linear search took minutes at group_size 10^6).
		rolloutFits := func(rows int) bool { cfg.Train.RolloutRows = rows; return plan().Rollout.Peak() <= target }
		lo, hi := 1, Options(cfg, job, promptLen, capacity, ctxLen).RolloutRows // fits(hi) is false
		if !rolloutFits(lo) {
			return nil, cfg
		}
		for hi-lo > 1 {
			if mid := lo + (hi-lo)/2; rolloutFits(mid) {
				lo = mid
			} else {
				hi = mid
			}
		}
		cfg.Train.RolloutRows = lo
		sets = append(sets, fmt.Sprintf("--set train.rollout_rows=%d", lo))
	}
	if sets == nil { // it fits the device but not the headroom: nothing to change
		return nil, cfg
	}
	return sets, cfg
}
