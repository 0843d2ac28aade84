package torchbridge_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/recal-project/recal/internal/testing/ranktest"
	"github.com/recal-project/recal/torchbridge"
)

// zeroCases are the policies the ZeRO scenarios train: float32 (the
// moments sharded) and bfloat16 (the float32 master weights too).
var zeroCases = []string{"float32", "bfloat16"}

// zeroAdam clips (so the norm over every rank's whole gradient matters) and
// decays weights.
var zeroAdam = torchbridge.AdamW{LR: 3e-3, Beta1: 0.9, Beta2: 0.99, Eps: 1e-8, WeightDecay: 0.05, MaxGradNorm: 0.5}

// Optimizer-state sharding (ZeRO-1) over N ranks updates exactly what the
// unsharded N-rank job updates, bit for bit (also with the shard and the
// gradient buckets made ahead by ProcessGroup.PrepareUpdate), for world sizes that divide
// the parameters and ones that do not, on one thread and on two; its
// checkpoint, gathered whole, is the unsharded job's byte for byte, and a
// job resumed from it with another world size, sharded or not, continues
// bit for bit alike.
func TestZeROMatchesUnsharded(t *testing.T) {
	if os.Getenv(helperEnv) != "" {
		t.Skip("inside a helper rank")
	}
	for _, world := range []int{2, 3} {
		for _, threads := range []int{1, 2} {
			t.Run(fmt.Sprintf("world=%d/threads=%d", world, threads), func(t *testing.T) {
				dir := t.TempDir()
				run := func(scenario string, world int) {
					ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
					defer cancel()
					cmds, outs := launchAt(t, ctx, scenario, dir, world, ranktest.FreePort(t), "RECAL_DIST_THREADS="+strconv.Itoa(threads))
					for r, cmd := range cmds {
						if err := cmd.Wait(); err != nil {
							t.Fatalf("%s, rank %d of %d: %v\n%s", scenario, r, world, err, outs[r])
						}
					}
				}
				run("zero", world)
				for _, dt := range zeroCases {
					a, err := os.ReadFile(filepath.Join(dir, dt+"-plain.safetensors"))
					if err != nil {
						t.Fatal(err)
					}
					for _, job := range []string{"sharded", "prepared"} {
						b, err := os.ReadFile(filepath.Join(dir, dt+"-"+job+".safetensors"))
						if err != nil {
							t.Fatal(err)
						}
						if !bytes.Equal(a, b) {
							t.Errorf("%s: the %s job's optimizer checkpoint, gathered whole, differs from the unsharded job's", dt, job)
						}
					}
				}
				run("zero-resume", 5-world) // 2 → 3 ranks, 3 → 2
			})
		}
	}
}

// zeroPolicy is a policy of dtype with the weights every rank starts from.
// Its vocabulary of 4,096 makes the tied embedding 131,072 elements, so
// that each rank's shares, laid end to end, take the parameter
// all-gather's rounds (65,536 elements of them) more than one round, cut
// inside a share.
func zeroPolicy(t *testing.T, dtype string) *torchbridge.Policy {
	t.Helper()
	p, err := torchbridge.NewPolicy(tinyConfig(4096, true), torchbridge.Options{DType: dtype})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if err := p.InitRandom(21, 0.2); err != nil {
		t.Fatal(err)
	}
	return p
}

// zeroBatch is rank r's data of step s.
func zeroBatch(r, s int) []torchbridge.Sequence {
	rng := rand.New(rand.NewSource(int64(1000*s + r)))
	var seqs []torchbridge.Sequence
	for b := 0; b < 2; b++ {
		toks := randomSeq(rng, 7+3*b+r, 97)
		mask := make([]float32, len(toks))
		for i := 2; i < len(mask); i++ {
			mask[i] = 1
		}
		seqs = append(seqs, torchbridge.Sequence{Tokens: toks, Mask: mask, Advantage: float32(rng.NormFloat64())})
	}
	return seqs
}

