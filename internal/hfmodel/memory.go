package hfmodel

import (
	"fmt"
	"math"
	"strings"
)

// ParamShape is one parameter of a Qwen2 policy: its Hugging Face name and
// shape.
type ParamShape struct {
	Name  string
	Shape []int64
}

// Numel is the tensor's element count.
func (t ParamShape) Numel() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Params lists the parameters a policy of c holds, with their Hugging Face
// names and shapes (Qwen2ForCausalLM: biases on the q, k and v projections
// only; no lm_head when the embedding is tied). It is the one list of the
// model's shapes on the Go side: the dry run checks checkpoints against it
// and the memory plan counts it.
func (c *Config) Params() []ParamShape {
	h, hd := c.HiddenSize, c.HeadDimension()
	q, kv := c.NumAttentionHeads*hd, c.NumKeyValueHeads*hd
	out := []ParamShape{{"model.embed_tokens.weight", []int64{c.VocabSize, h}}}
	for i := range c.NumHiddenLayers {
		l := fmt.Sprintf("model.layers.%d.", i)
		out = append(out,
			ParamShape{l + "input_layernorm.weight", []int64{h}},
			ParamShape{l + "self_attn.q_proj.weight", []int64{q, h}},
			ParamShape{l + "self_attn.q_proj.bias", []int64{q}},
			ParamShape{l + "self_attn.k_proj.weight", []int64{kv, h}},
			ParamShape{l + "self_attn.k_proj.bias", []int64{kv}},
			ParamShape{l + "self_attn.v_proj.weight", []int64{kv, h}},
			ParamShape{l + "self_attn.v_proj.bias", []int64{kv}},
			ParamShape{l + "self_attn.o_proj.weight", []int64{h, q}},
			ParamShape{l + "post_attention_layernorm.weight", []int64{h}},
			ParamShape{l + "mlp.gate_proj.weight", []int64{c.IntermediateSize, h}},
			ParamShape{l + "mlp.up_proj.weight", []int64{c.IntermediateSize, h}},
			ParamShape{l + "mlp.down_proj.weight", []int64{h, c.IntermediateSize}},
		)
	}
	out = append(out, ParamShape{"model.norm.weight", []int64{h}})
	if !c.TieWordEmbeddings {
		out = append(out, ParamShape{"lm_head.weight", []int64{c.VocabSize, h}})
	}
	return out
}

// NumParams is the parameter count of a policy of c.
func (c *Config) NumParams() int64 {
	var n int64
	for _, t := range c.Params() {
		n += t.Numel()
	}
	return n
}

// MemoryOptions describe the work whose memory PlanMemory plans, per rank.
type MemoryOptions struct {
	// DType is the policy's dtype: "float32" (or "") or "bfloat16".
	DType string
	// CUDA: the policy is on a GPU (libtorch's kernels decode; otherwise a
	// float32 policy decodes by the row kernels of cgo/recal_rows.cc).
	CUDA bool
	// Train plans training (the optimizer, gradients and the update);
	// otherwise only inference (evaluation, serving).
	Train bool
	// KLReference: a frozen copy of the policy for the KL term
	// (config.Config.KLCoef > 0).
	KLReference bool
	// ReloadReference: the KL reference is loaded from its checkpoint for
	// each step's scoring and freed after (policy.reload_reference), so it
	// exists only in the reference phase.
	ReloadReference bool
	// World is the number of data-parallel ranks (1: one process).
	World int
	// ShardOptimizer: the AdamW moments and master weights are sharded over
	// the ranks (ZeRO-1; ignored with one rank).
	ShardOptimizer bool
	// ShardGradients: the float32 gradient sums are sharded too (ZeRO-2,
	// on the CPU; ignored unless the optimizer is sharded): each bucket
	// keeps only the rank's shares once reduced, during the backward with
	// Checkpointing (gradBuckets), after it otherwise.
	ShardGradients bool
	// Checkpointing: activation checkpointing per decoder layer.
	Checkpointing bool
	// MicroSeqs and SeqLen are a micro-batch's sequences and their padded
	// length in tokens (the update's forward and backward).
	MicroSeqs, SeqLen int
	// MicroBatches is the backward calls a rank makes before the gradients
	// are reduced and the optimizer steps (one micro-batch: the first
	// backward's gradients become the sums; more: each later backward's
	// gradients exist beside the sums until they are added in).
	MicroBatches int
	// HeadChunk is the tokens per output-head chunk in the loss (≤ 0: the
	// bridge's default, 256).
	HeadChunk int
	// RolloutRows is the responses decoded at once (one KV cache row
	// each), PromptLen a prompt's tokens and Capacity a row's positions
	// (prompt and response).
	RolloutRows, PromptLen, Capacity int
	// BucketBytes is the size of the gradient all-reduce's buckets
	// (dist.bucket_bytes; ≤ 0: 25 MiB).
	BucketBytes int64
	// Runtime is the memory of the process besides tensors (the libtorch
	// and Go runtimes, code, allocator pools; on a GPU the CUDA context),
	// counted in every phase.
	Runtime int64
}

