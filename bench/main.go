// Command bench measures the policy engine on CPU and compares it with the
// same model run by PyTorch eager (bench/torch_eager.py, python3-torch) in
// the same run: prefill tokens/s, decode tokens/s at batch 1 and 64, and
// train-step tokens/s (forward, log-probs, clipped loss, backward, AdamW).
// It prints one table per preset with recal/PyTorch ratios; the target is at
// least 1.0× on every row. Run it with `make bench`.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/recal-project/recal/bench/engine"
	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/torchbridge"
)

var headChunk int

// result is one preset's rates, ours or bench/torch_eager.py's JSON.
type result struct {
	Preset string `json:"preset"`
	engine.Rates
}

func main() {
	torchbridge.UsePassiveOpenMP()
	python := flag.String("python", "/usr/bin/python3", "Python with torch for the reference run; empty skips it")
	threads := flag.Int("threads", runtime.NumCPU(), "CPU threads for both engines")
	presets := flag.String("presets", "tiny,small", "comma-separated presets")
	rollout := flag.Bool("rollout", true, "also run the rollout benchmark (needs runs/init/tiny)")
	flag.IntVar(&headChunk, "head-chunk", 0, "tokens per output-head chunk in the train step (0 = the engine's default)")
	flag.Parse()
	if err := torchbridge.SetThreads(*threads); err != nil {
		fail(err)
	}
	allOK := true
	for _, name := range strings.Split(*presets, ",") {
		ours, err := measure(name)
		if err != nil {
			fail(err)
		}
		var ref *result
		if *python != "" {
			ref, err = reference(*python, name, *threads)
			if err != nil {
				fail(err)
			}
		}
		allOK = report(ours, ref) && allOK
	}
	if !allOK {
		fmt.Println("\nsome rows are below 1.0× PyTorch eager")
	}
	if *rollout {
		if err := rolloutBench(); err != nil {
			fail(err)
		}
		if err := workersBench(max(*threads, 2)); err != nil {
			fail(err)
		}
	}
}

func trainerOptions(cfg config.Config) torchbridge.Options {
	return torchbridge.Options{Device: cfg.Policy.Device, DType: cfg.Policy.DType}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}

// benchmark is measure's engine.Timer: testing.Benchmark, with setup
// outside the timer.
func benchmark(tokensPerOp int, setup, op func() error) (float64, error) {
	var err error
	res := testing.Benchmark(func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if setup != nil {
				b.StopTimer()
				if err = setup(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			if err = op(); err != nil {
				b.Fatal(err)
			}
		}
	})
	if err != nil {
		return 0, err
	}
	if res.N == 0 {
		return 0, nil
	}
	return float64(tokensPerOp) * float64(res.N) / res.T.Seconds(), nil
}

// measure runs the engine workload on a random policy of preset with
// Qwen2.5's full vocabulary, on CPU in float32.
func measure(preset string) (result, error) {
	cfg, err := hfmodel.Preset(preset, 151936)
	if err != nil {
		return result{}, err
	}
	p, err := engine.NewRandomPolicy(cfg, torchbridge.Options{})
	if err != nil {
		return result{}, err
	}
	defer p.Close()
	rates, err := engine.Measure(context.Background(), p, benchmark, engine.Options{HeadChunk: headChunk})
	return result{Preset: preset, Rates: rates}, err
}

func reference(python, preset string, threads int) (*result, error) {
	cmd := exec.Command(python, "bench/torch_eager.py", "--preset", preset, "--threads", fmt.Sprint(threads), "--json")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s bench/torch_eager.py: %w", python, err)
	}
	var r result
	if err := json.Unmarshal(out, &r); err != nil {
		return nil, fmt.Errorf("bench/torch_eager.py printed %q: %w", out, err)
	}
	return &r, nil
}

func report(ours result, ref *result) bool {
	fmt.Printf("\npreset %s (CPU, float32)\n", ours.Preset)
	fmt.Printf("%-22s %14s %14s %8s\n", "measure", "recal tok/s", "torch tok/s", "ratio")
	ok := true
	row := func(name string, a, b float64) {
		if ref == nil {
			fmt.Printf("%-22s %14.0f %14s %8s\n", name, a, "-", "-")
			return
		}
		ratio := a / b
		ok = ok && ratio >= 1
		fmt.Printf("%-22s %14.0f %14.0f %7.2fx\n", name, a, b, ratio)
	}
	var r result
	if ref != nil {
		r = *ref
	}
	row(fmt.Sprintf("prefill (1x%d)", engine.PrefillLen), ours.Prefill, r.Prefill)
	row("decode batch 1", ours.DecodeB1, r.DecodeB1)
	row("decode batch 64", ours.DecodeB64, r.DecodeB64)
	row(fmt.Sprintf("train step (%dx%d)", engine.TrainBatch, engine.TrainLen), ours.Train, r.Train)
	return ok
}
