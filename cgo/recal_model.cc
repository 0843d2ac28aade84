// recal_model.cc — the policy: a Qwen2-architecture decoder, its layout
// and creation, the pieces of a layer (shared with recal_decode.cc's
// decoding), and the full causal forward pass the training side runs; the
// process-wide settings (threads, BLAS, device memory). Every entry point
// Go calls is in the extern "C" block at the end; each catches every C++
// exception and reports it through its own err out-parameter (recal.h).

#include "recal_internal.h"

#include <torch/torch.h>
#include <torch/version.h>

#ifdef RECAL_CUDA
// CUDA builds (the Makefile defines RECAL_CUDA when libtorch has CUDA and
// CUDA's headers are found): the allocator's counters here, CUDA-graph
// decoding in recal_decode.cc, the same headers in both; recal_internal.h
// defines RECAL_SDPA (fused attention) for libtorch 2 and later.
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <dlfcn.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

using torch::Tensor;
using namespace recal;

namespace {

Tensor rotate_half(const Tensor& x) {
  auto half = x.size(-1) / 2;
  auto x1 = x.narrow(-1, 0, half);
  auto x2 = x.narrow(-1, half, half);
  return torch::cat({-x2, x1}, -1);
}

// Set on the calling thread while forward_full runs a pass that
// backpropagates, so that its checkpointed layers' forwards (autograd runs
// them with gradients off) keep the arithmetic their recomputation in the
// backward repeats.
thread_local bool tl_training = false;

struct TrainingPass {
  bool prev;
  explicit TrainingPass(bool on) : prev(tl_training) { tl_training = prev || on; }
  ~TrainingPass() { tl_training = prev; }
};

// A forward pass nothing backpropagates through: decoding, scoring, the KL
// reference. Only these take the RC_KERNEL_* choices.
bool inference_pass() { return !torch::GradMode::is_enabled() && !tl_training; }

// Whether a forward pass runs the fused projections (RC_KERNEL_FUSED_PROJ):
// the layout has them and this is an inference pass (the fused tensors are
// not the parameters autograd tracks).
bool fused_proj(const rc_policy& p, const Layer& ly) {
  return (p.kernels & RC_KERNEL_FUSED_PROJ) && ly.qkv_w.defined() && inference_pass();
}

}  // namespace

namespace recal {

Tensor rms_norm(const Tensor& x, const Tensor& w, double eps) {
  auto xf = x.to(torch::kFloat32);
  auto var = xf.pow(2).mean(-1, true);
  xf = xf * torch::rsqrt(var + eps);
  return w * xf.to(x.scalar_type());
}

// cos and sin for integer positions pos (any shape), shape pos.shape + [head_dim].
std::pair<Tensor, Tensor> rope(const rc_policy& p, const Tensor& pos) {
  auto freqs = pos.to(torch::kFloat32).unsqueeze(-1) * p.inv_freq;
  auto emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos().to(p.dtype), emb.sin().to(p.dtype)};
}

// Projects h [n, L, H] to rotated q [n, L, heads, hd] and k, v [n, L, kv, hd].
void qkv(const rc_policy& p, const Layer& ly, const Tensor& h, const Tensor& cos, const Tensor& sin, Tensor& q,
         Tensor& k, Tensor& v) {
  const auto& c = p.cfg;
  auto n = h.size(0), L = h.size(1);
  if (fused_proj(p, ly)) {
    // One product for q, k and v, and one rotary pass over q and k (each
    // element's arithmetic that of the separate passes below).
    auto heads = c.num_attention_heads, kvh = c.num_key_value_heads, hd = c.head_dim;
    auto y = torch::linear(h, ly.qkv_w, ly.qkv_b);  // [n, L, (heads + 2 kv) * hd]
    auto qk = y.narrow(-1, 0, (heads + kvh) * hd).view({n, L, heads + kvh, hd});
    qk = qk * cos.unsqueeze(2) + rotate_half(qk) * sin.unsqueeze(2);
    q = qk.narrow(2, 0, heads);
    k = qk.narrow(2, heads, kvh);
    v = y.narrow(-1, (heads + kvh) * hd, kvh * hd).view({n, L, kvh, hd});
    return;
  }
  q = torch::linear(h, p.P(ly.q_w), p.P(ly.q_b)).view({n, L, c.num_attention_heads, c.head_dim});
  k = torch::linear(h, p.P(ly.k_w), p.P(ly.k_b)).view({n, L, c.num_key_value_heads, c.head_dim});
  v = torch::linear(h, p.P(ly.v_w), p.P(ly.v_b)).view({n, L, c.num_key_value_heads, c.head_dim});
  auto c4 = cos.unsqueeze(2), s4 = sin.unsqueeze(2);  // [n|1, L, 1, hd]
  q = q * c4 + rotate_half(q) * s4;
  k = k * c4 + rotate_half(k) * s4;
}