// StepSlice is the most elements of a parameter the optimizer step updates
// at once (kStepSlice in cgo/recal_train.cc's rc_policy_step): a larger one
// is updated slice by slice, so the step's temporaries stay small.
const StepSlice = 1 << 22

// GatherRound is the elements of its range each rank sends in one round of
// the sharded parameters' all-gather (cap in cgo/recal_dist.cc's
// rc_dist_gather_params): bucketBytes of the policy's dtype (es bytes an
// element), at least 65,536.
func GatherRound(bucketBytes, es int64) int64 { return max(1<<16, bucketBytes/es) }

// ReadChunk is the most bytes of a tensor a checkpoint's load reads into
// memory at once before they are copied into the tensor
// (torchbridge.LoadPolicy).
const ReadChunk = 16 << 20

// AllreduceSegment is the most bytes of a bucket Gloo's ring moves per step
// of its pipeline in the CPU gradient all-reduce (kSegmentBytes in
// cgo/recal_dist.cc); Gloo keeps two steps' worth of scratch per bucket.
const AllreduceSegment = 4 << 20

// CPURuntime is MemoryOptions.Runtime for recal on the CPU: the resident
// memory of a process that has started libtorch (Debian's 1.13) and the Go
// runtime, before any policy. bench/memory measures it ("runtime" in its
// output: 0.15 GiB, 157.6 MiB, on the 2-core VM); this is that, rounded up.
const CPURuntime = 160 << 20

// CUDARuntime is MemoryOptions.Runtime on a GPU: the CUDA context and
// libtorch's kernels loaded on the device, which take 0.5 to 1 GiB
// depending on the card and the CUDA version (not measured here; no GPU).
const CUDARuntime = 1 << 30

// MemoryPart is one term of a phase's peak.
type MemoryPart struct {
	Name  string
	Bytes int64
}

// MemoryPhase is the peak of one phase of the work, as the sum of its
// terms.
type MemoryPhase struct {
	Name  string
	Parts []MemoryPart
}

// Peak is the phase's peak in bytes.
func (p MemoryPhase) Peak() int64 {
	var t int64
	for _, x := range p.Parts {
		t += x.Bytes
	}
	return t
}

// Part is the bytes of the term named name (0 when the phase has none).
func (p MemoryPhase) Part(name string) int64 {
	for _, x := range p.Parts {
		if x.Name == name {
			return x.Bytes
		}
	}
	return 0
}

// String is the peak with its terms, in GiB.
func (p MemoryPhase) String() string {
	var parts []string
	for _, x := range p.Parts {
		if x.Bytes > 0 {
			parts = append(parts, fmt.Sprintf("%s %.2f", x.Name, GiB(x.Bytes)))
		}
	}
	return fmt.Sprintf("%-7s %6.2f GiB = %s", p.Name, GiB(p.Peak()), strings.Join(parts, " + "))
}

// GiB converts bytes to GiB.
func GiB(b int64) float64 { return float64(b) / (1 << 30) }

