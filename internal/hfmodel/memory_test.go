package hfmodel

import (
	"strings"
	"testing"
)

func qwen3B(t *testing.T) *Config {
	t.Helper()
	c, err := Preset("qwen2.5-3b", 151936)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The Qwen2.5-3B shape: 3,085,938,688 parameters, 2,774,773,760 without
// the (tied) embedding, as the model card says.
func TestNumParamsQwen3B(t *testing.T) {
	c := qwen3B(t)
	if n := c.NumParams(); n != 3085938688 || n-151936*2048 != 2774773760 {
		t.Fatalf("%d parameters (%d without the embedding), want 3085938688 (2774773760)", n, n-151936*2048)
	}
}

// Every term of the plan of the paper's setting on 4 GPUs, checked by hand
// from the shapes: bfloat16, KL reference, ZeRO-1 over 4 ranks,
// checkpointing, micro-batches of 4 sequences of 2,048 tokens (4 of them
// per step), head chunks of 1,024 tokens, 64 rollout rows of 2,048
// positions after 512-token prompts.
func TestPlanMemoryQwen3BByHand(t *testing.T) {
	c := qwen3B(t)
	const (
		P     = 3085938688
		share = 771484672 // ⌈P/4⌉
		gib   = 1 << 30
	)
	o := MemoryOptions{DType: "bfloat16", CUDA: true, Train: true, KLReference: true, World: 4, ShardOptimizer: true,
		Checkpointing: true, MicroSeqs: 4, SeqLen: 2048, MicroBatches: 4, HeadChunk: 1024,
		RolloutRows: 64, PromptLen: 512, Capacity: 2048, Runtime: gib}
	p := c.PlanMemory(o)
	persist := map[string]int64{
		"runtime":                gib,
		"weights":                P * 2,
		"KL reference":           P * 2,
		"AdamW moments":          share * 8,
		"float32 master weights": share * 4,
		"gradient buckets":       P * 4,
	}
	want := map[string]map[string]int64{
		"rollout": {
			// 36 layers × K and V × 64 rows × 2 heads × 2,048 positions × 128 × 2 bytes
			"KV cache": 36 * 2 * 64 * 2 * 2112 * 128 * 2, // 2,048 positions, a scratch column, rounded up to 64 (on a GPU)
			// per prompt token (4·2048 + 2·2048 + 2·256 + 2·11008) float32s, 3 float32
			// vocabularies per row, a prompt's scores in float32 and bfloat16
			"decode workspace": 64*512*(4*2048+2*2048+2*256+2*11008)*4 + 64*151936*4*3 + 64*16*512*512*6,
		},
		"head": {
			// 36 layer outputs + embedding, final norm ×2, scored states, of 8,192 tokens × 2,048 × 2 bytes,
			// plus one layer: (6·2048 + 4·2048 + 4·256 + 4·11008) × 8,192 × 2 bytes + 4 × 16 × 2048² float32
			"activations": (36+4)*8192*2048*2 + (8192*(6*2048+4*2048+4*256+4*11008)*2 + 4*16*2048*2048*4),
			// one layer's activations (2 GiB) over the logits chunk (2 × 1,024 × 151,936 float32s, 1.16 GiB)
			"backward workspace": 8192*(6*2048+4*2048+4*256+4*11008)*2 + 4*16*2048*2048*4,
			"head gradients":     151936*2048*4 + 8192*2048*2,
		},
		"end": {
			"backward's gradients":   P * 2, // bfloat16, before they join the sums
			"head weight's gradient": 151936 * 2048 * 4,
			// the embedding's bfloat16 gradient as its backward makes it, before .grad takes a copy
			"embedding gradient's copy": 151936 * 2048 * 2,
		},
		"step": {
			"gradient sums": 0,
			// the largest of the moments one after the other: a round of the
			// all-gather (each of the 4 ranks sends 25 MiB of bfloat16
			// parameters, 13,107,200 elements, of its range: the send buffer,
			// every rank's piece and c10d's flat copy of them, 236 MB), over
			// the optimizer's float32 temporaries (three StepSlices, 50 MB)
			"parameter all-gather": 9 * (25 << 20 / 2) * 2,
		},
	}
	for _, ph := range []MemoryPhase{p.Rollout, p.Head, p.BackwardEnd, p.Step} {
		name := ph.Name
		switch {
		case ph.Name == "update" && ph.Part("activations") > 0:
			name = "head"
		case ph.Name == "update":
			name = "end"
		}
		w := want[name]
		if w == nil {
			t.Fatalf("unexpected phase %q", ph.Name)
		}
		var total int64
		for name, b := range persist {
			if got := ph.Part(name); got != b {
				t.Errorf("%s: %s = %d bytes, want %d", ph.Name, name, got, b)
			}
			total += b
		}
		for name, b := range w {
			if got := ph.Part(name); got != b {
				t.Errorf("%s: %s = %d bytes, want %d", ph.Name, name, got, b)
			}
			total += b
		}
		if ph.Peak() != total {
			t.Errorf("%s: peak %d, want the sum of its terms %d (a term the test does not know: %s)", ph.Name, ph.Peak(), total, ph)
		}
	}
	if p.Update.Peak() != max(p.Head.Peak(), p.BackwardEnd.Peak()) {
		t.Errorf("update %d, want the larger of the head's %d and the backward's end's %d", p.Update.Peak(), p.Head.Peak(), p.BackwardEnd.Peak())
	}
}

// Settings a user can get wrong give a sensible plan: no negative or
// zero-sized term where there is work, sharding that does nothing with one
// rank, a chunk no larger than the micro-batch.
func TestPlanMemoryHostileSettings(t *testing.T) {
	c := qwen3B(t)
	base := MemoryOptions{DType: "float32", Train: true, World: 1, MicroSeqs: 2, SeqLen: 100, MicroBatches: 1,
		HeadChunk: 256, RolloutRows: 8, PromptLen: 50, Capacity: 100}
	const P, VH = 3085938688, 151936 * 2048
	for _, tc := range []struct {
		name  string
		edit  func(*MemoryOptions)
		check func(t *testing.T, p MemoryPlan)
	}{
		{"chunk 0 is the bridge's 256", func(o *MemoryOptions) { o.MicroSeqs = 1; o.SeqLen = 300; o.HeadChunk = 0 }, func(t *testing.T, p MemoryPlan) {
			if got := p.Head.Part("logits chunk"); got != 2*256*151936*4 {
				t.Errorf("logits chunk %d, want 256 tokens' (the bridge's default)", got)
			}
		}},
		{"chunk larger than the micro-batch is one chunk", func(o *MemoryOptions) { o.HeadChunk = 1 << 20 }, func(t *testing.T, p MemoryPlan) {
			if got := p.Head.Part("logits chunk"); got != 2*200*151936*4 {
				t.Errorf("logits chunk %d, want the micro-batch's 200 tokens'", got)
			}
		}},
		{"sharding with one rank shards nothing", func(o *MemoryOptions) { o.ShardOptimizer = true }, func(t *testing.T, p MemoryPlan) {
			if got := p.Update.Part("AdamW moments"); got != P*8 {
				t.Errorf("moments %d, want all of them (%d) on the only rank", got, int64(P*8))
			}
			if p.Update.Part("gradient buckets") != 0 {
				t.Error("one rank has no all-reduce buckets")
			}
		}},
		{"a world that does not divide the parameters rounds the share up", func(o *MemoryOptions) { o.World = 3; o.ShardOptimizer = true }, func(t *testing.T, p MemoryPlan) {
			share := int64((P + 2) / 3)
			if share*3 == P {
				t.Fatal("the test wants a world that does not divide P")
			}
			if got := p.Update.Part("AdamW moments"); got != share*8 {
				t.Errorf("moments %d, want ⌈P/3⌉·8 = %d", got, share*8)
			}
		}},
		{"world 0 is one process", func(o *MemoryOptions) { o.World = 0 }, func(t *testing.T, p MemoryPlan) {
			if p.Step.Part("gradient sums") != P*4 || p.Update.Part("gradient buckets") != 0 {
				t.Errorf("world 0: %s; want one process's gradient sums", p.Update)
			}
		}},
		{"negative sizes count as none", func(o *MemoryOptions) { o.MicroSeqs = -3; o.RolloutRows = -1; o.PromptLen = -5 }, func(t *testing.T, p MemoryPlan) {
			for _, ph := range p.Phases() {
				for _, x := range ph.Parts {
					if x.Bytes < 0 {
						t.Errorf("%s: %s = %d < 0", ph.Name, x.Name, x.Bytes)
					}
				}
			}
		}},
		{"a reloaded reference is in its phase only", func(o *MemoryOptions) { o.KLReference = true; o.ReloadReference = true }, func(t *testing.T, p MemoryPlan) {
			for _, ph := range []MemoryPhase{p.Rollout, p.Update, p.Step} {
				if ph.Part("KL reference") != 0 {
					t.Errorf("%s holds the reloaded reference: %s", ph.Name, ph)
				}
			}
			if got := p.Reference.Part("KL reference"); got != P*4 || len(p.Phases()) != 4 || p.Phases()[1].Name != "ref" {
				t.Errorf("ref phase %s in %d phases, want the reference (%d) in the second of four", p.Reference, len(p.Phases()), int64(P*4))
			}
			if p.Reference.Part("scoring workspace") < ReadChunk {
				t.Errorf("scoring workspace %d below the load's read buffer", p.Reference.Part("scoring workspace"))
			}
		}},
		{"a resident reference is in every phase, and there is no ref phase", func(o *MemoryOptions) { o.KLReference = true }, func(t *testing.T, p MemoryPlan) {
			if len(p.Reference.Parts) != 0 || len(p.Phases()) != 3 || p.Rollout.Part("KL reference") != P*4 || p.Update.Part("KL reference") != P*4 {
				t.Errorf("resident reference: phases %v", p.Phases())
			}
		}},
		{"reloading without a reference changes nothing", func(o *MemoryOptions) { o.ReloadReference = true }, func(t *testing.T, p MemoryPlan) {
			if len(p.Reference.Parts) != 0 || p.Peak() != c.PlanMemory(base).Peak() {
				t.Errorf("no KL reference, reload on: %v", p.Phases())
			}
		}},
		{"CPU buckets give their pages back between steps", func(o *MemoryOptions) { o.World = 2 }, func(t *testing.T, p MemoryPlan) {
			if p.Rollout.Part("gradient buckets") != 0 || p.Update.Part("gradient buckets") != P*4 || p.Step.Part("gradient buckets") != P*4 {
				t.Errorf("CPU, 2 ranks: buckets in rollout %d, update %d, step %d; want 0, P·4, P·4", p.Rollout.Part("gradient buckets"),
					p.Update.Part("gradient buckets"), p.Step.Part("gradient buckets"))
			}
		}},
		// ZeRO-2: 3B's buckets of 25 MiB hold whole parameters, so a bucket
		// of layer 0 and the tied embedding's are whole at the backward's
		// end; every other bucket, and all of them in the step, hold the
		// rank's shares: about half of each parameter, at most 64 elements
		// more (the cut's alignment).
		{"sharded gradients keep the shares", func(o *MemoryOptions) {
			o.World = 2
			o.ShardOptimizer, o.ShardGradients, o.Checkpointing = true, true, true
		}, func(t *testing.T, p MemoryPlan) {
			bs := c.gradBuckets(25<<20, 2)
			if bs[0].ready != -1 || bs[len(bs)-1].ready != -1 || bs[1].ready != 0 || bs[len(bs)-2].ready != 35 {
				t.Errorf("ready layers: first %d, second %d, next to last %d, last %d; want the embedding's and the final norm's at the end (-1), then layers 0 and 35",
					bs[0].ready, bs[1].ready, bs[len(bs)-2].ready, bs[len(bs)-1].ready)
			}
			n := int64(len(c.Params()))
			layer := int64((P - VH - 2048) / 36) // one decoder layer's parameters
			step, end := p.Step.Part("gradient buckets")/4, p.BackwardEnd.Part("gradient buckets")/4
			if step < P/2 || step > P/2+64*n {
				t.Errorf("step: buckets of %d elements, want the shares, P/2 = %d to P/2 + 64 per parameter", step, int64(P/2))
			}
			// At the end: the shares, plus the other half of the embedding
			// and of the buckets holding layer 0 (at most two layers' worth)
			// and the final norm (with at most one layer's tail).
			if extra := end - step; extra < VH/2 || extra > VH/2+3*layer/2 {
				t.Errorf("backward's end: %d elements beyond the shares, want V·H/2 = %d to V·H/2 + 1.5 layers = %d", extra, int64(VH/2), int64(VH/2+3*layer/2))
			}
			if got := p.Head.Part("gradient buckets"); got != VH*4 {
				t.Errorf("at the head: buckets %d, want the head weight's gradient, V·H·4 = %d", got, int64(VH*4))
			}
			cuda := base
			cuda.World, cuda.ShardOptimizer, cuda.ShardGradients, cuda.Checkpointing, cuda.CUDA = 2, true, true, true, true
			if got := c.PlanMemory(cuda).Step.Part("gradient buckets"); got != P*4 {
				t.Errorf("on a GPU the buckets stay whole (ZeRO-2 is CPU only): %d, want %d", got, int64(P*4))
			}
			one := base
			one.ShardGradients = true
			if c.PlanMemory(one).Peak() != c.PlanMemory(base).Peak() {
				t.Error("sharded gradients without a sharded optimizer or with one rank changed the plan")
			}
		}},
		{"GPU buckets stay", func(o *MemoryOptions) { o.World = 2; o.CUDA = true }, func(t *testing.T, p MemoryPlan) {
			for _, ph := range p.Phases() {
				if ph.Part("gradient buckets") != P*4 {
					t.Errorf("GPU, 2 ranks: %s without the buckets", ph)
				}
			}
		}},
		{"inference has only the rollout", func(o *MemoryOptions) { o.Train = false; o.KLReference = true }, func(t *testing.T, p MemoryPlan) {
			if len(p.Phases()) != 1 || p.Rollout.Part("KL reference") != 0 || p.Rollout.Part("AdamW moments") != 0 {
				t.Errorf("inference plan %v; want the rollout alone, without training state", p.Phases())
			}
		}},
		{"checkpointing keeps less", func(o *MemoryOptions) { o.Checkpointing = true }, func(t *testing.T, p MemoryPlan) {
			plain := c.PlanMemory(base)
			if p.Head.Part("activations") >= plain.Head.Part("activations") {
				t.Errorf("activations with checkpointing %d ≥ without %d", p.Head.Part("activations"), plain.Head.Part("activations"))
			}
		}},
		// On the CPU the tied embedding's rows go into the head weight's
		// gradient: the backward's gradients are the rest, P − V·H.
		{"more micro-batches keep a backward's gradients beside the sums", func(o *MemoryOptions) { o.MicroBatches = 3 }, func(t *testing.T, p MemoryPlan) {
			got, head, sums := p.BackwardEnd.Part("backward's gradients"), p.BackwardEnd.Part("head weight's gradient"), p.BackwardEnd.Part("gradient sums")
			if got != (P-VH)*4 || head != VH*4 || sums != P*4 {
				t.Errorf("backward's gradients %d and the head weight's %d beside sums %d, want (P − V·H)·4 = %d, V·H·4 = %d and P·4 = %d",
					got, head, sums, int64((P-VH)*4), int64(VH*4), int64(P*4))
			}
		}},
		{"one micro-batch's gradients become the sums", func(o *MemoryOptions) {}, func(t *testing.T, p MemoryPlan) {
			got, head, sums := p.BackwardEnd.Part("backward's gradients"), p.BackwardEnd.Part("head weight's gradient"), p.BackwardEnd.Part("gradient sums")
			if got+head != P*4 || sums != 0 || p.BackwardEnd.Part("embedding gradient's copy") != 0 {
				t.Errorf("backward's gradients %d and the head weight's %d beside sums %d (%s), want P·4 = %d in all and no sums or dense embedding gradient",
					got, head, sums, p.BackwardEnd, int64(P*4))
			}
		}},
		{"a GPU's embedding backward makes a dense gradient", func(o *MemoryOptions) { o.CUDA = true }, func(t *testing.T, p MemoryPlan) {
			if got := p.BackwardEnd.Part("embedding gradient's copy"); got != VH*4 {
				t.Errorf("embedding gradient's copy %d, want V·H·4 = %d", got, int64(VH*4))
			}
			if got := p.BackwardEnd.Part("backward's gradients"); got != P*4 {
				t.Errorf("backward's gradients %d, want P·4 = %d (the dense embedding gradient among them)", got, int64(P*4))
			}
		}},
		{"several ranks, one micro-batch: the head weight's gradient goes into the buckets", func(o *MemoryOptions) { o.World = 2 }, func(t *testing.T, p MemoryPlan) {
			if got := p.BackwardEnd.Part("head weight's gradient") + p.BackwardEnd.Part("backward's gradients"); got != 0 {
				t.Errorf("%d bytes of gradients beside the buckets at the backward's end, want none", got)
			}
			if got := p.Head.Part("head gradients"); got != 200*2048*4 {
				t.Errorf("head gradients %d, want dL/dh alone, %d", got, 200*2048*4)
			}
		}},
		{"several ranks on the CPU: the all-reduce's scratch, when larger than the optimizer's", func(o *MemoryOptions) { o.World = 2 }, func(t *testing.T, p MemoryPlan) {
			small, err := Preset("tiny", 512)
			if err != nil {
				t.Fatal(err)
			}
			o := base
			o.World = 2
			ps := small.PlanMemory(o)
			// tiny with 512 ids: one bucket of all its gradients, and two
			// pipeline steps of a quarter of it
			want := 2 * ((small.NumParams()*4 + 3) / 4)
			if got := ps.Step.Part("all-reduce scratch"); got != want {
				t.Errorf("tiny: all-reduce scratch %d, want %d (%s)", got, want, ps.Step)
			}
			// Qwen2.5-3B: 4 MiB steps, below the optimizer's sliced temporaries
			if got, opt := p.Step.Part("all-reduce scratch"), p.Step.Part("optimizer temporaries"); got != 0 || opt != 3*StepSlice*4 {
				t.Errorf("3B: all-reduce scratch %d and optimizer temporaries %d, want 0 and %d (%s)", got, opt, 3*StepSlice*4, p.Step)
			}
			o.CUDA = true
			if got := small.PlanMemory(o).Step.Part("all-reduce scratch"); got != 0 {
				t.Errorf("tiny on a GPU: all-reduce scratch %d, want none (NCCL)", got)
			}
		}},
		{"several ranks, two micro-batches: the second has a head weight's gradient of its own", func(o *MemoryOptions) { o.World = 2; o.MicroBatches = 2 }, func(t *testing.T, p MemoryPlan) {
			if got := p.BackwardEnd.Part("head weight's gradient"); got != VH*4 {
				t.Errorf("head weight's gradient %d, want V·H·4 = %d", got, int64(VH*4))
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			tc.edit(&o)
			p := c.PlanMemory(o)
			tc.check(t, p)
			for _, ph := range p.Phases() {
				if s := ph.String(); !strings.HasPrefix(s, ph.Name) || strings.Contains(s, "NaN") || strings.Contains(s, " -") {
					t.Errorf("phase prints as %q", s)
				}
			}
		})
	}
}
