// recal_internal.h — definitions shared by the bridge's C++ files
// (recal_model.cc, recal_decode.cc, recal_rows.cc, recal_train.cc,
// recal_params.cc, recal_dist.cc); not part of the C ABI. It holds the
// policy's layout, so that the distributed operations can reach its
// gradients, and the error convention of every extern "C" entry point.
#ifndef RECAL_INTERNAL_H
#define RECAL_INTERNAL_H

#include "recal.h"

#include <torch/types.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/version.h>

#if defined(RECAL_CUDA) && TORCH_VERSION_MAJOR >= 2
// libtorch's fused attention (flash, memory-efficient), used on GPUs by the
// model's and the decoding's files (the Makefile gives both RECAL_CUDA).
#define RECAL_SDPA 1
#endif

#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace recal {

// Error raised for bad arguments; it carries a message for Go.
struct rc_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void fail(const std::string& msg) { throw rc_error(msg); }

// Indices into rc_policy::params for one decoder layer.
struct Layer {
  int in_norm, q_w, q_b, k_w, k_b, v_w, v_b, o_w, post_norm, gate, up, down;
  // The fused layout (fuse_layout, recal_model.cc): q, k and v's weights
  // (rows stacked in that order) and biases, and gate and up's weights, each
  // group one tensor whose row ranges the parameters are views of.
  // Undefined without it.
  torch::Tensor qkv_w, qkv_b, gate_up;
};

// Sets OpenBLAS's thread count to the calling thread's libtorch thread
// count, when OpenBLAS is the BLAS libtorch runs on (recal_model.cc).
void sync_blas_threads();

// Hands the pages of the heap's free memory back to the system (glibc's
// malloc_trim; nothing elsewhere).
inline void trim_heap() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

// Runs fn, converting every exception into a status and a malloc'd message.
// First it gives OpenBLAS the calling thread's thread count: OpenBLAS keeps
// one count for the whole process, libtorch one per thread, and how a BLAS
// kernel splits a product among threads can change its bits (OpenBLAS's
// Haswell kernels: see recal_rows.cc). A call's BLAS work then runs on the
// count its own thread was set to, never on one a rollout worker's thread
// or an earlier piece of work left behind.
template <typename Fn>
int guarded(char** err, Fn&& fn) {
  try {
    sync_blas_threads();
    fn();
    return 0;
  } catch (const c10::Error& e) {
    if (err) *err = strdup(e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    if (err) *err = strdup(e.what());
    return 2;
  } catch (...) {
    if (err) *err = strdup("unknown C++ exception");
    return 3;
  }
}

}  // namespace recal

// A Qwen2-architecture decoder: parameters (with their gradients), the
// AdamW state and the indices the forward pass uses.
struct rc_policy {
  rc_config cfg{};
  torch::Device device{torch::kCPU};
  torch::ScalarType dtype{torch::kFloat32};
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  std::unordered_map<std::string, int> index;
  std::vector<recal::Layer> layers;
  int embed = -1, norm = -1, lm_head = -1;  // lm_head == embed when tied
  // PPO's value head (rc_policy_add_value_head): a linear layer hidden → 1
  // on the final-norm hidden states, "value_head.weight" [1, H] and
  // "value_head.bias" [1]; -1 when the policy has none.
  int value_w = -1, value_b = -1;
  torch::Tensor inv_freq;                   // [head_dim/2] float32 on device
  bool trainable = true;
  // Activation checkpointing per decoder layer in the forward passes that
  // backpropagate (rc_policy_set_checkpointing).
  bool checkpoint_layers = false;
  // CUDA-graph decoding (rc_policy_set_cuda_graphs; recal_decode.cc): on
  // unless turned off or a capture failed (graph_error says why).
  bool cuda_graphs = true;
  // RC_KERNEL_* flags (rc_policy_set_kernels).
  int32_t kernels = RC_KERNELS_DEFAULT;
  int64_t graph_captures = 0, graph_replays = 0;
  std::string graph_error;

