package torchbridge_test

import (
	"context"
	"fmt"
	"math/rand"
	"testing"

	"github.com/recal-project/recal/torchbridge"
)

// BenchmarkExtend times one decode call of the offline default's tiny
// shape (hidden 128, 2 layers, 4,022-token vocabulary) as rollouts and
// evaluation make them: rows × new tokens per row over a context of ctx
// tokens, with log-probs (training rollouts: the row-invariant kernels on
// a float32 CPU policy) and without (evaluation, serving).
func BenchmarkExtend(b *testing.B) {
	ctx := context.Background()
	cfg := tinyConfig(4022, true)
	cfg.HiddenSize, cfg.IntermediateSize, cfg.NumAttentionHeads, cfg.NumKeyValueHeads = 128, 384, 4, 2
	p, err := torchbridge.NewPolicy(cfg, torchbridge.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	if err := p.InitRandom(3, 0.2); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct{ rows, width, ctx int }{{32, 1, 200}, {3, 1, 200}, {1, 1, 200}, {8, 40, 0}, {128, 1, 200}} {
		for _, logp := range []bool{true, false} {
			b.Run(fmt.Sprintf("rows=%d/width=%d/ctx=%d/logp=%v", c.rows, c.width, c.ctx, logp), func(b *testing.B) {
				cache, err := p.NewCache(c.rows, c.ctx+c.width+1)
				if err != nil {
					b.Fatal(err)
				}
				defer cache.Close()
				r := rand.New(rand.NewSource(1))
				rows := make([]int, c.rows)
				prompt := make([][]int32, c.rows)
				step := make([][]int32, c.rows)
				for i := range rows {
					rows[i] = i
					prompt[i] = randomSeq(r, max(c.ctx, 1), 4022)
					step[i] = randomSeq(r, c.width, 4022)
				}
				fill := func() {
					if err := cache.Reset(ctx); err != nil {
						b.Fatal(err)
					}
					if c.ctx > 0 {
						if _, err := cache.Extend(ctx, torchbridge.Step{Rows: rows, Tokens: prompt, Seed: 1}); err != nil {
							b.Fatal(err)
						}
					}
				}
				fill()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					fill()
					b.StartTimer()
					if _, err := cache.Extend(ctx, torchbridge.Step{Rows: rows, Tokens: step, Sampling: torchbridge.Sampling{Temperature: 1}, Seed: 2, WantLogp: logp}); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