// MemoryPlan is the peak memory per rank of each phase of a job.
type MemoryPlan struct {
	// Rollout: decoding (training rollouts, evaluation, serving).
	Rollout MemoryPhase
	// Update: the loss's forward and backward over one micro-batch
	// (training only): the larger of its two moments, Head and
	// BackwardEnd.
	Update MemoryPhase
	// Head is the update at the output head: every activation, the logits
	// chunk or the backward's workspace, the head gradients. BackwardEnd is
	// the update at the backward's end: its gradients and the head
	// weight's.
	Head, BackwardEnd MemoryPhase
	// Step: the gradient all-reduce, the optimizer step and, sharded, the
	// all-gather of the parameters (training only).
	Step MemoryPhase
	// Reference: the KL reference loaded and scoring the rank's rollouts
	// (training with MemoryOptions.ReloadReference only; empty otherwise).
	Reference MemoryPhase
}

// Phases are the plan's phases in the order a step runs them (the
// rollout's alone for inference).
func (m MemoryPlan) Phases() []MemoryPhase {
	if len(m.Update.Parts) == 0 {
		return []MemoryPhase{m.Rollout}
	}
	if len(m.Reference.Parts) > 0 {
		return []MemoryPhase{m.Rollout, m.Reference, m.Update, m.Step}
	}
	return []MemoryPhase{m.Rollout, m.Update, m.Step}
}

// Peak is the largest phase's peak.
func (m MemoryPlan) Peak() int64 {
	var p int64
	for _, ph := range m.Phases() {
		p = max(p, ph.Peak())
	}
	return p
}

// gradBucket is one bucket of the gradient sums (rc_policy::bucket_grads):
// its elements, the most of them one rank owns (rc_policy::share, per
// parameter), and the layer whose backward completes it (order_buckets in
// cgo/recal_dist.cc: its lowest layer; -1, the backward's end, for one
// holding the embedding, the final norm or the output head).
type gradBucket struct {
	elems, owned int64
	ready        int
}

// gradBuckets cuts the parameters, in order, into buckets of at least
// bucketBytes/4 elements (the last may be smaller), as the bridge does.
func (c *Config) gradBuckets(bucketBytes, world int64) []gradBucket {
	params := c.Params()
	capElems := max(1, bucketBytes/4)
	var out []gradBucket
	cur := gradBucket{ready: math.MaxInt}
	for i, t := range params {
		n := t.Numel()
		layer := -1 // a decoder layer's parameter is complete after that layer's backward
		if _, err := fmt.Sscanf(t.Name, "model.layers.%d.", &layer); err != nil {
			layer = -1
		}
		var owned int64 // the largest rank's share: cuts at multiples of 64
		cut := func(k int64) int64 {
			if k == world {
				return n
			}
			return n / 64 * k / world * 64
		}
		for r := range world {
			owned = max(owned, cut(r+1)-cut(r))
		}
		cur.elems += n
		cur.owned += owned
		cur.ready = min(cur.ready, layer)
		if cur.elems >= capElems || i == len(params)-1 {
			out = append(out, cur)
			cur = gradBucket{ready: math.MaxInt}
		}
	}
	return out
}

// shardedBuckets sums the buckets' elements (whole), the largest rank's
// shares of them (shares), and what they hold at the end of a
// checkpointed backward under ZeRO-2 (late): the whole of those completed
// by layer 0's backward or at the end, the shares of the rest.
func (c *Config) shardedBuckets(bucketBytes, world int64) (whole, shares, late int64) {
	for _, b := range c.gradBuckets(bucketBytes, world) {
		whole += b.elems
		shares += b.owned
		if b.ready <= 0 {
			late += b.elems
		} else {
			late += b.owned
		}
	}
	return whole, shares, late
}

