// Command memory measures the peak memory and the time of GRPO updates of a
// Qwen2-shaped policy on the CPU (or one GPU) against the memory plan the
// dry run prints (hfmodel.Config.PlanMemory), configuration by
// configuration:
//
//	go run ./bench/memory [-preset qwen2.5-0.5b] [-layers N] [-seqs 4] [-len 256]
//	go run ./bench/memory -device cuda -dtype bfloat16 -preset qwen2.5-3b -configs chunked+ckpt
//
// On a GPU the peaks are the CUDA caching allocator's peak of memory held
// by tensors, read against the plan without the CUDA context, and only the
// one-rank configurations run.
//
// The policy has the preset's shape with the full vocabulary (-vocab,
// Qwen2.5's 151,936 ids) and random weights, as `recal policy init --preset`
// makes them, plus a frozen KL reference (-kl, as train.kl_coef > 0 keeps).
// Each configuration runs -steps GRPO updates of one micro-batch of -seqs
// sequences of -len tokens (the last three quarters of each masked in as
// the policy's tokens): the loss's forward and backward, for several ranks
// the gradient all-reduce (Gloo, loopback), the AdamW step and, sharded,
// the all-gather of the parameters, exactly the calls trainer.Train makes.
// "2 lean" also reloads the reference each update (policy.reload_reference:
// loaded from a checkpoint written at start, it scores the micro-batch and
// is freed before the backward); the other configurations keep it in
// memory, unused. "2 zero2" is "2 lean" with the gradient sums sharded too
// (dist.shard_gradients: ZeRO-2, the buckets reduced layer by layer during
// the backward, each keeping the rank's shares).
//
// Each configuration runs in processes of its own (one per rank), one
// configuration at a time, with the malloc settings of `recal train`
// (torchbridge.UseTrainingMalloc). A process reports its resident memory
// before the policy exists ("runtime") and its peak resident memory
// (VmHWM in /proc/self/status) after each update. Before a configuration
// starts, its predicted peak over all its ranks must be below MemAvailable
// (/proc/meminfo) minus -headroom GiB, or it is skipped and said so: the
// machine is shared.
//
// It prints, per configuration, the largest rank's VmHWM after the first
// update's backward, after the first update and after the last, each
// against the plan (the update phase, less the optimizer state with
// -prepare=false, where the first step creates it; the larger of that and
// the step phase, as VmHWM keeps the backward's peak; the plan's peak),
// the last
// update's time and its ratio to the first configuration's, then the
// plan's phases, and a json line with the raw measurements. -from FILE
// prints a saved output's measurements against the current plan
// (bench/memory/results holds the runs docs/memory.md reports).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/torchbridge"
)

var (
	preset   = flag.String("preset", "qwen2.5-0.5b", "shape preset (hfmodel.Presets)")
	vocab    = flag.Int64("vocab", 151936, "vocabulary size")
	layers   = flag.Int("layers", 0, "decoder layers (0 = the preset's)")
	seqs     = flag.Int("seqs", 4, "sequences per micro-batch (train.micro_batch)")
	seqLen   = flag.Int("len", 256, "tokens per sequence")
	steps    = flag.Int("steps", 2, "GRPO updates per configuration")
	threads  = flag.Int("threads", 0, "libtorch threads per process (0 = cores / ranks)")
	kl       = flag.Bool("kl", true, "keep a frozen KL reference (train.kl_coef > 0)")
	only     = flag.String("configs", "", "comma-separated configuration names to run (empty = all)")
	headroom = flag.Float64("headroom", 6, "GiB of MemAvailable to leave free: a configuration predicted to need more is skipped")
	chunked  = flag.Int("chunk", 128, "train.head_chunk of the chunked configurations")
	from     = flag.String("from", "", "print the table from the json lines of an earlier run's output (run with the same -preset, -layers, -seqs, -len, -kl) against the current plan, running nothing")
	prepare  = flag.Bool("prepare", true, "allocate the optimizer state (and with 2 ranks the gradient buckets) before the first backward, as recal train does (Policy.PrepareUpdate); false: at the first update's step and all-reduce")
	glibc    = flag.Bool("training-malloc", true, "run with recal train's malloc settings (torchbridge.UseTrainingMalloc); false: glibc's defaults")
	device   = flag.String("device", "cpu", "cpu, or cuda (one GPU: the one-rank configurations, peaks from the CUDA caching allocator)")
	dtype    = flag.String("dtype", "float32", "float32 or bfloat16")
	random   = flag.Bool("random", true, "draw random weights (false: zeros, the same memory, no time spent drawing 3B normals on the CPU)")
)