  // Gradient sums in float32, one per parameter (undefined: none yet), for
  // every dtype. Autograd leaves each backward call's gradients in .grad (in
  // the parameter dtype); flush_grads adds them here and clears .grad, so
  // micro-batches accumulate in float32 even for bfloat16 policies. The
  // optimizer (and anything that reduces gradients) reads these, not .grad.
  std::vector<torch::Tensor> grad32;
  // The output head's weight gradient of the backward call under way
  // (float32), kept apart from grad32 until flush_grads: a call's gradient
  // is summed whole, then added to the sums, so accumulating micro-batches
  // adds exactly what data-parallel ranks each holding one would all-reduce.
  torch::Tensor head_grad;
  // Whether every gradient sum is known to hold +0 only (bucketed sums just
  // zeroed, before the next backward's flush). A backward that starts from
  // such sums adds its output head's gradient into the sums directly
  // instead of into a head_grad of its own: +0 + x is x, bit for bit.
  bool sums_zero = false;

  // AdamW state, created on the first step.
  int64_t step = 0;
  std::vector<torch::Tensor> exp_avg, exp_avg_sq, master;
  std::vector<std::string> state_names;
  std::vector<const char*> state_name_ptrs;

  int add(const std::string& name, std::vector<int64_t> shape) {
    auto opts = torch::TensorOptions().dtype(dtype).device(device);
    params.push_back(torch::zeros(shape, opts));
    names.push_back(name);
    index[name] = static_cast<int>(params.size()) - 1;
    return static_cast<int>(params.size()) - 1;
  }

  const torch::Tensor& P(int i) const { return params[i]; }

  // Gradient buckets (bucket_grads, for the data-parallel all-reduce):
  // flat float32 buffers that hold the gradient sums, grad32[i] a view of
  // one, kept across steps and zeroed after each (never freed), so the
  // all-reduce runs on them in place, with no copy. On the CPU they are
  // zeroed by giving their pages back (zero_release): between a step and
  // the next backward (the rollout, the KL reference's scoring) they hold
  // no memory. For a float32 policy the parameters' .grad are other views
  // of the same memory, so autograd adds each backward's whole gradient
  // into the sums itself (the output head's weight, whose gradient partly
  // comes from outside autograd, keeps a .grad of its own and is added by
  // flush_grads). Empty: each sum is a tensor of its own, created on first
  // use.
  std::vector<torch::Tensor> buckets;
  std::vector<std::pair<size_t, size_t>> bucket_spans;  // parameter range [first, last) of each bucket
  size_t bucketed_params = 0;                            // parameters 0..bucketed_params-1 are in buckets

  // ZeRO-1 (shard_optimizer): with shard_world > 1 this rank holds the
  // AdamW moments (and master weights) of its share of every parameter's
  // elements only, own_lo[i]..own_hi[i], and updates only those; the
  // ranks then all-gather the parameters (rc_dist_gather_params). Rank r's
  // share of a parameter is the r-th of world nearly equal parts of its
  // elements, cut at multiples of kShardAlign (the last rank's ends with
  // the parameter): every rank holds about 1/world of every parameter, the
  // largest (a large vocabulary's embedding) included, and an elementwise
  // update of a share runs the same vector and scalar loops on each
  // element as one of the whole tensor.
  static constexpr int64_t kShardAlign = 64;
  int64_t shard_rank = 0, shard_world = 1;
  std::vector<int64_t> own_lo, own_hi;
  // The whole optimizer state gathered on this rank while a checkpoint is
  // written (rc_dist_gather_state): CPU float32, indexed like state_names.
  std::vector<torch::Tensor> gathered;

  bool sharded() const { return shard_world > 1; }

  // The element range [lo, hi) of parameter i that rank r owns among world.
  std::pair<int64_t, int64_t> share(size_t i, int64_t r, int64_t world) const {
    int64_t n = params[i].numel();
    auto cut = [&](int64_t k) { return k == world ? n : n / kShardAlign * k / world * kShardAlign; };
    return {cut(r), cut(r + 1)};
  }

