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
	"math/rand"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/torchbridge"
)

// The workload, shared with bench/torch_eager.py.
const (
	prefillLen   = 256
	decodePrompt = 32
	decodeSteps  = 64
	trainBatch   = 8
	trainLen     = 256
)

var headChunk int

type result struct {
	Preset    string  `json:"preset"`
	Prefill   float64 `json:"prefill_tok_s"`
	DecodeB1  float64 `json:"decode_b1_tok_s"`
	DecodeB64 float64 `json:"decode_b64_tok_s"`
	Train     float64 `json:"train_tok_s"`
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
	}
}

func trainerOptions(cfg config.Config) torchbridge.Options {
	return torchbridge.Options{Device: cfg.Policy.Device, DType: cfg.Policy.DType}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}

func tokens(r *rand.Rand, n int, vocab int64) []int32 {
	s := make([]int32, n)
	for i := range s {
		s[i] = int32(r.Int63n(vocab))
	}
	return s
}

// perSecond runs fn under testing.Benchmark and converts to tokens/s.
func perSecond(tokensPerOp int, fn func(b *testing.B)) float64 {
	res := testing.Benchmark(fn)
	if res.N == 0 {
		return 0
	}
	return float64(tokensPerOp) * float64(res.N) / res.T.Seconds()
}

func measure(preset string) (result, error) {
	ctx := context.Background()
	cfg, err := hfmodel.Preset(preset, 151936)
	if err != nil {
		return result{}, err
	}
	p, err := torchbridge.NewPolicy(cfg, torchbridge.Options{})
	if err != nil {
		return result{}, err
	}
	defer p.Close()
	if err := p.InitRandom(1, 0.02); err != nil {
		return result{}, err
	}
	r := rand.New(rand.NewSource(1))
	res := result{Preset: preset}
	var benchErr error
	check := func(b *testing.B, err error) {
		if err != nil {
			benchErr = err
			b.Fatal(err)
		}
	}

	// Prefill: one prompt of prefillLen tokens into an empty cache.
	cache, err := p.NewCache(1, prefillLen+1)
	if err != nil {
		return result{}, err
	}
	prompt := tokens(r, prefillLen, cfg.VocabSize)
	res.Prefill = perSecond(prefillLen, func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			check(b, cache.Reset(ctx))
			_, err := cache.Extend(ctx, torchbridge.Step{Rows: []int{0}, Tokens: [][]int32{prompt}})
			check(b, err)
		}
	})
	cache.Close()

	// Decode: prefill decodePrompt tokens per row (outside the timer), then
	// decodeSteps greedy steps feeding back the sampled token.
	decode := func(batch int) float64 {
		c, err := p.NewCache(batch, decodePrompt+decodeSteps+1)
		if err != nil {
			benchErr = err
			return 0
		}
		defer c.Close()
		rows := make([]int, batch)
		prompts := make([][]int32, batch)
		for i := range rows {
			rows[i] = i
			prompts[i] = tokens(r, decodePrompt, cfg.VocabSize)
		}
		return perSecond(batch*decodeSteps, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				check(b, c.Reset(ctx))
				out, err := c.Extend(ctx, torchbridge.Step{Rows: rows, Tokens: prompts})
				check(b, err)
				b.StartTimer()
				for s := 0; s < decodeSteps; s++ {
					feed := make([][]int32, batch)
					for j := range feed {
						feed[j] = []int32{out.Next[j]}
					}
					out, err = c.Extend(ctx, torchbridge.Step{Rows: rows, Tokens: feed})
					check(b, err)
				}
			}
		})
	}
	res.DecodeB1 = decode(1)
	res.DecodeB64 = decode(64)

	// Train step: the clipped policy-gradient loss on trainBatch sequences
	// of trainLen tokens, backward, AdamW with clipping.
	seqs := make([]torchbridge.Sequence, trainBatch)
	for i := range seqs {
		s := torchbridge.Sequence{Tokens: tokens(r, trainLen, cfg.VocabSize), Advantage: float32(r.NormFloat64())}
		s.Mask = make([]float32, trainLen)
		s.OldLogp = make([]float32, trainLen)
		for t := range s.Mask {
			s.Mask[t] = 1
			s.OldLogp[t] = -12
		}
		seqs[i] = s
	}
	opt := torchbridge.LossOptions{ClipEps: 0.2, Scale: 1.0 / float64(trainBatch*trainLen), HeadChunk: headChunk}
	adam := torchbridge.AdamW{LR: 1e-5, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, MaxGradNorm: 1}
	res.Train = perSecond(trainBatch*trainLen, func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			_, err := p.Backward(ctx, seqs, opt)
			check(b, err)
			_, err = p.Step(ctx, adam)
			check(b, err)
		}
	})
	return res, benchErr
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
	row(fmt.Sprintf("prefill (1x%d)", prefillLen), ours.Prefill, r.Prefill)
	row("decode batch 1", ours.DecodeB1, r.DecodeB1)
	row("decode batch 64", ours.DecodeB64, r.DecodeB64)
	row(fmt.Sprintf("train step (%dx%d)", trainBatch, trainLen), ours.Train, r.Train)
	return ok
}