// onGPU: the policy runs on a GPU; a rank's peaks are the CUDA caching
// allocator's peak of memory held by tensors (torchbridge.DeviceMemory),
// against the plan without the CUDA context (Runtime 0).
func onGPU() bool { return strings.HasPrefix(*device, "cuda") }

// setup is one configuration.
type setup struct {
	Name          string `json:"name"`
	World         int    `json:"world"`
	Shard         bool   `json:"shard"`
	Checkpointing bool   `json:"checkpointing"`
	HeadChunk     int    `json:"head_chunk"`
	// Prepare: the optimizer state (and with several ranks the gradient
	// buckets) made before the first backward (-prepare; runs saved before
	// it existed made them at the first step).
	Prepare bool `json:"prepare,omitempty"`
	// Reload: the KL reference is written to a checkpoint once and, each
	// update, loaded from it, scores the micro-batch and is freed
	// (policy.reload_reference); otherwise it stays in memory, unused.
	Reload bool `json:"reload,omitempty"`
	// Grads: the gradient sums sharded too (dist.shard_gradients, ZeRO-2):
	// each update's backward reduces the buckets as its checkpointed layers
	// complete them.
	Grads bool `json:"grads,omitempty"`
}

func setups() []setup {
	n := *seqs * *seqLen // one chunk: no chunking
	all := []setup{
		{Name: "unchunked", World: 1, HeadChunk: n},
		{Name: "chunked", World: 1, HeadChunk: *chunked},
		{Name: "chunked+ckpt", World: 1, HeadChunk: *chunked, Checkpointing: true},
		{Name: "2 ranks", World: 2, HeadChunk: *chunked},
		{Name: "2 ranks sharded", World: 2, Shard: true, HeadChunk: *chunked},
		{Name: "2 sharded+ckpt", World: 2, Shard: true, HeadChunk: *chunked, Checkpointing: true},
		{Name: "2 lean", World: 2, Shard: true, HeadChunk: *chunked, Checkpointing: true, Reload: true},
		{Name: "2 zero2", World: 2, Shard: true, HeadChunk: *chunked, Checkpointing: true, Reload: true, Grads: true},
	}
	for i := range all {
		all[i].Prepare = *prepare
	}
	return all
}

// report is what one rank prints when it is done.
type report struct {
	Rank    int     `json:"rank"`
	Runtime int64   `json:"runtime"` // VmRSS before the policy, bytes
	Peaks   []int64 `json:"peaks"`   // VmHWM after each update, bytes
	// VmHWM after each update's backward (the update phase) and, for
	// several ranks, after its all-reduce, bytes.
	BackwardPeaks  []int64 `json:"backward_peaks"`
	AllReducePeaks []int64 `json:"allreduce_peaks,omitempty"`
	// VmHWM after each update's reference scoring (Reload), bytes.
	RefPeaks []int64 `json:"ref_peaks,omitempty"`
	// Each phase's own peak (CPU: VmHWM reset at the phase's start through
	// /proc/self/clear_refs), per update, bytes: the reference's scoring
	// (Reload), the update (backward and all-reduce), the step (and
	// all-gather). Empty where the peak cannot be reset.
	RefPhase    []int64   `json:"ref_phase,omitempty"`
	UpdatePhase []int64   `json:"update_phase,omitempty"`
	StepPhase   []int64   `json:"step_phase,omitempty"`
	Times       []float64 `json:"times"` // seconds of each update
	Loss        float64   `json:"loss"`
}

const childEnv = "RECAL_BENCH_MEMORY"

func main() {
	torchbridge.UsePassiveOpenMP()
	flag.Parse()
	if *glibc {
		torchbridge.UseTrainingMalloc()
	}
	if s := os.Getenv(childEnv); s != "" {
		if err := child(s); err != nil {
			fmt.Fprintln(os.Stderr, "bench/memory:", err)
			os.Exit(1)
		}
		return
	}
	if err := parent(); err != nil {
		fmt.Fprintln(os.Stderr, "bench/memory:", err)
		os.Exit(1)
	}
}