  // ZeRO-2 (rc_dist_shard_gradients, on the CPU): the gradient sums are
  // also sharded. An update's last backward on this rank (armed by
  // rc_dist_reduce_in_backward) all-reduces each bucket as soon as every
  // gradient in it is complete (with checkpointed layers: after the
  // backward of the lowest layer it holds; the embedding's, the output
  // head's and the final norm's at the end), rc_dist_allreduce_grads the
  // rest; each reduced bucket's parameters then get their gradient
  // norm's terms (norm_terms: what rc_policy_step would compute from the
  // whole sum) and the bucket gives back the pages that hold none of this
  // rank's shares. The step reads this rank's shares and the terms only.
  // Every rank reduces the buckets in the same order (bucket_order), the
  // same all-reduce of the same bucket ZeRO-1 runs: the same bits.
  rc_dist* grad_group = nullptr;  // the group of rc_dist_shard_gradients; null: whole sums
  std::vector<int64_t> bucket_ready;  // per bucket: the layer whose backward completes it (-1: the end)
  std::vector<size_t> bucket_order;   // the order the buckets are reduced in (ready layer, then index, descending)
  size_t buckets_reduced = 0;         // bucket_order's first buckets_reduced are reduced (or in flight)
  // Called by CheckpointedLayer's backward after layer l's while the
  // backward under way is armed (recal_dist.cc); empty otherwise.
  std::function<void(int64_t l)> after_layer;
  // Per parameter: its reduced gradient's squared sums, slice by slice
  // (grad_norm_terms); empty unless the sums are sharded this step.
  std::vector<std::vector<torch::Tensor>> norm_terms;
  bool grads_sharded() const { return grad_group != nullptr && !norm_terms.empty(); }

  // Whether parameter i's .grad is a view of its bucket (see buckets).
  bool grad_is_view(size_t i) const {
    return !buckets.empty() && i < bucketed_params && dtype == torch::kFloat32 && (int)i != lm_head;
  }

  // The float32 gradient sum of parameter i, created zero-filled when absent;
  // adding into it accumulates.
  torch::Tensor grad_acc(size_t i) {
    if (grad32.size() != params.size()) grad32.resize(params.size());
    if (!grad32[i].defined())
      grad32[i] = torch::zeros(params[i].sizes(), torch::TensorOptions().dtype(torch::kFloat32).device(device));
    return grad32[i];
  }

  // The float32 gradient sum of parameter i, undefined when it has none.
  torch::Tensor grad(size_t i) const { return i < grad32.size() ? grad32[i] : torch::Tensor(); }

  // Where this backward call's output head gradient goes (head in
  // recal_train.cc): the sum itself when it is known to be zero (the first
  // micro-batch after a step with bucketed sums), else a new head_grad that
  // flush_grads adds whole.
  torch::Tensor head_grad_target() {
    if (sums_zero && grad(lm_head).defined()) {
      head_grad = torch::Tensor();
      return grad32[lm_head];
    }
    head_grad = torch::zeros(params[lm_head].sizes(), torch::TensorOptions().dtype(torch::kFloat32).device(device));
    return head_grad;
  }

  // The float32 tensor to which the embedding's backward adds this call's
  // gradient rows directly (Embedding in recal_model.cc), in place of
  // autograd's dense [vocab, hidden] gradient that would be added whole;
  // undefined where only that gives the same bits. Tied weights: the call's
  // head gradient (head_grad, or the sum it went into), to which flush_grads
  // would add the dense gradient. An untied embedding: its sum while that is
  // zero and is its .grad (a bucket view). Each untouched row would gain
  // +0, which changes none of these: they start at +0 and only ever gain
  // sums, so none holds -0. CPU only: a GPU's dense embedding backward
  // sums a token's rows in another order, and so may libtorch's bfloat16
  // kernel (torch 2.11's does, 1.13's did not): float32 only.
  torch::Tensor embed_grad_target() const {
    if (!device.is_cpu() || dtype != torch::kFloat32) return {};
    if (embed == lm_head) {
      if (head_grad.defined()) return head_grad;
      return sums_zero ? grad(lm_head) : torch::Tensor();
    }
    return sums_zero && grad_is_view(embed) ? grad(embed) : torch::Tensor();
  }