#ifdef RECAL_SDPA
// Whether attention over L > 1 queries on a GPU runs by matrix products
// rather than the fused kernel: a float32 pass that does not backpropagate
// (a prefill, scoring) with RC_KERNEL_F32_PREFILL_MATMUL. Its mask is then
// explicit (an undefined one means no mask, not causal).
bool prefill_by_matmul(const rc_policy& p, int64_t L) {
  return L > 1 && p.dtype == torch::kFloat32 && (p.kernels & RC_KERNEL_F32_PREFILL_MATMUL) && inference_pass();
}
#endif

// Grouped-query attention. q [n, L, heads, hd]; k, v [n, T, kv, hd];
// mask additive float32 broadcastable to [n, kv, group, L, T], or undefined:
// then every query sees every key, except that on a GPU with fused
// attention (RECAL_SDPA) an undefined mask with L == T > 1 means causal
// (forward_full's training forward).
// Returns [n, L, heads*hd].
Tensor attend(const rc_policy& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask) {
  const auto& c = p.cfg;
  auto n = q.size(0), L = q.size(1), T = k.size(1);
  auto kv = c.num_key_value_heads, g = c.num_attention_heads / kv, hd = c.head_dim;
#ifdef RECAL_SDPA
  if (p.device.is_cuda() && !prefill_by_matmul(p, L)) {
    if (!mask.defined() && L == T && L > 1) {
      // Causal self-attention of a whole sequence: each query head gets its
      // kv head's keys (an expanded copy), so that the flash kernel's
      // causal form applies.
      auto kh = k.permute({0, 2, 1, 3}).unsqueeze(2).expand({n, kv, g, T, hd}).reshape({n, kv * g, T, hd});
      auto vh = v.permute({0, 2, 1, 3}).unsqueeze(2).expand({n, kv, g, T, hd}).reshape({n, kv * g, T, hd});
      auto out = at::scaled_dot_product_attention(q.transpose(1, 2), kh, vh, {}, 0.0, /*is_causal=*/true);
      return out.transpose(1, 2).reshape({n, L, kv * g * hd});
    }
    // The g query heads of a kv head folded into the query dimension, as
    // below; the mask repeated for each of them.
    auto qh = q.view({n, L, kv, g, hd}).permute({0, 2, 3, 1, 4}).reshape({n, kv, g * L, hd});
    c10::optional<Tensor> m;
    if (mask.defined()) {
      auto m5 = mask.dim() == 2 ? mask.view({1, 1, 1, L, T}) : mask.view({mask.size(0), 1, 1, L, T});
      m = m5.expand({m5.size(0), 1, g, L, T}).reshape({m5.size(0), 1, g * L, T}).to(q.scalar_type());
    }
    auto out = at::scaled_dot_product_attention(qh, k.permute({0, 2, 1, 3}), v.permute({0, 2, 1, 3}), m);
    return out.view({n, kv, g, L, hd}).permute({0, 3, 1, 2, 4}).reshape({n, L, kv * g * hd});
  }
#endif
  // The g query heads of a kv head are folded into the query dimension, so
  // K and V are used as they are rather than broadcast (copied) g times.
  auto qh = q.view({n, L, kv, g, hd}).permute({0, 2, 3, 1, 4}).reshape({n, kv, g * L, hd});
  auto kh = k.permute({0, 2, 1, 3});  // [n, kv, T, hd]
  auto vh = v.permute({0, 2, 1, 3});
  auto scores = torch::matmul(qh, kh.transpose(-1, -2)).to(torch::kFloat32);  // [n, kv, g*L, T]
  scores.mul_(1.0 / std::sqrt((double)hd));  // in place: matmul's backward needs its inputs, not its output
  if (mask.defined()) scores.view({n, kv, g, L, T}).add_(mask);
  auto probs = torch::softmax(scores, -1).to(p.dtype);
  auto out = torch::matmul(probs, vh);  // [n, kv, g*L, hd]
  return out.view({n, kv, g, L, hd}).permute({0, 3, 1, 2, 4}).reshape({n, L, kv * g * hd});
}