func shape() (*hfmodel.Config, error) {
	cfg, err := hfmodel.Preset(*preset, *vocab)
	if err != nil {
		return nil, err
	}
	if *layers > 0 {
		cfg.NumHiddenLayers = int64(*layers)
	}
	return cfg, nil
}

func plan(cfg *hfmodel.Config, s setup) hfmodel.MemoryPlan {
	rt := int64(hfmodel.CPURuntime)
	if onGPU() {
		rt = 0
	}
	return cfg.PlanMemory(hfmodel.MemoryOptions{DType: *dtype, CUDA: onGPU(), Train: true, KLReference: *kl, World: s.World,
		ShardOptimizer: s.Shard, ShardGradients: s.Grads, Checkpointing: s.Checkpointing, MicroSeqs: *seqs, SeqLen: *seqLen, MicroBatches: 1,
		HeadChunk: s.HeadChunk, Runtime: rt, ReloadReference: s.Reload && *kl})
}

// trainPeak is the plan's peak of what the bench runs: the reference's
// scoring (Reload), the update and the step (no rollout).
func trainPeak(p hfmodel.MemoryPlan) int64 {
	return max(p.Reference.Peak(), p.Update.Peak(), p.Step.Peak())
}

func memInfo(key string) (int64, error) { return procKB("/proc/meminfo", key) }

// procKB reads the line "KEY: N kB" of a /proc file (meminfo, status), in
// bytes.
func procKB(path, key string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == key+":" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("%s has no %s", path, key)
}