// zeroStep runs one data-parallel step on p: backward of this rank's data
// (none for the last rank at step 1: a rank without rows), the gradient
// all-reduce, the optimizer step and, when sharded, the parameter
// all-gather. arm: the backward is armed to reduce buckets as they
// complete (ReduceInBackward, ZeRO-2).
func zeroStep(t *testing.T, ctx context.Context, g *torchbridge.ProcessGroup, p *torchbridge.Policy, sharded, arm bool, step int) {
	t.Helper()
	if step != 1 || g.Rank() != g.Size()-1 {
		if arm {
			if err := g.ReduceInBackward(ctx, p); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := p.Backward(ctx, zeroBatch(g.Rank(), step), torchbridge.LossOptions{ClipEps: 0.2, Scale: 0.05, HeadChunk: 5}); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.AllReduceGrads(ctx, p); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Step(ctx, zeroAdam); err != nil {
		t.Fatal(err)
	}
	if sharded {
		if err := g.GatherParams(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
}

// weights is every parameter's bytes in its own dtype.
func weights(t *testing.T, p *torchbridge.Policy) []byte {
	t.Helper()
	var out []byte
	for _, pr := range p.Params() {
		b := make([]byte, 4*pr.Numel())
		if err := p.GetParam(pr.Name, "F32", b); err != nil {
			t.Fatal(err)
		}
		out = append(out, b...)
	}
	return out
}

// helperZeRO trains an unsharded and a sharded copy of each case for three
// steps on this rank's data, checking after every step that they hold the
// same weights, then writes their optimizer checkpoints (rank 0) and the
// weights.
func helperZeRO(t *testing.T, ctx context.Context, g *torchbridge.ProcessGroup, dir string) {
	for _, dt := range zeroCases {
		plain, sharded, prepared := zeroPolicy(t, dt), zeroPolicy(t, dt), zeroPolicy(t, dt)
		if err := sharded.ShardOptimizer(g.Rank(), g.Size()); err != nil {
			t.Fatal(err)
		}
		// As trainer.Train: sharded, then the optimizer shard and the
		// gradient buckets made before the first backward.
		if err := prepared.ShardOptimizer(g.Rank(), g.Size()); err != nil {
			t.Fatal(err)
		}
		if err := g.PrepareUpdate(ctx, prepared); err != nil {
			t.Fatal(err)
		}
		// ZeRO-2: the gradient sums sharded too, with checkpointed layers
		// (the armed backward reduces buckets layer by layer) and without
		// (AllReduceGrads reduces them all).
		zero2 := map[bool]*torchbridge.Policy{}
		for _, ckpt := range []bool{true, false} {
			p := zeroPolicy(t, dt)
			if err := p.ShardOptimizer(g.Rank(), g.Size()); err != nil {
				t.Fatal(err)
			}
			if err := g.ShardGradients(ctx, p, true); err == nil || !strings.Contains(err.Error(), "buckets must be made first") {
				t.Fatalf("ShardGradients before PrepareUpdate: %v, want an error saying the buckets come first", err)
			}
			if err := g.PrepareUpdate(ctx, p); err != nil {
				t.Fatal(err)
			}
			if err := g.ReduceInBackward(ctx, p); err == nil || !strings.Contains(err.Error(), "not sharded") {
				t.Fatalf("ReduceInBackward without ShardGradients: %v, want an error", err)
			}
			if err := g.ShardGradients(ctx, p, true); err != nil {
				t.Fatal(err)
			}
			if err := p.SetCheckpointing(ckpt); err != nil {
				t.Fatal(err)
			}
			zero2[ckpt] = p
		}
		for step := 0; step < 3; step++ {
			zeroStep(t, ctx, g, plain, false, false, step)
			zeroStep(t, ctx, g, sharded, true, false, step)
			zeroStep(t, ctx, g, prepared, true, false, step)
			if !bytes.Equal(weights(t, plain), weights(t, sharded)) {
				t.Fatalf("%s, step %d, rank %d of %d: the sharded policy's weights differ from the unsharded one's", dt, step, g.Rank(), g.Size())
			}
			if !bytes.Equal(weights(t, plain), weights(t, prepared)) {
				t.Fatalf("%s, step %d, rank %d of %d: with its update prepared (PrepareUpdate), the sharded policy's weights differ from the unsharded one's", dt, step, g.Rank(), g.Size())
			}
			for ckpt, p := range zero2 {
				zeroStep(t, ctx, g, p, true, ckpt, step)
				if !bytes.Equal(weights(t, plain), weights(t, p)) {
					t.Fatalf("%s, step %d, rank %d of %d: with sharded gradients (checkpointed layers %v), the weights differ from the unsharded policy's", dt, step, g.Rank(), g.Size(), ckpt)
				}
			}
		}
		for _, p := range []*torchbridge.Policy{sharded, prepared} {
			if err := g.GatherState(ctx, p, 0); err != nil {
				t.Fatal(err)
			}
		}
		if g.Rank() == 0 {
			for name, p := range map[string]*torchbridge.Policy{"plain": plain, "sharded": sharded, "prepared": prepared} {
				if err := p.SaveOptimizer(filepath.Join(dir, dt+"-"+name+".safetensors")); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(filepath.Join(dir, dt+"-weights"), weights(t, plain), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range []*torchbridge.Policy{sharded, prepared} {
			if err := g.DropGatheredState(ctx, p); err != nil {
				t.Fatal(err)
			}
		}
		if err := g.Barrier(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// helperZeROResume continues from helperZeRO's checkpoint with this
// group's world size: a sharded and an unsharded copy, two more steps.
func helperZeROResume(t *testing.T, ctx context.Context, g *torchbridge.ProcessGroup, dir string) {
	for _, dt := range zeroCases {
		w, err := os.ReadFile(filepath.Join(dir, dt+"-weights"))
		if err != nil {
			t.Fatal(err)
		}
		load := func(shard bool) *torchbridge.Policy {
			p := zeroPolicy(t, dt)
			off := 0
			for _, pr := range p.Params() {
				n := 4 * int(pr.Numel())
				if err := p.SetParam(pr.Name, "F32", w[off:off+n]); err != nil {
					t.Fatal(err)
				}
				off += n
			}
			if shard {
				if err := p.ShardOptimizer(g.Rank(), g.Size()); err != nil {
					t.Fatal(err)
				}
			}
			if err := p.LoadOptimizer(filepath.Join(dir, dt+"-sharded.safetensors")); err != nil {
				t.Fatal(err)
			}
			return p
		}
		plain, sharded := load(false), load(true)
		for step := 3; step < 5; step++ {
			zeroStep(t, ctx, g, plain, false, false, step)
			zeroStep(t, ctx, g, sharded, true, false, step)
			if !bytes.Equal(weights(t, plain), weights(t, sharded)) {
				t.Fatalf("%s, resumed step %d, rank %d of %d: the sharded policy's weights differ from the unsharded one's", dt, step, g.Rank(), g.Size())
			}
		}
	}
}
