// Command speed measures the policy engine on one device (cpu, cuda) and
// dtype for several model sizes: prefill, decode at each batch of -batches,
// and the train step (clipped loss, backward, AdamW), in tokens per second.
// It is bench/main.go's workload with a device flag and larger shapes than
// the presets: Qwen2.5-0.5B's and Qwen2.5-3B's bodies with their full
// vocabulary (151,936). Run it once per device and compare (bench/gpu/run.sh's
// speed stage does):
//
//	go run ./bench/gpu/speed -device cuda -dtype bfloat16 -models tiny,small,0.5b,3b -batches 1,16,64,256
//
// Each decode rate is printed next to its memory-bandwidth bound
// (bound_tok_s): a decode step reads every weight once and each row's keys
// and values once, so batch B cannot go faster than B × bandwidth / (weight
// bytes + B × KV bytes at the mean context of the workload's steps).
//
// Each measure runs once to warm up (CUDA kernels load lazily), then repeats
// until -min-time has passed (at least twice). Every bridge call returns its
// results to the host, so the GPU's work is finished when a call returns.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/recal-project/recal/bench/engine"
	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/torchbridge"
)

// shapes: the presets (vocabulary -vocab), Qwen2.5-0.5B's and Qwen2.5-3B's
// bodies (vocabulary -full-vocab).
var shapes = map[string]string{"tiny": "tiny", "small": "small", "0.5b": "qwen2.5-0.5b", "3b": "qwen2.5-3b"}

type result struct {
	Device string `json:"device"`
	DType  string `json:"dtype"`
	Model  string `json:"model"`
	Vocab  int64  `json:"vocab"`
	Params int64  `json:"params"` // elements, the output head counted once when tied
	engine.Rates
	Eager bool `json:"eager,omitempty"` // -eager: CUDA graphs off
	// Kernels are the policy's kernel choices (-kernels, torchbridge.Kernels).
	Kernels torchbridge.Kernels `json:"kernels"`
	// Graphs: the CUDA graphs the decode measures captured and replayed,
	// and why a capture failed ("" when none did).
	Graphs *torchbridge.GraphStats `json:"graphs,omitempty"`
	// Bound is each decode batch's memory-bandwidth bound in tokens/s
	// (-bandwidth; see the package comment), by batch as in Rates.Decode.
	Bound map[string]float64 `json:"bound_tok_s,omitempty"`
}

func main() {
	torchbridge.UsePassiveOpenMP()
	device := flag.String("device", "cpu", "cpu, cuda or cuda:N")
	dtype := flag.String("dtype", "float32", "float32 or bfloat16")
	models := flag.String("models", "tiny,small,0.5b", "comma-separated: tiny, small, 0.5b, 3b")
	vocab := flag.Int64("vocab", 4000, "vocabulary size of tiny and small (recal's default trims Qwen2.5's to about 4,000)")
	fullVocab := flag.Int64("full-vocab", 151936, "vocabulary size of 0.5b and 3b (Qwen2.5's)")
	batchList := flag.String("batches", "1,64", "comma-separated decode batch sizes")
	noTrain := flag.String("no-train", "", "comma-separated models whose train step is skipped")
	eager := flag.Bool("eager", false, "decode without CUDA graphs (torchbridge.Options.EagerDecode)")
	kernels := flag.Int("kernels", int(torchbridge.KernelsDefault), "the policy's kernel choices, a sum of torchbridge.Kernel* flags (0: the arithmetic before any of them, for before/after comparisons in one call)")
	bandwidth := flag.Float64("bandwidth", 3.35e12, "device memory bandwidth in bytes/s for bound_tok_s (H100 SXM: 3.35e12)")
	threads := flag.Int("threads", 0, "CPU threads for libtorch (0 = all cores)")
	minTime := flag.Duration("min-time", time.Second, "time each measure repeats for, at least")
	flag.Parse()
	if *threads > 0 {
		if err := torchbridge.SetThreads(*threads); err != nil {
			fail(err)
		}
	}
	var batches []int
	for _, f := range strings.Split(*batchList, ",") {
		b, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || b < 1 {
			fail(fmt.Errorf("-batches: %q is not a positive batch size", f))
		}
		batches = append(batches, b)
	}
	skip := map[string]bool{}
	for _, m := range strings.Split(*noTrain, ",") {
		skip[strings.TrimSpace(m)] = true
	}
	for _, m := range strings.Split(*models, ",") {
		v := *vocab
		if m == "0.5b" || m == "3b" {
			v = *fullVocab
		}
		o := engine.Options{Batches: batches, NoTrain: skip[m]}
		r, err := measure(m, torchbridge.Options{Device: *device, DType: *dtype, EagerDecode: *eager}, torchbridge.Kernels(*kernels), v, *minTime, o, *bandwidth)
		if err != nil {
			fail(fmt.Errorf("%s: %w", m, err))
		}
		b, _ := json.Marshal(r)
		fmt.Println(string(b))
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "speed:", err)
	os.Exit(1)
}