func parent() error {
	cfg, err := shape()
	if err != nil {
		return err
	}
	if *from != "" {
		return replan(cfg, *from)
	}
	host, _ := os.Hostname()
	where := fmt.Sprintf("on the CPU (%d cores, %s, OPENBLAS_CORETYPE=%s)", runtime.NumCPU(), host, os.Getenv("OPENBLAS_CORETYPE"))
	if onGPU() {
		where = fmt.Sprintf("on %s (%s; peaks: the CUDA caching allocator's tensors, the plan without the CUDA context)", *device, host)
	}
	fmt.Printf("bench/memory: %s shape, %d layers, vocabulary %d, %d parameters (%.2f B); %s %s; "+
		"micro-batch %d × %d tokens, KL reference %v, %d update(s) per configuration; %s\n",
		*preset, cfg.NumHiddenLayers, cfg.VocabSize, cfg.NumParams(), float64(cfg.NumParams())/1e9, *dtype, where,
		*seqs, *seqLen, *kl, *steps, time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Println(header)
	var base float64
	for _, s := range setups() {
		if *only != "" && !contains(strings.Split(*only, ","), s.Name) {
			continue
		}
		p := plan(cfg, s)
		if onGPU() && s.World > 1 {
			fmt.Printf("%-16s skipped: %d ranks need %d GPUs; this bench runs on one\n", s.Name, s.World, s.World)
			continue
		}
		need := trainPeak(p) * int64(s.World)
		avail, err := memInfo("MemAvailable")
		if err != nil {
			return err
		}
		if !onGPU() && need > avail-int64(*headroom*(1<<30)) {
			fmt.Printf("%-16s skipped: its %d rank(s) are planned at %.2f GiB, MemAvailable is %.2f GiB (%.0f GiB kept free)\n",
				s.Name, s.World, hfmodel.GiB(need), hfmodel.GiB(avail), *headroom)
			continue
		}
		reps, err := run(s)
		if err != nil {
			return fmt.Errorf("%s: %w", s.Name, err)
		}
		row(cfg, s, reps, &base)
		b, _ := json.Marshal(struct {
			Setup   setup    `json:"setup"`
			Reports []report `json:"reports"`
			Planned int64    `json:"planned"`
		}{s, reps, trainPeak(p)})
		fmt.Printf("  json %s\n", b)
	}
	fmt.Println(legend)
	return nil
}

const legend = "GiB per rank, measured: the largest rank's VmHWM after the first update's backward, after the first update and after the last; planned: hfmodel.PlanMemory's update phase (less the optimizer state when the first step creates it: -prepare=false), the larger of that and its step phase (VmHWM keeps the backward's peak), and the plan's peak; update s: the last update's wall time on the slowest rank, × time: over the first configuration's; phases: each phase's own peak in the last update (VmHWM reset at its start), the largest rank's, against the plan's phase"

// header is the table's first line.
const header = "configuration      runtime | 1st backward  planned  ratio | 1st step  planned  ratio | all updates  planned  ratio | update s  × time"

// row prints one configuration's line: the first update's backward (the
// optimizer state does not exist yet) and step against the plan's update
// (less the optimizer state without -prepare) and step phases, and the peak over every
// update against the plan's peak; then the plan's phases.
func row(cfg *hfmodel.Config, s setup, reps []report, base *float64) {
	p := plan(cfg, s)
	var peak, bw1, st1, rt int64
	var t float64
	for _, r := range reps {
		peak = max(peak, r.Peaks[len(r.Peaks)-1])
		st1 = max(st1, r.Peaks[0])
		if len(r.BackwardPeaks) > 0 { // absent from runs before it was measured
			bw1 = max(bw1, r.BackwardPeaks[0])
		}
		rt = max(rt, r.Runtime)
		t = max(t, r.Times[len(r.Times)-1])
	}
	if *base == 0 {
		*base = t
	}
	first := max(p.Reference.Peak(), p.Update.Peak()) // the optimizer state made before the first backward
	if !s.Prepare {                                   // made by the first step
		first -= p.Update.Part("AdamW moments") + p.Update.Part("float32 master weights")
	}
	// VmHWM after the first update holds its backward's peak too: the plan
	// to read it against is the larger of the backward's and the step's.
	step1 := max(first, p.Step.Peak())
	ratio := func(a, b int64) float64 { return float64(a) / float64(b) }
	fmt.Printf("%-16s %8.2f | %12.2f %8.2f %6.3f | %8.2f %8.2f %6.3f | %11.2f %8.2f %6.3f | %8.1f %7.2f\n", s.Name, hfmodel.GiB(rt),
		hfmodel.GiB(bw1), hfmodel.GiB(first), ratio(bw1, first), hfmodel.GiB(st1), hfmodel.GiB(step1), ratio(st1, step1),
		hfmodel.GiB(peak), hfmodel.GiB(trainPeak(p)), ratio(peak, trainPeak(p)), t, t / *base)
	// Each phase's own peak in the last update, the largest rank's.
	var ref, upd, stp int64
	for _, r := range reps {
		last := func(v []int64) int64 {
			if len(v) == 0 {
				return 0
			}
			return v[len(v)-1]
		}
		ref, upd, stp = max(ref, last(r.RefPhase)), max(upd, last(r.UpdatePhase)), max(stp, last(r.StepPhase))
	}
	if upd > 0 {
		var b strings.Builder
		b.WriteString("    phases, last update:")
		if ref > 0 {
			fmt.Fprintf(&b, " ref %.2f planned %.2f (%.3f),", hfmodel.GiB(ref), hfmodel.GiB(p.Reference.Peak()), ratio(ref, p.Reference.Peak()))
		}
		fmt.Fprintf(&b, " update %.2f planned %.2f (%.3f), step %.2f planned %.2f (%.3f)", hfmodel.GiB(upd), hfmodel.GiB(p.Update.Peak()),
			ratio(upd, p.Update.Peak()), hfmodel.GiB(stp), hfmodel.GiB(p.Step.Peak()), ratio(stp, p.Step.Peak()))
		fmt.Println(b.String())
	}
	if len(p.Reference.Parts) > 0 {
		fmt.Printf("    plan: %s\n", p.Reference)
	}
	fmt.Printf("    plan: %s\n    plan: %s\n", p.Update, p.Step)
}

// replan prints the table of an earlier run's output file against the
// current plan.
func replan(cfg *hfmodel.Config, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	var base float64
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "  json ")
		if !ok {
			if strings.HasPrefix(sc.Text(), "bench/memory:") {
				fmt.Printf("measured by: %s\n", sc.Text())
				fmt.Println(header)
			}
			continue
		}
		var rec struct {
			Setup   setup    `json:"setup"`
			Reports []report `json:"reports"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		row(cfg, rec.Setup, rec.Reports, &base)
	}
	fmt.Println(legend)
	return sc.Err()
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if strings.TrimSpace(y) == x {
			return true
		}
	}
	return false
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// run starts the configuration's ranks and collects their reports.
func run(s setup) ([]report, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	spec, _ := json.Marshal(s)
	th := *threads
	if th == 0 {
		th = max(runtime.NumCPU()/s.World, 1)
	}
	var cmds []*exec.Cmd
	var outs []*bufio.Reader
	for r := range s.World {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(exe, os.Args[1:]...)
		cmd.Env = append(os.Environ(), childEnv+"="+string(spec), "RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(s.World),
			"MASTER_PORT="+strconv.Itoa(port), "RECAL_BENCH_THREADS="+strconv.Itoa(th))
		cmd.Stderr = os.Stderr
		o, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		cmds = append(cmds, cmd)
		outs = append(outs, bufio.NewReader(o))
	}
	var reps []report
	var first error
	for r, cmd := range cmds {
		line, err := outs[r].ReadBytes('\n')
		if err == nil {
			var rep report
			if err = json.Unmarshal(line, &rep); err == nil {
				reps = append(reps, rep)
			}
		}
		if werr := cmd.Wait(); werr != nil && err == nil {
			err = werr
		}
		if err != nil && first == nil {
			first = fmt.Errorf("rank %d: %w", r, err)
		}
	}
	return reps, first
}

func status(key string) (int64, error) { return procKB("/proc/self/status", key) }

// child is one rank of configuration spec.
func child(spec string) error {
	var s setup
	if err := json.Unmarshal([]byte(spec), &s); err != nil {
		return err
	}
	rank, _ := strconv.Atoi(os.Getenv("RANK"))
	port, _ := strconv.Atoi(os.Getenv("MASTER_PORT"))
	th, _ := strconv.Atoi(os.Getenv("RECAL_BENCH_THREADS"))
	ctx := context.Background()
	if err := torchbridge.SetThreads(th); err != nil {
		return err
	}
	var rep report
	rep.Rank = rank
	var err error
	if rep.Runtime, err = status("VmRSS"); err != nil {
		return err
	}
	// peak is the rank's peak so far: VmHWM on the CPU, the allocator's
	// peak of tensors on a GPU.
	// With phases, VmHWM is reset at each phase's start (clear_refs 5) and
	// peak keeps the running maximum over the phases read so far.
	var seen int64
	resetHWM := func() error { return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }
	phases := !onGPU() && resetHWM() == nil
	readHWM := func() (int64, error) {
		hwm, err := status("VmHWM")
		seen = max(seen, hwm)
		return hwm, err
	}
	peak := func() (int64, error) {
		_, err := readHWM()
		return seen, err
	}
	// phase ends a phase: appends its own peak to *to (when to is not nil)
	// and starts the next.
	phase := func(to *[]int64) error {
		if !phases {
			return nil
		}
		hwm, err := readHWM()
		if err != nil {
			return err
		}
		if to != nil {
			*to = append(*to, hwm)
		}
		return resetHWM()
	}
	if onGPU() {
		rep.Runtime = 0
		peak = func() (int64, error) {
			m, err := torchbridge.DeviceMemory(*device, false)
			return m.PeakAllocated, err
		}
	}
	cfg, err := shape()
	if err != nil {
		return err
	}
	opts := torchbridge.Options{Device: *device, DType: *dtype}
	pol, err := torchbridge.NewPolicy(cfg, opts)
	if err != nil {
		return err
	}
	defer pol.Close()
	if *random {
		if err := pol.InitRandom(1, 0.02); err != nil {
			return err
		}
	}
	refDir := "" // the reference's checkpoint (Reload)
	if *kl {
		ref, err := torchbridge.NewPolicy(cfg, opts)
		if err != nil {
			return err
		}
		defer ref.Close()
		if *random {
			if err := ref.InitRandom(1, 0.02); err != nil {
				return err
			}
		}
		if err := ref.SetTrainable(false); err != nil {
			return err
		}
		if s.Reload {
			tmp, err := os.MkdirTemp("", "bench-memory-ref-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(tmp)
			refDir = filepath.Join(tmp, "ref")
			if err := ref.Save(refDir); err != nil {
				return err
			}
			if err := ref.Close(); err != nil {
				return err
			}
			debug.FreeOSMemory() // the save's buffers: the Go heap gives them back now
		}
	}
	if err := pol.SetCheckpointing(s.Checkpointing); err != nil {
		return err
	}
	var group *torchbridge.ProcessGroup
	if s.World > 1 {
		if group, err = torchbridge.NewProcessGroup(ctx, torchbridge.GroupOptions{Rank: rank, WorldSize: s.World, MasterPort: port}); err != nil {
			return err
		}
		defer group.Close()
		if s.Shard {
			if err := pol.ShardOptimizer(rank, s.World); err != nil {
				return err
			}
		}
	}
	if s.Prepare {
		if group != nil {
			err = group.PrepareUpdate(ctx, pol)
		} else {
			err = pol.PrepareUpdate(ctx)
		}
		if err != nil {
			return err
		}
	}
	if s.Grads {
		if group == nil || !s.Shard || !s.Prepare {
			return fmt.Errorf("%s: sharded gradients need several ranks, a sharded optimizer and -prepare", s.Name)
		}
		if err := group.ShardGradients(ctx, pol, true); err != nil {
			return err
		}
	}
	rng := rand.New(rand.NewPCG(uint64(rank), 7))
	batch := make([]torchbridge.Sequence, *seqs)
	for i := range batch {
		sq := torchbridge.Sequence{Tokens: make([]int32, *seqLen), Mask: make([]float32, *seqLen), Advantage: float32(rng.NormFloat64()),
			OldLogp: make([]float32, *seqLen), RefLogp: make([]float32, *seqLen)}
		for t := range sq.Tokens {
			sq.Tokens[t] = int32(rng.Int64N(cfg.VocabSize))
			if t >= *seqLen/4 {
				sq.Mask[t] = 1
			}
			sq.OldLogp[t] = -11.93 // about log(1/151936): a random policy's
			sq.RefLogp[t] = -11.93
		}
		batch[i] = sq
	}
	adam := torchbridge.AdamW{LR: 1e-6, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, MaxGradNorm: 1}
	toks, masks := make([][]int32, len(batch)), make([][]float32, len(batch))
	for i, sq := range batch {
		toks[i], masks[i] = sq.Tokens, sq.Mask
	}
	for range *steps {
		t0 := time.Now()
		if err := phase(nil); err != nil { // what came before the update: no phase of its own
			return err
		}
		if refDir != "" { // as trainer's reference.score: release, load, score, free
			if err := torchbridge.ReleaseMemory(); err != nil {
				return err
			}
			ref, err := torchbridge.LoadPolicy(refDir, opts)
			if err != nil {
				return err
			}
			lp, _, err := ref.ScoreMasked(ctx, toks, masks)
			if err != nil {
				return err
			}
			if err := ref.Close(); err != nil {
				return err
			}
			for i := range batch {
				batch[i].RefLogp = lp[i]
			}
			hwm, err := peak()
			if err != nil {
				return err
			}
			rep.RefPeaks = append(rep.RefPeaks, hwm)
			if err := phase(&rep.RefPhase); err != nil {
				return err
			}
		}
		if s.Grads { // as trainer.Train: the update's last backward reduces as it goes
			if err := group.ReduceInBackward(ctx, pol); err != nil {
				return err
			}
		}
		ls, err := pol.Backward(ctx, batch, torchbridge.LossOptions{ClipEps: 0.2, KLCoef: 0.001, Scale: 1.0 / float64(*seqs**seqLen), HeadChunk: s.HeadChunk})
		if err != nil {
			return err
		}
		rep.Loss = ls.Loss
		hwm, err := peak()
		if err != nil {
			return err
		}
		rep.BackwardPeaks = append(rep.BackwardPeaks, hwm)
		if group != nil {
			if err := group.AllReduceGrads(ctx, pol); err != nil {
				return err
			}
			if hwm, err = peak(); err != nil {
				return err
			}
			rep.AllReducePeaks = append(rep.AllReducePeaks, hwm)
		}
		if err := phase(&rep.UpdatePhase); err != nil {
			return err
		}
		if _, err := pol.Step(ctx, adam); err != nil {
			return err
		}
		if group != nil && s.Shard {
			if err := group.GatherParams(ctx, pol); err != nil {
				return err
			}
		}
		rep.Times = append(rep.Times, time.Since(t0).Seconds())
		if hwm, err = peak(); err != nil {
			return err
		}
		rep.Peaks = append(rep.Peaks, hwm)
		if err := phase(&rep.StepPhase); err != nil {
			return err
		}
	}
	b, err := json.Marshal(rep)
	if err != nil {
		return err
	}
	fmt.Println(string(b))
	return nil
}