Tensor mlp(const rc_policy& p, const Layer& ly, const Tensor& h) {
  if (fused_proj(p, ly)) {  // one product for gate and up
    auto I = p.cfg.intermediate_size;
    auto gu = torch::linear(h, ly.gate_up);  // [n, L, 2I]
    auto a = torch::silu(gu.narrow(-1, 0, I));
    a.mul_(gu.narrow(-1, I, I));
    return torch::linear(a, p.P(ly.down));
  }
  auto a = torch::silu(torch::linear(h, p.P(ly.gate))) * torch::linear(h, p.P(ly.up));
  return torch::linear(a, p.P(ly.down));
}

torch::ScalarType scalar_type(int32_t dt) {
  switch (dt) {
    case RC_F32: return torch::kFloat32;
    case RC_BF16: return torch::kBFloat16;
    case RC_F16: return torch::kFloat16;
  }
  fail("unsupported dtype code " + std::to_string(dt));
}

std::string shape_str(torch::IntArrayRef s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); i++) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

// One decoder layer: x [B, T, H] → x + attention(x) + MLP(…).
Tensor decoder_layer(const rc_policy& p, const Layer& ly, const Tensor& x, const Tensor& cos, const Tensor& sin,
                     const Tensor& mask) {
  auto h = rms_norm(x, p.P(ly.in_norm), p.cfg.rms_norm_eps);
  Tensor q, k, v;
  qkv(p, ly, h, cos, sin, q, k, v);
  auto y = x + torch::linear(attend(p, q, k, v, mask), p.P(ly.o_w));
  return y + mlp(p, ly, rms_norm(y, p.P(ly.post_norm), p.cfg.rms_norm_eps));
}