// PlanMemory plans the memory per rank of the work o describes for a policy
// of c, phase by phase, from the shapes of the tensors the bridge
// (cgo/recal_*.cc) allocates and when it frees them: what persists
// (weights, the KL reference, the optimizer state and, for several ranks,
// the gradient buckets), and what each phase adds at its peak. bench/memory
// measures the update against this plan.
func (c *Config) PlanMemory(o MemoryOptions) MemoryPlan {
	es := int64(4)
	if o.DType == "bfloat16" {
		es = 2
	}
	world := int64(max(o.World, 1))
	P := c.NumParams()
	H, I, V, L := c.HiddenSize, c.IntermediateSize, c.VocabSize, c.NumHiddenLayers
	hd := c.HeadDimension()
	nh, kvh := c.NumAttentionHeads, c.NumKeyValueHeads
	qd, kd := nh*hd, kvh*hd
	share := P // optimizer elements this rank holds
	sharded := o.Train && o.ShardOptimizer && world > 1
	if sharded {
		share = (P + world - 1) / world
	}
	largest := int64(0) // the largest parameter's elements (the step's temporaries)
	for _, t := range c.Params() {
		largest = max(largest, t.Numel())
	}
	largestShare := largest
	if sharded {
		largestShare = (largest + world - 1) / world
	}

	persist := []MemoryPart{{"runtime", o.Runtime}, {"weights", P * es}}
	reference := MemoryPart{"KL reference", P * es}
	reload := o.Train && o.KLReference && o.ReloadReference
	if o.Train && o.KLReference && !reload {
		persist = append(persist, reference)
	}
	// The gradient buckets (several ranks) are kept between steps: the
	// all-reduce runs on them in place. On a GPU they hold their memory
	// throughout; on the CPU the step zeroes them by giving their pages
	// back (rc_policy::clear_grads), so they exist only from the update's
	// backward to the step's end.
	buckets := MemoryPart{"gradient buckets", 0}
	if o.Train {
		persist = append(persist, MemoryPart{"AdamW moments", 2 * share * 4})
		if es != 4 {
			persist = append(persist, MemoryPart{"float32 master weights", share * 4})
		}
		if world > 1 {
			buckets.Bytes = P * 4
			if o.CUDA {
				persist = append(persist, buckets)
				buckets.Bytes = 0
			}
		}
	}
	// ZeRO-2 (the CPU): the buckets at the update's two moments and in the
	// step. At the output head of a step's only backward they hold the
	// head weight's gradient (the rest of their pages untouched); with
	// several micro-batches the earlier ones filled them. At the
	// backward's end, with checkpointed layers, each bucket reduced during
	// it holds the rank's shares only, except those the last layer's
	// backward started (layer 0's, settled by the all-reduce after) and
	// those the end completes (the embedding's, the head's, the final
	// norm's); without checkpointing all are whole. In the step, the
	// shares.
	headBuckets, endBuckets, stepBuckets := buckets, buckets, buckets
	if zero2 := sharded && o.ShardGradients && !o.CUDA; zero2 {
		whole, shares, late := c.shardedBuckets(bucketBytesOr(o.BucketBytes), world)
		headBuckets.Bytes = c.VocabSize * H * 4
		if o.MicroBatches > 1 {
			headBuckets.Bytes = whole * 4
		}
		endBuckets.Bytes = whole * 4
		if o.Checkpointing {
			endBuckets.Bytes = late * 4
		}
		stepBuckets.Bytes = shares * 4
	}
	with := func(name string, extra ...MemoryPart) MemoryPhase {
		return MemoryPhase{Name: name, Parts: append(append([]MemoryPart{}, persist...), extra...)}
	}

	// Rollout: the KV cache and the first decode call's workspace (every
	// row's prompt at once). The row kernels (float32 on the CPU) keep, per
	// new token, the hidden state, its norm, the attention output, the
	// residual, q, k, v, the attention's result and the MLP's gate and up
	// activations, and per row the float32 logits and two vocabulary-sized
	// sampling buffers. libtorch's kernels (bfloat16, CUDA) also hold a
	// prompt's float32 attention scores and their probabilities.
	rows, capacity, prompt := int64(max(o.RolloutRows, 0)), int64(max(o.Capacity, 0)), int64(max(o.PromptLen, 0))
	columns := capacity
	if o.CUDA && capacity > 0 { // a scratch column, the columns a multiple of 64 (rc_cache_new)
		columns = (capacity + 1 + 63) / 64 * 64
	}
	kv := L * 2 * rows * kvh * columns * hd * es
	decode := rows * prompt * (4*H + 2*qd + 2*kd + 2*I) * 4
	decode += rows * V * 4 * 3
	if o.CUDA || es != 4 {
		decode += rows * nh * prompt * prompt * (4 + es)
	}
	rollout := with("rollout", MemoryPart{"KV cache", kv}, MemoryPart{"decode workspace", decode})
	if !o.Train {
		return MemoryPlan{Rollout: rollout}
	}

	// Update. What autograd keeps per token and layer (cgo/recal_model.cc's
	// decoder_layer): the two RMS norms' normalised inputs and outputs, the
	// attention's residual sum and the layer's output (6H); q as projected,
	// its rotate_half and its head-major copy, and the attention's output
	// (4·q_dim); k as projected, its rotate_half and its head-major copy,
	// and v's head-major copy (4·kv_dim); the MLP's gate, SiLU, up and
	// product (4I). Per sequence and layer: the float32 attention
	// probabilities [heads, T, T]. Besides the layers: the embedding's
	// output, the final norm's two and the scored positions' hidden states
	// (4H per token). With checkpointing, only each layer's output stays
	// (the layers' inputs), and one layer's activations exist at a time,
	// while the backward recomputes it.
	S, T := int64(max(o.MicroSeqs, 0)), int64(max(o.SeqLen, 0))
	N := S * T
	perTok := 6*H + 4*qd + 4*kd + 4*I
	layer := N*perTok*es + S*nh*T*T*4
	acts := L*layer + 4*N*H*es
	if o.Checkpointing {
		acts = (L+4)*N*H*es + layer
	}
	// The backward's own tensors at its start: the gradients of one
	// layer's activations, as large as those activations.
	workspace := layer
	chunk := int64(o.HeadChunk)
	if chunk <= 0 {
		chunk = 256
	}
	chunk = max(min(chunk, N), 0)
	// The output head, fused and chunked (recal_train.cc's head): a chunk's
	// float32 logits and their exponentials, the head weight's float32
	// gradient of this backward, and dL/dh for every scored token. With
	// several ranks and one micro-batch a step, the backward starts from
	// zeroed buckets and adds the head weight's gradient into them
	// (rc_policy::head_grad_target): no gradient of its own.
	logits := 2 * chunk * V * 4
	headDirect := world > 1 && o.MicroBatches <= 1
	headWeight := V * H * 4
	if headDirect {
		headWeight = 0
	}
	headGrad := headWeight + N*H*es
	// The embedding's backward makes a dense [vocab, hidden] gradient in the
	// policy's dtype, except on the CPU where it adds its rows in place
	// (recal_model.cc's Embedding): into the head weight's gradient when
	// tied, into the zeroed bucket when untied with float32 buckets.
	dense := V * H * es
	if !o.CUDA && (c.TieWordEmbeddings || (es == 4 && headDirect)) {
		dense = 0
	}
	noDense := V*H*es - dense // what the trunk's gradients lack without it
	// Gradients, and when the update peaks. The float32 sums exist before
	// a backward starts when it is not the step's first micro-batch (one
	// rank) and always with several ranks (the buckets, counted above). A
	// backward's own gradients appear as it goes while the activations it
	// consumes are freed, so they peak at its end, beside the head
	// weight's gradient: a float32 first micro-batch's gradients become the
	// sums (no copy); later ones exist beside the sums until they are
	// added in; with buckets autograd adds into them directly except for
	// the embedding's dense gradient (the output head's weight when tied),
	// which flush_grads adds; bfloat16 gradients always exist beside the
	// float32 sums, and one rank's first micro-batch creates the sums from
	// them. The update's peak is the larger of two moments: the head's
	// (every activation, the logits chunk or, once autograd starts, the
	// backward's workspace, the head gradients) and the backward's end
	// (its gradients and the head weight's).
	var before, fresh int64
	if world == 1 && o.MicroBatches > 1 {
		before = P * 4
	}
	switch {
	case es != 4 && world == 1 && o.MicroBatches <= 1:
		fresh = max(P*es-noDense, P*4-V*H*4) // the sums made from them, the embedding's into the head's
	case es != 4:
		fresh = P*es - noDense
	case world > 1:
		fresh = dense
	default:
		fresh = P*4 - noDense
	}
	head := []MemoryPart{headBuckets, {"gradient sums", before}, {"activations", acts}}
	if logits >= workspace {
		head = append(head, MemoryPart{"logits chunk", logits})
	} else {
		head = append(head, MemoryPart{"backward workspace", workspace})
	}
	head = append(head, MemoryPart{"head gradients", headGrad})
	// The embedding's dense gradient, where there is one, is made by its
	// backward and then copied into .grad (autograd keeps what it cannot
	// take over), so a second one exists for a moment at the end.
	end := []MemoryPart{endBuckets, {"gradient sums", before}, {"backward's gradients", fresh}, {"head weight's gradient", headWeight},
		{"embedding gradient's copy", dense}}
	hp, ep := with("update", head...), with("update", end...)
	update := hp
	if ep.Peak() > hp.Peak() {
		update = ep
	}

	// Step: the sums (with several ranks the buckets, made before the
	// first backward by PrepareUpdate, hold them), and in turn: the
	// optimizer's float32 temporaries (recal_train.cc's rc_policy_step,
	// one parameter, or one StepSlice of a larger one, at a time: the
	// gradient's square for the norm, then of the rank's share the clipped
	// gradient, the second moment's square root and the denominator);
	// sharded, for one round of the all-gather (GatherRound elements of
	// each rank's range, or the whole range when it is shorter), the send
	// buffer, every rank's piece (the policy's dtype), and c10d's own
	// flat buffer of every rank's piece, which its allgather fills before
	// copying out (ProcessGroupGloo's and ProcessGroupNCCL's alike); with
	// several ranks on the CPU, the gradient all-reduce's scratch: Gloo's
	// ring keeps two of a bucket's pipeline steps (AllreduceSegment bytes
	// at most, at most a 2·world-th of the bucket), for each of the
	// buckets c10d's two worker threads reduce at once.
	// These come one after the other, so the phase's peak holds the
	// largest of them.
	temp := MemoryPart{"optimizer temporaries", max(min(largest, StepSlice), 3*min(largestShare, StepSlice)) * 4}
	bucketBytes := bucketBytesOr(o.BucketBytes)
	if world > 1 && !o.CUDA {
		bucket := min(P*4, bucketBytes+largest*4) // a bucket holds whole parameters
		step := min(AllreduceSegment, (bucket+2*world-1)/(2*world))
		inFlight := int64(2)
		if P*4 <= bucketBytes { // one bucket
			inFlight = 1
		}
		if scratch := inFlight * 2 * step; scratch > temp.Bytes {
			temp = MemoryPart{"all-reduce scratch", scratch}
		}
	}
	round := min((P+world-1)/world, GatherRound(bucketBytes, es)) // each rank's piece of one round
	if gather := (2*world + 1) * round * es; sharded && gather > temp.Bytes {
		temp = MemoryPart{"parameter all-gather", gather}
	}
	var sums int64 // the buckets hold them with several ranks
	if world == 1 {
		sums = P * 4
	}
	step := with("step", stepBuckets, MemoryPart{"gradient sums", sums}, temp)
	plan := MemoryPlan{Rollout: rollout, Update: update, Head: hp, BackwardEnd: ep, Step: step}

	// Reference (policy.reload_reference): the reference is loaded (its
	// tensors read in ReadChunk pieces) and scores the rank's sequences
	// micro-batch by micro-batch with no autograd: one layer's activations
	// at a time beside the hidden states in and out of it, and the output
	// head's chunk of 256 positions (rc_policy_score) of float32 logits and
	// their exponentials.
	if reload {
		score := layer + 2*N*H*es + 2*min(256, N)*V*4
		plan.Reference = with("ref", reference, MemoryPart{"scoring workspace", max(score, ReadChunk)})
	}
	return plan
}

// bucketBytesOr is dist.bucket_bytes, or its default (25 MiB) when unset.
func bucketBytesOr(b int64) int64 {
	if b <= 0 {
		return 25 << 20
	}
	return b
}