  // Puts the gradient sums into buckets of about bucket_bytes (at least one
  // parameter each), keeping their values; a no-op when they are already
  // bucketed for the current parameters. Bucket by bucket: each old sum is
  // freed once copied, so the copy costs one bucket of memory, not a
  // second set of sums.
  void bucket_grads(int64_t bucket_bytes) {
    torch::NoGradGuard ng;
    if (!buckets.empty() && bucketed_params == params.size()) return;
    unbucket_grads();
    std::vector<torch::Tensor> old = std::move(grad32);
    old.resize(params.size());
    grad32.assign(params.size(), torch::Tensor());
    int64_t cap = std::max<int64_t>(1, bucket_bytes / 4);
    auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(device);
    auto fill = [&](size_t b) {
      int64_t off = 0;
      for (size_t i = bucket_spans[b].first; i < bucket_spans[b].second; i++) {
        auto n = params[i].numel();
        grad32[i] = buckets[b].narrow(0, off, n).view(params[i].sizes());
        if (old[i].defined()) grad32[i].copy_(old[i]);
        old[i] = torch::Tensor();  // the only reference left: freed here
        if (grad_is_view(i) && params[i].requires_grad()) {
          auto& g = params[i].mutable_grad();
          // A pending .grad (a backward not yet flushed) joins the sum first.
          if (g.defined()) grad32[i].add_(g);
          // Another view object: autograd adds into it in place.
          g = buckets[b].narrow(0, off, n).view(params[i].sizes());
        }
        off += n;
      }
    };
    // Made before any backward (rc_policy_prepare_update, or an all-reduce
    // with no gradient yet), the buckets hold zeros only.
    bool zero = !head_grad.defined();
    for (size_t i = 0; i < params.size(); i++) zero = zero && !old[i].defined() && !params[i].grad().defined();
    sums_zero = false;
    bucketed_params = params.size();  // grad_is_view holds for the parameters filled so far
    size_t first = 0;
    int64_t n = 0;
    for (size_t i = 0; i < params.size(); i++) {
      n += params[i].numel();
      if (n >= cap || i + 1 == params.size()) {
        // Zeroed by zero_release: on the CPU no page is touched until a
        // sum is copied in or a backward adds into it.
        buckets.push_back(torch::empty({n}, opts));
        zero_release(buckets.back());
        bucket_spans.emplace_back(first, i + 1);
        first = i + 1;
        n = 0;
        fill(buckets.size() - 1);
      }
    }
    sums_zero = zero;
  }

  // The whole pages inside the bytes [b, e): [lo, hi), none when hi <= lo.
  static std::pair<uintptr_t, uintptr_t> inner_pages(uintptr_t b, uintptr_t e) {
    auto pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    return {(b + pg - 1) / pg * pg, e / pg * pg};
  }

  // Zeroes a contiguous CPU tensor by handing its whole pages back to the
  // kernel (madvise MADV_DONTNEED: the CPU allocator's memory is private
  // and anonymous, so a page given back reads as zeros when next touched,
  // and holds no memory until then) and writing zeros to the partial pages
  // at its ends; any other tensor, or a refused madvise, by zero_().
  static void zero_release(torch::Tensor& t) {
    if (!t.device().is_cpu() || !t.is_contiguous()) {
      t.zero_();
      return;
    }
    auto b = (uintptr_t)t.data_ptr(), e = b + t.nbytes();
    auto [lo, hi] = inner_pages(b, e);
    if (hi <= lo || madvise((void*)lo, hi - lo, MADV_DONTNEED) != 0) {
      t.zero_();
      return;
    }
    std::memset((void*)b, 0, lo - b);
    std::memset((void*)hi, 0, e - hi);
  }

  // Drops the buckets; the sums become tensors of their own again.
  void unbucket_grads() {
    if (buckets.empty()) return;
    for (size_t i = 0; i < params.size(); i++) {
      if (grad_is_view(i)) params[i].mutable_grad() = torch::Tensor();
      if (i < grad32.size() && grad32[i].defined()) grad32[i] = grad32[i].clone();
    }
    buckets.clear();
    bucket_spans.clear();
    bucketed_params = 0;
    sums_zero = false;
  }

  // Moves the gradients autograd left in .grad into the float32 sums (for
  // bucketed float32 parameters autograd already added them there).
  void flush_grads() {
    torch::NoGradGuard ng;
    if (grad32.size() != params.size()) grad32.resize(params.size());
    for (size_t i = 0; i < params.size(); i++) flush_grad(i);
    head_grad = torch::Tensor();
    sums_zero = false;
  }