// rate is an engine.Timer: it runs setup and op once to warm up, then until
// minTime has passed (at least twice), and returns tokens per second. setup
// is timed too (in decode, a prefill of 32 tokens per row, small beside the
// 64 steps).
func rate(minTime time.Duration) engine.Timer {
	return func(tokensPerOp int, setup, op func() error) (float64, error) {
		run := func() error {
			if setup != nil {
				if err := setup(); err != nil {
					return err
				}
			}
			return op()
		}
		if err := run(); err != nil {
			return 0, err
		}
		start, n := time.Now(), 0
		for n < 2 || time.Since(start) < minTime {
			if err := run(); err != nil {
				return 0, err
			}
			n++
		}
		return float64(tokensPerOp*n) / time.Since(start).Seconds(), nil
	}
}

func config(model string, vocab int64) (*hfmodel.Config, error) {
	preset, ok := shapes[model]
	if !ok {
		return nil, fmt.Errorf("unknown model %q (known: tiny, small, 0.5b, 3b)", model)
	}
	return hfmodel.Preset(preset, vocab)
}

func measure(model string, opts torchbridge.Options, kernels torchbridge.Kernels, vocab int64, minTime time.Duration, o engine.Options, bandwidth float64) (result, error) {
	cfg, err := config(model, vocab)
	if err != nil {
		return result{}, err
	}
	p, err := engine.NewRandomPolicy(cfg, opts)
	if err != nil {
		return result{}, err
	}
	defer p.Close()
	if err := p.SetKernels(kernels); err != nil {
		return result{}, err
	}
	rates, err := engine.Measure(context.Background(), p, rate(minTime), o)
	if err != nil {
		return result{}, err
	}
	res := result{Device: opts.Device, DType: opts.DType, Model: model, Vocab: vocab, Params: cfg.NumParams(), Rates: rates,
		Eager: opts.EagerDecode, Kernels: kernels, Bound: bounds(cfg, opts.DType, o.Batches, bandwidth)}
	if gs, err := p.GraphStats(); err == nil && (gs.Captures > 0 || gs.Error != "") {
		res.Graphs = &gs
	}
	return res, nil
}

// bounds are the decode batches' memory-bandwidth bounds in tokens/s: per
// step every weight is read once and each row's keys and values once, at
// the workload's mean context (its prompt and half its steps).
func bounds(cfg *hfmodel.Config, dtype string, batches []int, bandwidth float64) map[string]float64 {
	size := 4.0
	if dtype == "bfloat16" {
		size = 2
	}
	weights := float64(cfg.NumParams()) * size
	ctx := float64(engine.DecodePrompt) + float64(engine.DecodeSteps)/2
	kvPerRow := float64(cfg.NumHiddenLayers) * 2 * float64(cfg.NumKeyValueHeads*cfg.HeadDimension()) * ctx * size
	out := map[string]float64{}
	for _, b := range batches {
		out[strconv.Itoa(b)] = float64(b) * bandwidth / (weights + float64(b)*kvPerRow)
	}
	return out
}
