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
	torchbridge.UseFastBLAS() // the kernel recal's commands run (it re-executes, with UsePassiveOpenMP's variables)
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
	// The machine: PyTorch's child process inherits the kernel choice
	// (OPENBLAS_CORETYPE), so both engines run the same BLAS kernel.
	k := torchbridge.CurrentBLAS()
	fmt.Printf("cpu: %s, %d cores\nblas: %s\n", k.CPU, runtime.NumCPU(), k)
	var sgemm float64 // single-thread GFLOP/s
	if *python != "" {
		var err error
		if sgemm, err = sgemmRate(*python); err != nil {
			fail(err)
		}
		fmt.Printf("sgemm 1024x1024, 1 thread (PyTorch, same kernel): %.1f GFLOP/s\n", sgemm)
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
		if sgemm > 0 {
			cfg, _ := hfmodel.Preset(name, 151936)
			got := trainFlopsPerToken(cfg, engine.TrainLen) * ours.Train / 1e9
			fmt.Printf("train step: %.1f GFLOP/s = %.0f%% of the sgemm rate × %d threads (%.1f GFLOP/s)\n",
				got, 100*got/(sgemm*float64(*threads)), *threads, sgemm*float64(*threads))
		}
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

// sgemmRate is the single-thread sgemm rate of the machine's BLAS kernel:
// bench/torch_eager.py --sgemm (1024×1024 float32 products in PyTorch, the
// same libtorch and OpenBLAS as recal's).
func sgemmRate(python string) (float64, error) {
	cmd := exec.Command(python, "bench/torch_eager.py", "--sgemm", "--threads", "1")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return 0, fmt.Errorf("%s bench/torch_eager.py --sgemm: %w", python, err)
	}
	var r struct {
		GFLOPs float64 `json:"sgemm_gflops"`
	}
	if err := json.Unmarshal(out, &r); err != nil || r.GFLOPs <= 0 {
		return 0, fmt.Errorf("bench/torch_eager.py --sgemm printed %q", out)
	}
	return r.GFLOPs, nil
}

// trainFlopsPerToken is the arithmetic of one token of the train step on
// sequences of T tokens: the matrix products of the forward pass (two flops
// per weight: the layers' projections and the output head over every
// position; attention's QKᵀ and PV over (T+1)/2 positions on average) and
// twice that in the backward pass (the inputs' and the weights' gradients).
// Norms, softmax, rotary embeddings and AdamW are left out (they are not
// matrix products), so the share it gives of the sgemm rate is a lower
// bound of the work done.
func trainFlopsPerToken(c *hfmodel.Config, T int) float64 {
	H, I, L, V := float64(c.HiddenSize), float64(c.IntermediateSize), float64(c.NumHiddenLayers), float64(c.VocabSize)
	q := float64(c.NumAttentionHeads * c.HeadDimension())
	kv := float64(c.NumKeyValueHeads * c.HeadDimension())
	weights := L*(H*q+2*H*kv+q*H+3*H*I) + V*H
	attention := L * 2 * q * float64(T+1) / 2 // QKᵀ and PV: q·positions multiply-adds each
	return 3 * 2 * (weights + attention)
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