  // flush_grads for parameter i alone (the output head's weight with its
  // head_grad): a ZeRO-2 backward flushes a layer's parameters as soon as
  // the layer is done (recal_dist.cc), with the same additions.
  void flush_grad(size_t i) {
    auto& t = params[i];
    if (grad_is_view(i)) return;
    torch::Tensor g;
    if (t.grad().defined()) g = t.grad().to(torch::kFloat32);  // float32 .grad: the same tensor, no copy
    if ((int)i == lm_head && head_grad.defined()) {
      g = g.defined() ? head_grad.add_(g) : head_grad;
      head_grad = torch::Tensor();
    }
    if (!g.defined()) return;
    if (grad32[i].defined())
      grad32[i].add_(g);
    else
      grad32[i] = g;
    t.mutable_grad() = torch::Tensor();
  }

  // Drops every gradient (bucketed sums are zeroed in place).
  void clear_grads() {
    torch::NoGradGuard ng;
    if (!buckets.empty()) {
      for (auto& b : buckets) zero_release(b);
      for (size_t i = 0; i < params.size(); i++) {
        if (!grad_is_view(i)) params[i].mutable_grad() = torch::Tensor();
        // Parameters added since the buckets were made have sums of their own.
        if (i >= bucketed_params && i < grad32.size()) grad32[i] = torch::Tensor();
      }
      sums_zero = true;
    } else {
      for (auto& t : params) t.mutable_grad() = torch::Tensor();
      grad32.clear();
      sums_zero = false;
    }
    head_grad = torch::Tensor();
    norm_terms.clear();
    buckets_reduced = 0;
  }

  torch::Tensor find_tensor(const std::string& name) {
    auto it = index.find(name);
    if (it != index.end()) return params[it->second];
    if (name.rfind("grad/", 0) == 0) {  // read-only view of a parameter's gradient
      auto g = index.find(name.substr(5));
      if (g != index.end()) {
        auto gs = grad(g->second);
        return gs.defined() ? gs : torch::zeros_like(params[g->second]);
      }
    }
    for (size_t i = 0; i < state_names.size(); i++) {
      if (state_names[i] != name) continue;
      if (!gathered.empty()) return gathered[i];
      if (sharded())
        recal::fail("optimizer tensor \"" + name + "\": the state is sharded over " + std::to_string(shard_world) +
                    " ranks; gather it first (rc_dist_gather_state)");
      size_t n = params.size();
      if (i < n) return exp_avg[i];
      if (i < 2 * n) return exp_avg_sq[i - n];
      return master[i - 2 * n];
    }
    recal::fail("no tensor named \"" + name + "\"");
  }
};

namespace recal {
// A KV cache's captured CUDA-graph decode steps (recal_decode.cc).
struct DecodeGraphs;
void free_graphs(DecodeGraphs* g);
struct GraphsDeleter {
  void operator()(DecodeGraphs* g) const { free_graphs(g); }
};
}  // namespace recal

// A KV cache of a policy: rows of up to capacity positions.
struct rc_cache {
  rc_policy* p = nullptr;
  int64_t rows = 0, capacity = 0;
  // Per layer [rows, kv_heads, columns, head_dim] with columns = capacity on
  // the CPU; on a GPU a multiple of 64 above capacity, the last column a
  // scratch slot that padded rows of a CUDA-graph step write to. A head's
  // keys of a row are one matrix, so the rows of a step feed attention's
  // batched matrix products as a view (or one gather), not a copy per step.
  std::vector<torch::Tensor> k, v;
  std::vector<int64_t> len;  // valid tokens per row
  // Graph decode steps captured on this cache's tensors (CUDA only; freed
  // before the tensors they read).
  std::unique_ptr<recal::DecodeGraphs, recal::GraphsDeleter> graphs;
};

