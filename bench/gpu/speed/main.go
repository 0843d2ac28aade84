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
	"math/rand"
	"os"
	"strings"
	"time"

	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/torchbridge"
)

const (
	prefillLen   = 256
	decodePrompt = 32
	decodeSteps  = 64
	trainBatch   = 8
	trainLen     = 256
)

// shapes: the presets, and Qwen2.5-0.5B's body (the vocabulary is -vocab).
var shapes = map[string]hfmodel.Config{
	"tiny":  hfmodel.Presets["tiny"],
	"small": hfmodel.Presets["small"],
	"0.5b":  {HiddenSize: 896, IntermediateSize: 4864, NumHiddenLayers: 24, NumAttentionHeads: 14, NumKeyValueHeads: 2},
}

type result struct {
	Device    string  `json:"device"`
	DType     string  `json:"dtype"`
	Model     string  `json:"model"`
	Params    int64   `json:"params"`
	Prefill   float64 `json:"prefill_tok_s"`
	DecodeB1  float64 `json:"decode_b1_tok_s"`
	DecodeB64 float64 `json:"decode_b64_tok_s"`
	Train     float64 `json:"train_tok_s"`
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

func tokens(r *rand.Rand, n int, vocab int64) []int32 {
	s := make([]int32, n)
	for i := range s {
		s[i] = int32(r.Int63n(vocab))
	}
	return s
}

// rate runs fn once to warm up, then until minTime has passed (at least
// twice), and returns tokens per second.
func rate(tokensPerOp int, minTime time.Duration, fn func() error) (float64, error) {
	if err := fn(); err != nil {
		return 0, err
	}
	start, n := time.Now(), 0
	for n < 2 || time.Since(start) < minTime {
		if err := fn(); err != nil {
			return 0, err
		}
		n++
	}
	return float64(tokensPerOp*n) / time.Since(start).Seconds(), nil
}

func measure(model, device, dtype string, vocab int64, minTime time.Duration) (result, error) {
	ctx := context.Background()
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
	p, err := torchbridge.NewPolicy(cfg, torchbridge.Options{Device: device, DType: dtype})
	if err != nil {
		return result{}, err
	}
	defer p.Close()
	if err := p.InitRandom(1, 0.02); err != nil {
		return result{}, err
	}
	res := result{Device: device, DType: dtype, Model: model, Params: p.NumParams()}
	r := rand.New(rand.NewSource(1))

	cache, err := p.NewCache(1, prefillLen+1)
	if err != nil {
		return result{}, err
	}
	prompt := tokens(r, prefillLen, vocab)
	res.Prefill, err = rate(prefillLen, minTime, func() error {
		if err := cache.Reset(ctx); err != nil {
			return err
		}
		_, err := cache.Extend(ctx, torchbridge.Step{Rows: []int{0}, Tokens: [][]int32{prompt}})
		return err
	})
	cache.Close()
	if err != nil {
		return result{}, err
	}

	// Decode: a prefill of decodePrompt tokens per row, then decodeSteps
	// greedy steps feeding back the chosen token (the prefill is timed too,
	// and small beside the steps).
	decode := func(batch int) (float64, error) {
		c, err := p.NewCache(batch, decodePrompt+decodeSteps+1)
		if err != nil {
			return 0, err
		}
		defer c.Close()
		rows := make([]int, batch)
		prompts := make([][]int32, batch)
		for i := range rows {
			rows[i] = i
			prompts[i] = tokens(r, decodePrompt, vocab)
		}
		return rate(batch*decodeSteps, minTime, func() error {
			if err := c.Reset(ctx); err != nil {
				return err
			}
			out, err := c.Extend(ctx, torchbridge.Step{Rows: rows, Tokens: prompts})
			if err != nil {
				return err
			}
			for s := 0; s < decodeSteps; s++ {
				feed := make([][]int32, batch)
				for j := range feed {
					feed[j] = []int32{out.Next[j]}
				}
				if out, err = c.Extend(ctx, torchbridge.Step{Rows: rows, Tokens: feed}); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if res.DecodeB1, err = decode(1); err != nil {
		return result{}, err
	}
	if res.DecodeB64, err = decode(64); err != nil {
		return result{}, err
	}

	seqs := make([]torchbridge.Sequence, trainBatch)
	for i := range seqs {
		s := torchbridge.Sequence{Tokens: tokens(r, trainLen, vocab), Advantage: float32(r.NormFloat64())}
		s.Mask = make([]float32, trainLen)
		s.OldLogp = make([]float32, trainLen)
		for t := range s.Mask {
			s.Mask[t] = 1
			s.OldLogp[t] = -8
		}
		seqs[i] = s
	}
	opt := torchbridge.LossOptions{ClipEps: 0.2, Scale: 1.0 / float64(trainBatch*trainLen)}
	adam := torchbridge.AdamW{LR: 1e-5, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, MaxGradNorm: 1}
	res.Train, err = rate(trainBatch*trainLen, minTime, func() error {
		if _, err := p.Backward(ctx, seqs, opt); err != nil {
			return err
		}
		_, err := p.Step(ctx, adam)
		return err
	})
	return res, err
}
