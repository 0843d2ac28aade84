// Command speed measures the policy engine on one device (cpu, cuda) and
// dtype for several model sizes: prefill, decode at batch 1 and 64, and the
// train step (clipped loss, backward, AdamW), in tokens per second. It is
// bench/main.go's workload with a device flag and a larger shape than the
// presets; run it once per device and compare (bench/gpu/run.sh's speed
// stage does):
//
//	go run ./bench/gpu/speed -device cuda -dtype float32 -models tiny,small,0.5b
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
	"strings"
	"time"

	"github.com/recal-project/recal/bench/engine"
	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/torchbridge"
)

// shapes: the presets, and Qwen2.5-0.5B's body (the vocabulary is -vocab).
var shapes = map[string]hfmodel.Config{
	"tiny":  hfmodel.Presets["tiny"],
	"small": hfmodel.Presets["small"],
	"0.5b":  {HiddenSize: 896, IntermediateSize: 4864, NumHiddenLayers: 24, NumAttentionHeads: 14, NumKeyValueHeads: 2},
}

type result struct {
	Device string `json:"device"`
	DType  string `json:"dtype"`
	Model  string `json:"model"`
	Params int64  `json:"params"`
	engine.Rates
}

func main() {
	torchbridge.UsePassiveOpenMP()
	device := flag.String("device", "cpu", "cpu, cuda or cuda:N")
	dtype := flag.String("dtype", "float32", "float32 or bfloat16")
	models := flag.String("models", "tiny,small,0.5b", "comma-separated: tiny, small, 0.5b")
	vocab := flag.Int64("vocab", 4000, "vocabulary size (recal's default trims Qwen2.5's to about 4,000)")
	threads := flag.Int("threads", 0, "CPU threads for libtorch (0 = all cores)")
	minTime := flag.Duration("min-time", time.Second, "time each measure repeats for, at least")
	flag.Parse()
	if *threads > 0 {
		if err := torchbridge.SetThreads(*threads); err != nil {
			fail(err)
		}
	}
	for _, m := range strings.Split(*models, ",") {
		r, err := measure(m, *device, *dtype, *vocab, *minTime)
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

func measure(model, device, dtype string, vocab int64, minTime time.Duration) (result, error) {
	shape, ok := shapes[model]
	if !ok {
		return result{}, fmt.Errorf("unknown model %q", model)
	}
	hfmodel.Presets["speed"] = shape
	cfg, err := hfmodel.Preset("speed", vocab)
	delete(hfmodel.Presets, "speed")
	if err != nil {
		return result{}, err
	}
	p, err := engine.NewRandomPolicy(cfg, torchbridge.Options{Device: device, DType: dtype})
	if err != nil {
		return result{}, err
	}
	defer p.Close()
	rates, err := engine.Measure(context.Background(), p, rate(minTime), engine.Options{})
	if err != nil {
		return result{}, err
	}
	return result{Device: device, DType: dtype, Model: model, Params: p.NumParams(), Rates: rates}, nil
}
