package torchbridge

/*
#include <stdlib.h>
#include "recal.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"github.com/recal-project/recal/internal/hfmodel"
)

// Options say where and in what precision a policy lives.
type Options struct {
	Device string // "cpu", "cuda" or "cuda:N"
	DType  string // "float32" or "bfloat16"
	// EagerDecode turns CUDA-graph decoding off (SetCUDAGraphs): every
	// kernel of a GPU decode step is launched from the host. No effect on
	// the CPU.
	EagerDecode bool
	// Unchecked skips LoadPolicy's check of the folder's checksums.sha256,
	// for a folder checked by an earlier load and known unchanged since
	// (the trainer's KL reference, reloaded each step). The checks of
	// shapes and of non-finite weights still run.
	Unchecked bool
}

func (o Options) withDefaults() Options {
	if o.Device == "" {
		o.Device = "cpu"
	}
	if o.DType == "" {
		o.DType = "float32"
	}
	return o
}

func (o Options) code() (C.int32_t, string, error) {
	switch o.DType {
	case "float32":
		return C.RC_F32, "F32", nil
	case "bfloat16":
		return C.RC_BF16, "BF16", nil
	}
	return 0, "", fmt.Errorf("torchbridge: dtype %q: want float32 or bfloat16", o.DType)
}

var dtypeCodes = map[string]C.int32_t{"F32": C.RC_F32, "BF16": C.RC_BF16, "F16": C.RC_F16}

// Param names one parameter tensor (Hugging Face naming) and its shape.
type Param struct {
	Name  string
	Shape []int64
}

// Numel is the element count.
func (p Param) Numel() int64 {
	n := int64(1)
	for _, d := range p.Shape {
		n *= d
	}
	return n
}

// auxFiles are the non-weight files of a checkpoint that Save carries over.
var auxFiles = []string{"generation_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json"}

// Policy is a Qwen2 decoder in libtorch with its optimizer state.
type Policy struct {
	h      *C.rc_policy
	cfg    *hfmodel.Config
	opt    Options
	params []Param
	caches map[*Cache]struct{}
	// Aux holds checkpoint files carried over by Save (tokenizer files,
	// generation_config.json), keyed by file name.
	Aux map[string][]byte
}

// NewPolicy creates a policy with zeroed weights for cfg.
func NewPolicy(cfg *hfmodel.Config, opt Options) (*Policy, error) {
	opt = opt.withDefaults()
	dt, _, err := opt.code()
	if err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("torchbridge: config: %w", err)
	}
	p := &Policy{cfg: cfg, opt: opt, caches: map[*Cache]struct{}{}, Aux: map[string][]byte{}}
	cc := C.rc_config{
		vocab_size: C.int64_t(cfg.VocabSize), hidden_size: C.int64_t(cfg.HiddenSize),
		intermediate_size: C.int64_t(cfg.IntermediateSize), num_hidden_layers: C.int64_t(cfg.NumHiddenLayers),
		num_attention_heads: C.int64_t(cfg.NumAttentionHeads), num_key_value_heads: C.int64_t(cfg.NumKeyValueHeads),
		head_dim: C.int64_t(cfg.HeadDimension()), max_position_embeddings: C.int64_t(cfg.MaxPositionEmbeddings),
		rope_theta: C.double(cfg.RopeTheta), rms_norm_eps: C.double(cfg.RMSNormEps),
		tie_word_embeddings: cBool(cfg.TieWordEmbeddings),
	}
	err = do(context.Background(), func() error {
		dev := C.CString(opt.Device)
		defer C.free(unsafe.Pointer(dev))
		var msg *C.char
		if err := status(C.rc_policy_new(&cc, dev, dt, &p.h, &msg), msg); err != nil {
			return err
		}
		var n C.int64_t
		if err := status(C.rc_policy_num_params(p.h, &n, &msg), msg); err != nil {
			return err
		}
		for i := C.int64_t(0); i < n; i++ {
			var name *C.char
			var nd C.int32_t
			var shape [4]C.int64_t
			if err := status(C.rc_policy_param_info(p.h, i, &name, &nd, &shape[0], &msg), msg); err != nil {
				return err
			}
			pr := Param{Name: C.GoString(name)}
			for d := 0; d < int(nd); d++ {
				pr.Shape = append(pr.Shape, int64(shape[d]))
			}
			p.params = append(p.params, pr)
		}
		if opt.EagerDecode {
			return status(C.rc_policy_set_cuda_graphs(p.h, 0, &msg), msg)
		}
		return nil
	})
	if err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// LoadPolicy loads a Hugging Face checkpoint folder: config.json and
// model.safetensors (or a sharded model.safetensors.index.json), tensors in
// F32, BF16 or F16, converted to opt.DType.
func LoadPolicy(dir string, opt Options) (*Policy, error) {
	cfg, err := hfmodel.LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	w, err := hfmodel.OpenWeights(dir)
	if err != nil {
		return nil, err
	}
	defer w.Close()
	// Before anything is allocated: every tensor config.json implies is in
	// the files with its shape (so the policy is no larger than its
	// weights, whatever config.json claims), and the files are those recal
	// wrote, when it wrote the folder (a folder from elsewhere has no
	// checksums).
	if bad := w.Mismatches(cfg); len(bad) > 0 {
		more := ""
		if len(bad) > 1 {
			more = fmt.Sprintf(" (and %d more tensors)", len(bad)-1)
		}
		return nil, fmt.Errorf("torchbridge: %s: %s%s", dir, bad[0], more)
	}
	if !opt.Unchecked {
		if _, err := hfmodel.VerifyChecksums(dir, hfmodel.PolicyFile); err != nil && !errors.Is(err, hfmodel.ErrNoChecksums) {
			return nil, err
		}
	}
	p, err := NewPolicy(cfg, opt)
	if err != nil {
		return nil, err
	}
	if err := p.loadWeights(w, dir); err != nil {
		p.Close()
		return nil, err
	}
	for _, f := range auxFiles {
		if b, err := os.ReadFile(filepath.Join(dir, f)); err == nil {
			p.Aux[f] = b
		}
	}
	return p, nil
}

func (p *Policy) loadWeights(w *hfmodel.Weights, dir string) error {
	var buf []byte
	for _, pr := range p.params {
		t, ok := w.Lookup(pr.Name)
		if !ok {
			return fmt.Errorf("torchbridge: %s: tensor %q is missing", dir, pr.Name)
		}
		if _, ok := hfmodel.DTypeSize[t.DType]; !ok {
			return fmt.Errorf("torchbridge: %s: tensor %q: unsupported dtype %q (want F32, BF16 or F16)", t.Path(), pr.Name, t.DType)
		}
		if !slices.Equal(t.Shape, pr.Shape) {
			return fmt.Errorf("torchbridge: %s: tensor %q: shape %v, want %v", t.Path(), pr.Name, t.Shape, pr.Shape)
		}
		// In pieces of at most hfmodel.ReadChunk bytes through one buffer:
		// a load holds no whole copy of a tensor beside the policy's (a
		// 3B model's embedding is 0.6 GiB in bfloat16), which matters
		// where a KL reference is loaded each step.
		es := hfmodel.DTypeSize[t.DType]
		size := t.Numel() * es
		if buf == nil || int64(len(buf)) < min(size, hfmodel.ReadChunk) {
			buf = make([]byte, min(size, hfmodel.ReadChunk))
		}
		step := int64(len(buf)) / es * es
		for off := int64(0); off < size; off += step {
			b := buf[:min(step, size-off)]
			if err := w.ReadAt(t, b, off); err != nil {
				return err
			}
			if i := hfmodel.NonFinite(t.DType, b); i >= 0 {
				return hfmodel.NonFiniteError(t, off/es+i)
			}
			if err := p.setParamRange(pr.Name, t.DType, off/es, b); err != nil {
				return err
			}
		}
	}
	return nil
}

// setParamRange copies raw data of dtype into parameter name's elements
// from offset on (flat order).
func (p *Policy) setParamRange(name, dtype string, offset int64, data []byte) error {
	return p.rawCall(name, dtype, data, func(h *C.rc_policy, cn *C.char, code C.int32_t, ptr unsafe.Pointer, n C.int64_t, msg **C.char) C.int {
		return C.rc_policy_set_param_range(h, cn, code, C.int64_t(offset), ptr, n, msg)
	})
}

// rawCall runs call (a bridge call that copies raw data of dtype into or
// out of the tensor name) on the torch thread with its C arguments.
func (p *Policy) rawCall(name, dtype string, data []byte,
	call func(h *C.rc_policy, cn *C.char, code C.int32_t, ptr unsafe.Pointer, n C.int64_t, msg **C.char) C.int) error {
	code, ok := dtypeCodes[dtype]
	if !ok {
		return fmt.Errorf("torchbridge: tensor %q: unsupported dtype %q", name, dtype)
	}
	return p.call(context.Background(), func(h *C.rc_policy) error {
		cn := C.CString(name)
		defer C.free(unsafe.Pointer(cn))
		var msg *C.char
		var ptr unsafe.Pointer
		if len(data) > 0 {
			ptr = unsafe.Pointer(&data[0])
		}
		return status(call(h, cn, code, ptr, C.int64_t(len(data)), &msg), msg)
	})
}

// Config returns the architecture.
func (p *Policy) Config() *hfmodel.Config { return p.cfg }

// Options returns the device and dtype.
func (p *Policy) Options() Options { return p.opt }

// Params lists the parameters in a fixed order.
func (p *Policy) Params() []Param { return p.params }

// NumParams is the total element count of the parameters.
func (p *Policy) NumParams() int64 {
	var n int64
	for _, pr := range p.params {
		n += pr.Numel()
	}
	return n
}

// ShardOptimizer makes the policy hold only rank's share, of world ranks,
// of its AdamW moments and float32 master weights (ZeRO-1): Step then
// updates this rank's share of every parameter's elements, and
// ProcessGroup.GatherParams gives each rank the others'. The parameters,
// laid end to end (each padded to a multiple of 64 elements), are cut into
// world nearly equal ranges, so any world size works. Whole state already
// there is cut to the share; state sharded another way goes through a
// checkpoint (GatherState, SaveOptimizer, LoadOptimizer). A sharded
// policy's optimizer tensors are loaded whole (it keeps its share) and
// saved whole only after ProcessGroup.GatherState. Call it after
// AddValueHead, if any.
func (p *Policy) ShardOptimizer(rank, world int) error {
	if world < 1 || rank < 0 || rank >= world {
		return fmt.Errorf("torchbridge: shard optimizer: rank %d of %d", rank, world)
	}
	return p.call(context.Background(), func(h *C.rc_policy) error {
		var msg *C.char
		return status(C.rc_policy_shard_optimizer(h, C.int64_t(rank), C.int64_t(world), &msg), msg)
	})
}

// SetCheckpointing turns activation checkpointing per decoder layer on or
// off for the backward passes that follow (Backward, BackwardNLL): a layer's
// activations are recomputed in the backward instead of kept from the
// forward, so the trunk holds one layer's activations at a time (and each
// layer's input) for about one more forward pass of compute. The gradients
// are those of the plain backward.
func (p *Policy) SetCheckpointing(on bool) error {
	return p.call(context.Background(), func(h *C.rc_policy) error {
		var msg *C.char
		return status(C.rc_policy_set_checkpointing(h, cBool(on), &msg), msg)
	})
}

// cBool is on as the C ABI's flags take it.
func cBool(on bool) C.int32_t {
	if on {
		return 1
	}
	return 0
}

// SetCUDAGraphs turns CUDA-graph decoding on (the default) or off. On a
// CUDA policy in a CUDA build, a decode step (one new token for each row of
// an Extend) replays a CUDA graph of the whole step, captured once per
// padded batch size and attended length on each cache, instead of
// launching its kernels one by one from the host. Its tokens and log-probs
// are those of eager decoding within float rounding. No effect on the CPU.
func (p *Policy) SetCUDAGraphs(on bool) error {
	return p.call(context.Background(), func(h *C.rc_policy) error {
		var msg *C.char
		return status(C.rc_policy_set_cuda_graphs(h, cBool(on), &msg), msg)
	})
}

// Kernels are the kernel choices of a policy's inference passes (decoding,
// scoring, the KL reference): a set of Kernel* flags, KernelsDefault at
// creation. Training passes (the loss's forward and backward) are the same
// whatever the set.
type Kernels int32

const (
	// KernelFusedProj: one product for each layer's q, k and v projections
	// and one for its gate and up projections, and one rotary pass over q
	// and k. It needs the fused layout, in which those weights live in one
	// tensor per layer and each parameter is a view of it (checkpoints
	// still hold them apart): made at creation on a GPU and, when this flag
	// is set, on the CPU.
	KernelFusedProj Kernels = C.RC_KERNEL_FUSED_PROJ
	// KernelGraphSample: CUDA-graph decode steps also draw the token when
	// sampling at temperature 1 with no top-k, top-p or bans (a training
	// rollout's setting), with the uniform the eager path would draw.
	KernelGraphSample Kernels = C.RC_KERNEL_GRAPH_SAMPLE
	// KernelF32PrefillMatmul: on a GPU, float32 passes of several tokens
	// attend by matrix products, not the fused kernel (which runs float32
	// without tensor cores, on keys copied per query head).
	KernelF32PrefillMatmul Kernels = C.RC_KERNEL_F32_PREFILL_MATMUL
	// KernelsDefault is every choice on.
	KernelsDefault Kernels = C.RC_KERNELS_DEFAULT
)

// SetKernels sets the policy's kernel choices (Kernels); turning a choice
// off runs the arithmetic the bridge ran before it, for comparisons.
func (p *Policy) SetKernels(k Kernels) error {
	return p.call(context.Background(), func(h *C.rc_policy) error {
		var msg *C.char
		return status(C.rc_policy_set_kernels(h, C.int32_t(k), &msg), msg)
	})
}

// GraphStats counts a policy's CUDA-graph decoding since it was created.
type GraphStats struct {
	Captures int64 // graphs captured
	Replays  int64 // decode steps run by a graph
	// Error is why a capture failed (the policy then decodes eagerly), or "".
	Error string
}

// GraphStats returns the policy's CUDA-graph counts.
func (p *Policy) GraphStats() (GraphStats, error) {
	var gs GraphStats
	err := p.call(context.Background(), func(h *C.rc_policy) error {
		var msg, gerr *C.char
		var captures, replays C.int64_t
		if err := status(C.rc_policy_graph_stats(h, &captures, &replays, &gerr, &msg), msg); err != nil {
			return err
		}
		gs.Captures, gs.Replays = int64(captures), int64(replays)
		if gerr != nil {
			gs.Error = C.GoString(gerr)
			C.free(unsafe.Pointer(gerr))
		}
		return nil
	})
	return gs, err
}

// DeviceMemoryStats are the CUDA caching allocator's counters, in bytes.
type DeviceMemoryStats struct {
	Allocated, PeakAllocated int64 // held by tensors: now, and the peak since the last reset
	Reserved, PeakReserved   int64 // taken from the device by the allocator (cached blocks included)
	Total, Free              int64 // the device's memory, and what is free on it (all processes')
}

// DeviceMemory reads the CUDA caching allocator's counters of device
// ("cuda", "cuda:N"), then resets the peaks when resetPeak is set. It fails
// in builds without CUDA.
func DeviceMemory(device string, resetPeak bool) (DeviceMemoryStats, error) {
	var out [6]C.int64_t
	err := do(context.Background(), func() error {
		d := C.CString(device)
		defer C.free(unsafe.Pointer(d))
		var msg *C.char
		return status(C.rc_device_memory(d, cBool(resetPeak), &out[0], &msg), msg)
	})
	return DeviceMemoryStats{Allocated: int64(out[0]), PeakAllocated: int64(out[1]), Reserved: int64(out[2]), PeakReserved: int64(out[3]),
		Total: int64(out[4]), Free: int64(out[5])}, err
}

// RowInvariant reports whether the policy decodes by the row-invariant
// kernels (a float32 policy on the CPU): a row's logits, sample and
// log-prob in Cache.Extend are then the same bits whatever rows share the
// call, whatever the thread count and whatever BLAS kernel the machine runs.
// Otherwise (bfloat16, CUDA) libtorch's kernels pick their strategy by
// shape and a row's bits may depend on the call, within float rounding.
func (p *Policy) RowInvariant() (bool, error) {
	var v C.int32_t
	err := p.call(context.Background(), func(h *C.rc_policy) error {
		var msg *C.char
		return status(C.rc_policy_row_invariant(h, &v, &msg), msg)
	})
	return v != 0, err
}

// call runs fn on the torch thread with the live handle.
func (p *Policy) call(ctx context.Context, fn func(h *C.rc_policy) error) error {
	return do(ctx, func() error {
		if p.h == nil {
			return ErrClosed
		}
		return fn(p.h)
	})
}

// SetParam copies raw little-endian data of dtype ("F32", "BF16", "F16") into
// a parameter or optimizer tensor.
func (p *Policy) SetParam(name, dtype string, data []byte) error {
	return p.rawCall(name, dtype, data, func(h *C.rc_policy, cn *C.char, code C.int32_t, ptr unsafe.Pointer, n C.int64_t, msg **C.char) C.int {
		return C.rc_policy_set_param(h, cn, code, ptr, n, msg)
	})
}

// GetParam copies a parameter or optimizer tensor into buf as dtype.
func (p *Policy) GetParam(name, dtype string, buf []byte) error {
	return p.rawCall(name, dtype, buf, func(h *C.rc_policy, cn *C.char, code C.int32_t, ptr unsafe.Pointer, n C.int64_t, msg **C.char) C.int {
		return C.rc_policy_get_param(h, cn, code, ptr, n, msg)
	})
}

// InitRandom draws the weights from N(0, std²) (norm weights 1, biases 0).
func (p *Policy) InitRandom(seed uint64, std float64) error {
	return p.call(context.Background(), func(h *C.rc_policy) error {
		var msg *C.char
		return status(C.rc_policy_init_random(h, C.uint64_t(seed), C.double(std), &msg), msg)
	})
}

// SetTrainable freezes (false) or unfreezes the policy. A frozen policy keeps
// no gradients and no optimizer state: the KL reference is one.
func (p *Policy) SetTrainable(on bool) error {
	return p.call(context.Background(), func(h *C.rc_policy) error {
		var msg *C.char
		return status(C.rc_policy_set_trainable(h, cBool(on), &msg), msg)
	})
}

// Save writes a Hugging Face checkpoint folder (config.json, model.safetensors
// in the policy's dtype, and the Aux files). The folder is replaced as a
// whole: files go to a temporary sibling that is renamed into place.
func (p *Policy) Save(dir string) error {
	_, st, err := p.opt.code()
	if err != nil {
		return err
	}
	dir = filepath.Clean(dir)
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("torchbridge: %w", err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "."+filepath.Base(dir)+".tmp-")
	if err != nil {
		return fmt.Errorf("torchbridge: %w", err)
	}
	defer os.RemoveAll(tmp)
	cfg := *p.cfg
	cfg.TorchDType = p.opt.DType
	cb, err := cfg.MarshalJSON()
	if err != nil {
		return fmt.Errorf("torchbridge: %w", err)
	}
	files := map[string][]byte{"config.json": cb}
	for k, v := range p.Aux {
		files[k] = v
	}
	for name, b := range files {
		if err := writeFile(filepath.Join(tmp, name), b); err != nil {
			return err
		}
	}
	// The value head (PPO) goes to its own file, so that model.safetensors
	// holds exactly the Hugging Face model's tensors.
	var specs, head []hfmodel.TensorSpec
	for _, pr := range p.params {
		spec := hfmodel.TensorSpec{Name: pr.Name, DType: st, Shape: pr.Shape}
		if isValueHead(pr.Name) {
			head = append(head, spec)
		} else {
			specs = append(specs, spec)
		}
	}
	meta := map[string]string{"format": "pt"}
	for _, f := range []struct {
		name  string
		specs []hfmodel.TensorSpec
	}{{"model.safetensors", specs}, {ValueHeadFile, head}} {
		if len(f.specs) == 0 {
			continue
		}
		err = hfmodel.WriteSafetensors(filepath.Join(tmp, f.name), f.specs, meta, func(i int, buf []byte) error {
			return p.GetParam(f.specs[i].Name, st, buf)
		})
		if err != nil {
			return err
		}
	}
	if err := hfmodel.WriteChecksums(tmp); err != nil {
		return err
	}
	return replaceDir(tmp, dir)
}

// ValueHeadFile is the file of a checkpoint folder that holds the value head
// (Save writes it beside model.safetensors when the policy has one).
const ValueHeadFile = "value_head.safetensors"

// isValueHead reports whether a parameter belongs to the value head.
func isValueHead(name string) bool { return strings.HasPrefix(name, "value_head.") }

// AddValueHead gives the policy PPO's value head: a linear layer from the
// final-norm hidden state to one number, value_head.weight [1, hidden] and
// value_head.bias [1], zero-initialised (every value starts at 0). It is
// trained with the other parameters (Backward with Returns), has its own
// AdamW state (fresh moments) and learning rate (AdamW.ValueLR), and Save
// writes it to ValueHeadFile.
func (p *Policy) AddValueHead() error {
	if p.HasValueHead() {
		return fmt.Errorf("torchbridge: the policy already has a value head")
	}
	err := p.call(context.Background(), func(h *C.rc_policy) error {
		var msg *C.char
		return status(C.rc_policy_add_value_head(h, &msg), msg)
	})
	if err != nil {
		return err
	}
	hs := p.cfg.HiddenSize
	p.params = append(p.params, Param{Name: "value_head.weight", Shape: []int64{1, hs}}, Param{Name: "value_head.bias", Shape: []int64{1}})
	return nil
}

// HasValueHead reports whether AddValueHead was called.
func (p *Policy) HasValueHead() bool {
	return slices.ContainsFunc(p.params, func(pr Param) bool { return isValueHead(pr.Name) })
}

// LoadValueHead reads the value head's tensors from a file Save wrote
// (ValueHeadFile), converting them to the policy's dtype.
func (p *Policy) LoadValueHead(path string) error {
	if !p.HasValueHead() {
		return fmt.Errorf("torchbridge: %s: the policy has no value head to load into (AddValueHead)", path)
	}
	w, err := hfmodel.OpenWeightsFile(path)
	if err != nil {
		return err
	}
	defer w.Close()
	for _, pr := range p.params {
		if !isValueHead(pr.Name) {
			continue
		}
		t, ok := w.Lookup(pr.Name)
		if !ok {
			return fmt.Errorf("torchbridge: %s: tensor %q is missing", path, pr.Name)
		}
		if !slices.Equal(t.Shape, pr.Shape) {
			return fmt.Errorf("torchbridge: %s: tensor %q: shape %v, want %v", path, pr.Name, t.Shape, pr.Shape)
		}
		b, err := w.Read(t)
		if err != nil {
			return err
		}
		if i := hfmodel.NonFinite(t.DType, b); i >= 0 {
			return hfmodel.NonFiniteError(t, i)
		}
		if err := p.SetParam(pr.Name, t.DType, b); err != nil {
			return fmt.Errorf("torchbridge: %s: %w", path, err)
		}
	}
	return nil
}

// SaveOptimizer writes the AdamW state (moments, master weights, step) as a
// safetensors file, atomically.
func (p *Policy) SaveOptimizer(path string) error {
	names, step, err := p.stateNames()
	if err != nil {
		return err
	}
	byName := map[string]Param{}
	for _, pr := range p.params {
		byName[pr.Name] = pr
	}
	specs := make([]hfmodel.TensorSpec, len(names))
	for i, n := range names {
		pr := byName[paramOf(n)]
		specs[i] = hfmodel.TensorSpec{Name: n, DType: "F32", Shape: pr.Shape}
	}
	meta := map[string]string{"step": strconv.FormatInt(step, 10), "format": "recal-adamw"}
	return hfmodel.WriteSafetensors(path, specs, meta, func(i int, buf []byte) error {
		return p.GetParam(specs[i].Name, "F32", buf)
	})
}

// LoadOptimizer restores the state written by SaveOptimizer.
func (p *Policy) LoadOptimizer(path string) error {
	names, _, err := p.stateNames()
	if err != nil {
		return err
	}
	w, err := hfmodel.OpenWeightsFile(path)
	if err != nil {
		return err
	}
	defer w.Close()
	base := filepath.Base(path)
	if _, err := hfmodel.VerifyChecksums(filepath.Dir(path), func(n string) bool { return n == base }); err != nil && !errors.Is(err, hfmodel.ErrNoChecksums) {
		return err
	}
	for _, n := range names {
		t, ok := w.Lookup(n)
		if !ok {
			return fmt.Errorf("torchbridge: %s: tensor %q is missing", path, n)
		}
		b, err := w.Read(t)
		if err != nil {
			return err
		}
		if i := hfmodel.NonFinite(t.DType, b); i >= 0 {
			return hfmodel.NonFiniteError(t, i)
		}
		if err := p.SetParam(n, t.DType, b); err != nil {
			return fmt.Errorf("torchbridge: %s: %w", path, err)
		}
	}
	step, err := strconv.ParseInt(w.Metadata()["step"], 10, 64)
	if err != nil {
		return fmt.Errorf("torchbridge: %s: metadata \"step\": %w", path, err)
	}
	return p.call(context.Background(), func(h *C.rc_policy) error {
		var msg *C.char
		return status(C.rc_policy_set_state_step(h, C.int64_t(step), &msg), msg)
	})
}

func paramOf(stateName string) string {
	for i := 0; i < len(stateName); i++ {
		if stateName[i] == '/' {
			return stateName[i+1:]
		}
	}
	return stateName
}

func (p *Policy) stateNames() ([]string, int64, error) {
	var names []string
	var step int64
	err := p.call(context.Background(), func(h *C.rc_policy) error {
		var msg *C.char
		var arr **C.char
		var n C.int64_t
		if err := status(C.rc_policy_state_names(h, &arr, &n, &msg), msg); err != nil {
			return err
		}
		for _, s := range unsafe.Slice(arr, int(n)) {
			names = append(names, C.GoString(s))
		}
		var st C.int64_t
		if err := status(C.rc_policy_state_step(h, &st, &msg), msg); err != nil {
			return err
		}
		step = int64(st)
		return nil
	})
	return names, step, err
}

// Close frees the policy and any caches still open on it, and hands the
// memory the heap then holds free back to the system (glibc's malloc_trim:
// a policy loaded and closed each step leaves no resident holes). Safe to
// call twice.
func (p *Policy) Close() error {
	return do(context.Background(), func() error {
		for c := range p.caches {
			c.free()
		}
		p.caches = nil
		if p.h != nil {
			C.rc_policy_free(p.h)
			p.h = nil
		}
		return nil
	})
}

func writeFile(path string, b []byte) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("torchbridge: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("torchbridge: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("torchbridge: %w", err)
	}
	return f.Close()
}

// replaceDir moves the finished folder tmp to dir, replacing an older dir.
func replaceDir(tmp, dir string) error {
	old := dir + ".old"
	os.RemoveAll(old)
	if _, err := os.Stat(dir); err == nil {
		if err := os.Rename(dir, old); err != nil {
			return fmt.Errorf("torchbridge: %w", err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("torchbridge: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("torchbridge: %w", err)
	}
	if d, err := os.Open(filepath.Dir(dir)); err == nil {
		d.Sync()
		d.Close()
	}
	return os.RemoveAll(old)
}