// Activation checkpointing of one decoder layer (torch.utils.checkpoint's
// reentrant form): the forward keeps only the layer's input, not its
// intermediate activations; the backward runs the layer again with autograd
// from that input and backpropagates through it, which leaves the layer's
// parameter gradients in their .grad as the plain backward does. The
// recomputation repeats the forward's arithmetic exactly, so the gradients
// are the plain backward's.
//
// On the CPU the heap's free pages go back to the system after each
// layer's forward and backward (trim_heap). A layer's temporaries (below
// `recal train`'s 32 MiB mmap threshold: all of a 0.5B model's) come from
// the heap, and once freed they stay resident; the heap did not hand the
// same memory to the next layer's, but other free chunks (the best fit
// among the holes earlier phases left), so resident memory grew by about a
// layer's activations per layer: 0.97 GiB in the forward and about as much
// in the backward over Qwen2.5-0.5B's 24 layers (bench/memory, 2 ranks),
// none of it live. Trimmed, each layer pages its temporaries in afresh
// instead, small beside its recomputation.
//
// A Function's tensor arguments must be defined (autograd records each
// one's device): an undefined mask (causal, see attend) travels as an empty
// tensor (no_mask) and is undefined again inside.
struct CheckpointedLayer : torch::autograd::Function<CheckpointedLayer> {
  static Tensor no_mask(const Tensor& mask, const torch::Device& dev) {
    return mask.defined() ? mask : torch::empty({0}, torch::TensorOptions().dtype(torch::kFloat32).device(dev));
  }
  static Tensor from_arg(const Tensor& mask) { return mask.numel() == 0 ? Tensor() : mask; }
  static Tensor forward(torch::autograd::AutogradContext* ctx, Tensor x, const rc_policy* p, int64_t layer,
                        Tensor cos, Tensor sin, Tensor mask) {
    ctx->saved_data["policy"] = reinterpret_cast<int64_t>(p);
    ctx->saved_data["layer"] = layer;
    ctx->save_for_backward({x, cos, sin, mask});
    torch::NoGradGuard ng;
    return decoder_layer(*p, p->layers[layer], x, cos, sin, from_arg(mask));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    auto saved = ctx->get_saved_variables();
    const auto* p = reinterpret_cast<const rc_policy*>(ctx->saved_data["policy"].toInt());
    auto layer = ctx->saved_data["layer"].toInt();
    auto x = saved[0].detach().requires_grad_(true);
    Tensor y;
    {
      torch::AutoGradMode on(true);
      y = decoder_layer(*p, p->layers[layer], x, saved[1], saved[2], from_arg(saved[3]));
    }
    torch::autograd::backward({y}, {grad[0]});
    auto gx = x.grad();
    y = Tensor();  // the layer's recomputed activations, freed
    x = Tensor();
    if (p->device.is_cpu()) trim_heap();
    // The layer's parameter gradients are complete: an armed ZeRO-2
    // backward reduces the buckets they complete (recal_dist.cc).
    if (p->after_layer) p->after_layer(layer);
    return {gx, Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

// The token embedding, whose backward adds the gradient's rows straight to
// rc_policy::embed_grad_target where that gives the bits of autograd's own
// backward (a dense [vocab, hidden] gradient, zero but in the tokens' rows,
// added whole afterwards), so that no such tensor is made; elsewhere it
// returns that dense gradient. Each token's rows are summed in their order
// from zero in the gradient's dtype, by the kernel embedding_dense_backward
// uses, and the sum is added once.
struct Embedding : torch::autograd::Function<Embedding> {
  static Tensor forward(torch::autograd::AutogradContext* ctx, Tensor w, Tensor tokens, const rc_policy* p) {
    ctx->saved_data["policy"] = reinterpret_cast<int64_t>(p);
    ctx->saved_data["rows"] = w.size(0);
    ctx->save_for_backward({tokens});
    return torch::embedding(w, tokens);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    auto tokens = ctx->get_saved_variables()[0];
    const auto* p = reinterpret_cast<const rc_policy*>(ctx->saved_data["policy"].toInt());
    auto target = p->embed_grad_target();
    if (!target.defined())
      return {torch::embedding_backward(grad[0], tokens, ctx->saved_data["rows"].toInt(), -1, false, false), Tensor(),
              Tensor()};
    auto flat = tokens.reshape({-1});
    auto rows = grad[0].reshape({flat.numel(), grad[0].size(-1)});
    auto [ids, slot] = torch::_unique(flat, /*sorted=*/true, /*return_inverse=*/true);
    auto sums = torch::zeros({ids.numel(), rows.size(1)}, rows.options()).index_add_(0, slot, rows);
    target.index_add_(0, ids, sums.to(torch::kFloat32));
    return {Tensor(), Tensor(), Tensor()};
  }
};

// Full causal forward of right-padded tokens [B, T]; returns the final-norm
// hidden states [B, T, H]. Padding sits after each row's valid tokens, so the
// causal mask alone keeps it from influencing valid positions. With
// p.checkpoint_layers and autograd on, each layer is checkpointed
// (CheckpointedLayer): activations of one layer at a time instead of all.
Tensor forward_full(const rc_policy& p, const Tensor& tokens) {
  TrainingPass training(torch::GradMode::is_enabled());
  auto T = tokens.size(1);
  const auto& W = p.P(p.embed);
  auto x = torch::GradMode::is_enabled() && W.requires_grad() ? Embedding::apply(W, tokens, &p)
                                                               : torch::embedding(W, tokens);
  auto pos = torch::arange(T, torch::TensorOptions().dtype(torch::kLong).device(p.device));
  auto [cos, sin] = rope(p, pos);
  cos = cos.unsqueeze(0);
  sin = sin.unsqueeze(0);
  // On a GPU with fused attention an undefined mask is the causal one
  // (attend); elsewhere the mask is explicit.
  Tensor mask;
#ifdef RECAL_SDPA
  bool explicit_mask = !p.device.is_cuda() || prefill_by_matmul(p, T);
#else
  bool explicit_mask = true;
#endif
  if (explicit_mask)
    mask = torch::full({T, T}, -std::numeric_limits<float>::infinity(),
                       torch::TensorOptions().dtype(torch::kFloat32).device(p.device))
               .triu(1);
  bool ckpt = p.checkpoint_layers && torch::GradMode::is_enabled();
  for (size_t l = 0; l < p.layers.size(); l++) {
    x = ckpt ? CheckpointedLayer::apply(x, &p, (int64_t)l, cos, sin, CheckpointedLayer::no_mask(mask, p.device))
             : decoder_layer(p, p.layers[l], x, cos, sin, mask);
    if (ckpt && p.device.is_cpu()) trim_heap();  // see CheckpointedLayer
  }
  return rms_norm(x, p.P(p.norm), p.cfg.rms_norm_eps);
}

Tensor device_tensor(const rc_policy& p, const void* data, std::vector<int64_t> shape, torch::ScalarType st) {
  auto t = torch::from_blob(const_cast<void*>(data), shape, torch::TensorOptions().dtype(st));
  return t.to(p.device, /*non_blocking=*/false, /*copy=*/true);
}

// The positions that predict a next token: (b, t) with t < lengths[b]-1 and,
// when mask is given, mask[b, t] > 0. Returns flat indices into [B*T].
Tensor scored_positions(const rc_policy& p, int64_t B, int64_t T, const int64_t* lengths, const float* mask) {
  std::vector<int64_t> idx;
  for (int64_t b = 0; b < B; b++) {
    if (lengths[b] < 0 || lengths[b] > T) fail("row " + std::to_string(b) + ": length " + std::to_string(lengths[b]) + " outside [0, " + std::to_string(T) + "]");
    for (int64_t t = 0; t + 1 < lengths[b]; t++)
      if (!mask || mask[b * T + t] > 0) idx.push_back(b * T + t);
  }
  return torch::tensor(idx, torch::kLong).to(p.device);
}

void check_tokens(const rc_policy& p, int64_t n, const int32_t* tokens) {
  for (int64_t i = 0; i < n; i++)
    if (tokens[i] < 0 || tokens[i] >= p.cfg.vocab_size)
      fail("token id " + std::to_string(tokens[i]) + " outside the vocabulary [0, " + std::to_string(p.cfg.vocab_size) + ")");
}

// libtorch 1.13 sets OpenMP's and MKL's thread counts but not OpenBLAS's,
// whose own pool starts one thread per core: ranks that share a machine would
// each run as many BLAS threads as there are cores. OpenBLAS, when it is the
// BLAS libtorch was linked to, gets the calling thread's count; other BLAS
// libraries lack the symbol and are left alone.
void sync_blas_threads() {
  using set_fn = void (*)(int);
  using get_fn = int (*)();
  static const auto set = reinterpret_cast<set_fn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  static const auto get = reinterpret_cast<get_fn>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  if (!set) return;
  int n = at::get_num_threads();
  if (!get || get() != n) set(n);
}

// The fused layout: each layer's q, k and v weights (and biases) become row
// ranges of one tensor, and its gate and up weights of another (Layer), the
// parameters views of them, so that an inference pass runs one product
// where it ran three or two (qkv, mlp), with no second copy of the weights.
// The values, requires_grad and any pending .grad carry over; checkpoints
// still name and hold each parameter apart.
void fuse_layout(rc_policy& p) {
  torch::NoGradGuard ng;
  auto group = [&](std::initializer_list<int> idx, Tensor& base) {
    std::vector<Tensor> parts;
    for (int i : idx) parts.push_back(p.params[i].detach());
    base = torch::cat(parts, 0);
    int64_t off = 0;
    for (int i : idx) {
      auto& old = p.params[i];
      auto rows = old.size(0);
      auto view = base.narrow(0, off, rows);
      off += rows;
      Tensor grad = old.grad();
      bool rg = old.requires_grad();
      old = view;
      if (rg) old.requires_grad_(true);
      if (grad.defined()) old.mutable_grad() = grad;
    }
  };
  for (auto& ly : p.layers) {
    if (ly.qkv_w.defined()) continue;
    group({ly.q_w, ly.k_w, ly.v_w}, ly.qkv_w);
    group({ly.q_b, ly.k_b, ly.v_b}, ly.qkv_b);
    group({ly.gate, ly.up}, ly.gate_up);
  }
}

}  // namespace recal

extern "C" {

int rc_policy_set_kernels(rc_policy* p, int32_t flags, char** err) {
  return guarded(err, [&] {
    if (flags & ~RC_KERNELS_DEFAULT) fail("kernels: unknown flags " + std::to_string(flags & ~RC_KERNELS_DEFAULT));
    if ((flags & RC_KERNEL_FUSED_PROJ) && !p->layers.empty() && !p->layers[0].qkv_w.defined()) fuse_layout(*p);
    p->kernels = flags;
  });
}

int rc_release_memory(char** err) { return guarded(err, [&] { trim_heap(); }); }

int rc_set_threads(int32_t n, char** err) {
  return guarded(err, [&] {
    if (n <= 0) return;
    torch::set_num_threads(n);
    recal::sync_blas_threads();
  });
}

int rc_get_threads(int32_t* out, char** err) {
  return guarded(err, [&] { *out = static_cast<int32_t>(torch::get_num_threads()); });
}

int rc_blas_kernel(char* core, int32_t core_cap, char* config, int32_t config_cap, char** err) {
  return guarded(err, [&] {
    using name_fn = char* (*)();
    auto copy = [](name_fn f, char* out, int32_t cap) {
      if (cap <= 0) return;
      out[0] = 0;
      if (!f) return;
      const char* s = f();
      if (s) snprintf(out, static_cast<size_t>(cap), "%s", s);
    };
    copy(reinterpret_cast<name_fn>(dlsym(RTLD_DEFAULT, "openblas_get_corename")), core, core_cap);
    copy(reinterpret_cast<name_fn>(dlsym(RTLD_DEFAULT, "openblas_get_config")), config, config_cap);
  });
}

int rc_cuda_available(int32_t* out, char** err) {
  return guarded(err, [&] { *out = torch::cuda::is_available() ? 1 : 0; });
}

int rc_policy_new(const rc_config* cfg, const char* device, int32_t dtype, rc_policy** out, char** err) {
  return guarded(err, [&] {
    auto p = std::make_unique<rc_policy>();
    p->cfg = *cfg;
    const auto& c = p->cfg;
    if (c.vocab_size <= 0 || c.hidden_size <= 0 || c.intermediate_size <= 0 || c.num_hidden_layers <= 0 ||
        c.num_attention_heads <= 0 || c.num_key_value_heads <= 0 || c.head_dim <= 0)
      fail("config: sizes must be positive");
    if (c.num_attention_heads % c.num_key_value_heads != 0)
      fail("config: num_attention_heads must be a multiple of num_key_value_heads");
    if (c.head_dim % 2 != 0) fail("config: head_dim must be even for rotary embeddings");
    p->device = torch::Device(std::string(device));
    if (p->device.is_cuda() && !torch::cuda::is_available())
      fail("device \"" + std::string(device) + "\": the linked libtorch has no CUDA support or no GPU is visible (see LIBTORCH in docs/install.md)");
    p->dtype = scalar_type(dtype);
    if (p->dtype == torch::kFloat16) fail("dtype float16 is not supported for the policy; use float32 or bfloat16");
    torch::NoGradGuard ng;
    auto H = c.hidden_size, I = c.intermediate_size, qd = c.num_attention_heads * c.head_dim,
         kd = c.num_key_value_heads * c.head_dim;
    p->embed = p->add("model.embed_tokens.weight", {c.vocab_size, H});
    for (int64_t i = 0; i < c.num_hidden_layers; i++) {
      auto pre = "model.layers." + std::to_string(i) + ".";
      Layer ly{};
      ly.in_norm = p->add(pre + "input_layernorm.weight", {H});
      ly.q_w = p->add(pre + "self_attn.q_proj.weight", {qd, H});
      ly.q_b = p->add(pre + "self_attn.q_proj.bias", {qd});
      ly.k_w = p->add(pre + "self_attn.k_proj.weight", {kd, H});
      ly.k_b = p->add(pre + "self_attn.k_proj.bias", {kd});
      ly.v_w = p->add(pre + "self_attn.v_proj.weight", {kd, H});
      ly.v_b = p->add(pre + "self_attn.v_proj.bias", {kd});
      ly.o_w = p->add(pre + "self_attn.o_proj.weight", {H, qd});
      ly.post_norm = p->add(pre + "post_attention_layernorm.weight", {H});
      ly.gate = p->add(pre + "mlp.gate_proj.weight", {I, H});
      ly.up = p->add(pre + "mlp.up_proj.weight", {I, H});
      ly.down = p->add(pre + "mlp.down_proj.weight", {H, I});
      p->layers.push_back(ly);
    }
    p->norm = p->add("model.norm.weight", {H});
    p->lm_head = c.tie_word_embeddings ? p->embed : p->add("lm_head.weight", {c.vocab_size, H});
    auto ar = torch::arange(0, c.head_dim, 2, torch::TensorOptions().dtype(torch::kFloat64));
    p->inv_freq = (1.0 / torch::pow(c.rope_theta, ar / (double)c.head_dim)).to(torch::kFloat32).to(p->device);
    // On a GPU the fused layout from the start (elsewhere rc_policy_set_kernels
    // makes it on request: the CPU's float32 decoding runs recal_rows.cc's
    // kernels on the parameters as they are).
    if (p->device.is_cuda()) fuse_layout(*p);
    set_trainable(*p, true);
    *out = p.release();
  });
}

void rc_policy_free(rc_policy* p) {
  if (!p) return;
  forget_grad_group(p);
  delete p;
  // The policy's tensors below the mmap threshold (UseTrainingMalloc: 32
  // MiB, every weight of a 0.5B model but the embedding) were freed into
  // the heap, which keeps them (the trim threshold is 16 GiB); hand their
  // pages back, so that a policy loaded and freed each step (the KL
  // reference under policy.reload_reference) leaves no resident holes.
  trim_heap();
}

int rc_policy_set_checkpointing(rc_policy* p, int32_t on, char** err) {
  return guarded(err, [&] { p->checkpoint_layers = on != 0; });
}
int rc_device_memory(const char* device, int32_t reset_peak, int64_t* out, char** err) {
  return guarded(err, [&] {
    torch::Device d{std::string(device)};
    if (!d.is_cuda()) fail("device memory: \"" + std::string(device) + "\" is not a CUDA device");
#ifdef RECAL_CUDA
    auto idx = d.has_index() ? d.index() : c10::cuda::current_device();
    auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(idx);
    auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    out[0] = st.allocated_bytes[agg].current;
    out[1] = st.allocated_bytes[agg].peak;
    out[2] = st.reserved_bytes[agg].current;
    out[3] = st.reserved_bytes[agg].peak;
    size_t free_b = 0, total_b = 0;
    {
      c10::cuda::CUDAGuard guard(idx);
      if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        (void)cudaGetLastError();
        fail("device memory: cudaMemGetInfo failed on " + std::string(device));
      }
    }
    out[4] = (int64_t)total_b;
    out[5] = (int64_t)free_b;
    if (reset_peak) c10::cuda::CUDACachingAllocator::resetPeakStats(idx);
#else
    fail("device memory: this build has no CUDA (build against a CUDA libtorch, see LIBTORCH in docs/install.md)");
#endif
  });
}

int rc_policy_num_params(rc_policy* p, int64_t* out, char** err) {
  return guarded(err, [&] { *out = (int64_t)p->params.size(); });
}

}  // extern "C"