namespace recal {

inline uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// The uniform in [0, 1) with which a row samples its next token: drawn from
// (seed, the row's global index, the row's length), so that it does not
// depend on which other rows share the call, nor on the number of ranks.
inline float row_uniform(uint64_t seed, uint64_t global_row, int64_t len) {
  uint64_t z = splitmix64(seed ^ splitmix64(global_row * 0x9E3779B97F4A7C15ULL + (uint64_t)len));
  return (float)((double)(z >> 11) * (1.0 / 9007199254740992.0));
}

// The pieces of a decoder layer (recal_model.cc), shared by the full
// forward pass and decoding (recal_decode.cc).
// RMSNorm of x [..., H] by weight w, computed in float32.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps);
// cos and sin for integer positions pos (any shape), shape pos.shape + [head_dim].
std::pair<torch::Tensor, torch::Tensor> rope(const rc_policy& p, const torch::Tensor& pos);
// Projects h [n, L, H] to rotated q [n, L, heads, hd] and k, v [n, L, kv, hd].
void qkv(const rc_policy& p, const Layer& ly, const torch::Tensor& h, const torch::Tensor& cos,
         const torch::Tensor& sin, torch::Tensor& q, torch::Tensor& k, torch::Tensor& v);
// Grouped-query attention of q [n, L, heads, hd] over k, v [n, T, kv, hd]
// under an additive mask (undefined: see recal_model.cc); [n, L, heads*hd].
torch::Tensor attend(const rc_policy& p, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                     const torch::Tensor& mask);
// The gated MLP of layer ly on h [n, L, H].
torch::Tensor mlp(const rc_policy& p, const Layer& ly, const torch::Tensor& h);
#ifdef RECAL_SDPA
// Whether attention over L > 1 queries on a GPU runs by matrix products
// rather than the fused kernel (RC_KERNEL_F32_PREFILL_MATMUL).
bool prefill_by_matmul(const rc_policy& p, int64_t L);
#endif

// Shared by the bridge's files (recal_model.cc defines the first six,
// recal_train.cc the rest).
torch::ScalarType scalar_type(int32_t dt);
std::string shape_str(torch::IntArrayRef s);
// Full causal forward of right-padded tokens [B, T]; returns the final-norm
// hidden states [B, T, H].
torch::Tensor forward_full(const rc_policy& p, const torch::Tensor& tokens);
// A copy of host data as a tensor on the policy's device.
torch::Tensor device_tensor(const rc_policy& p, const void* data, std::vector<int64_t> shape, torch::ScalarType st);
// The flat indices into [B*T] of the positions that predict a next token.
torch::Tensor scored_positions(const rc_policy& p, int64_t B, int64_t T, const int64_t* lengths, const float* mask);
// Fails on a token id outside the vocabulary.
void check_tokens(const rc_policy& p, int64_t n, const int32_t* tokens);
// Freezes or unfreezes the parameters (freezing drops gradients and state).
void set_trainable(rc_policy& p, bool on);
// Creates the optimizer state of the parameters that have none yet.
void extend_optimizer(rc_policy& p);
// Creates the optimizer state when there is none.
void ensure_optimizer(rc_policy& p);
// Makes the policy hold rank's share of the optimizer state among world.
void shard_optimizer(rc_policy& p, int64_t rank, int64_t world);
// The most elements of a parameter rc_policy_step updates at once: a larger
// one (a large vocabulary's embedding) is updated slice by slice.
constexpr int64_t kStepSlice = (int64_t)1 << 22;
// The squared sums of g's slices of kStepSlice elements (g's whole for a
// smaller g): added in order, the squared norm rc_policy_step clips by.
std::vector<torch::Tensor> grad_norm_terms(const torch::Tensor& g);
// ZeRO-2: forgets p's sharded gradients' group (rc_policy_free;
// recal_dist.cc).
void forget_grad_group(rc_policy* p);

// Whether extend_rows can decode for this policy: float32 on the CPU.
bool rows_supported(const rc_policy& p);

// rc_cache_extend's work for a policy rows_supported accepts, by the
// kernels of recal_rows.cc: a row's logits, sample and log-prob do not
// depend on the other rows of the call, the BLAS or the thread count.
// Arguments as rc_cache_extend's, already validated.
void extend_rows(rc_cache& c, int64_t n, const int64_t* rows, int64_t width, const int32_t* tokens,
                 const int64_t* counts, const rc_sample_opts* so, uint64_t gen_seed, int32_t* out_tokens,
                 float* out_logp, float* out_logits);

}  // namespace recal

#endif  // RECAL_INTERNAL_H
