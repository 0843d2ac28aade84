// recal_model.cc — the policy: a Qwen2-architecture decoder (its layout and
// creation, the full causal forward pass the training side runs), the KV
// cache, and decoding by libtorch's kernels where recal_rows.cc's
// row-invariant kernels do not apply (bfloat16, CUDA). Every entry point
// Go calls is in the extern "C" block at the end; each catches every C++
// exception and reports it through its own err out-parameter (recal.h).

#include "recal_internal.h"

#include <torch/torch.h>
#include <torch/version.h>

#ifdef RECAL_CUDA
// CUDA builds (the Makefile defines RECAL_CUDA when libtorch has CUDA and
// CUDA's headers are found): CUDA-graph decoding and the allocator's
// counters.
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#if TORCH_VERSION_MAJOR >= 2
// libtorch's fused attention (flash, memory-efficient), used on GPUs.
#define RECAL_SDPA 1
#endif
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

Tensor rms_norm(const Tensor& x, const Tensor& w, double eps) {
  auto xf = x.to(torch::kFloat32);
  auto var = xf.pow(2).mean(-1, true);
  xf = xf * torch::rsqrt(var + eps);
  return w * xf.to(x.scalar_type());
}

Tensor rotate_half(const Tensor& x) {
  auto half = x.size(-1) / 2;
  auto x1 = x.narrow(-1, 0, half);
  auto x2 = x.narrow(-1, half, half);
  return torch::cat({-x2, x1}, -1);
}

// cos and sin for integer positions pos (any shape), shape pos.shape + [head_dim].
std::pair<Tensor, Tensor> rope(const rc_policy& p, const Tensor& pos) {
  auto freqs = pos.to(torch::kFloat32).unsqueeze(-1) * p.inv_freq;
  auto emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos().to(p.dtype), emb.sin().to(p.dtype)};
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

}  // namespace

namespace recal {

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

// The choice of each row's next token from logits [n, vocab] (float32, on
// the policy's device), after rc_cache_extend's forward pass (c's lengths
// already advanced): bans, greedy or sampled, and the results copied out.
void choose_and_report(const rc_cache& c, int64_t n, const int64_t* rows, const Tensor& logits,
                       const rc_sample_opts* so, uint64_t gen_seed, int32_t* out_tokens, float* out_logp,
                       float* out_logits) {
  auto dev = logits.device();
  // Banned tokens (router.no_repeat_ngram) are excluded from the choice,
  // greedy or sampled; out_logp stays the unbanned distribution's, like
  // top-p's.
  Tensor choose = logits;
  if (so->ban) {
    std::vector<int64_t> bi, bt;
    int64_t off = 0;
    for (int64_t i = 0; i < n; i++) {
      for (int64_t j = 0; j < so->ban_counts[i]; j++) {
        int64_t t = so->ban[off + j];
        if (t < 0 || t >= logits.size(1)) fail("banned token " + std::to_string(t) + " is outside the vocabulary");
        bi.push_back(i);
        bt.push_back(t);
      }
      off += so->ban_counts[i];
    }
    if (!bi.empty()) {
      auto opts = torch::TensorOptions().dtype(torch::kInt64);
      auto ii = torch::from_blob(bi.data(), {(int64_t)bi.size()}, opts).to(dev);
      auto tt = torch::from_blob(bt.data(), {(int64_t)bt.size()}, opts).to(dev);
      choose = logits.index_put({ii, tt}, torch::full({}, -std::numeric_limits<float>::infinity(), logits.options()));
    }
  }
  Tensor next;
  if (so->temperature <= 0) {
    next = choose.argmax(-1);
  } else {
    auto l = choose / so->temperature;
    if (so->top_k > 0 && so->top_k < l.size(1)) {
      auto kth = std::get<0>(l.topk(so->top_k, -1)).narrow(1, so->top_k - 1, 1);
      l = l.masked_fill(l < kth, -std::numeric_limits<float>::infinity());
    }
    if (so->top_p > 0 && so->top_p < 1) {
      auto sorted = l.sort(-1, /*descending=*/true);
      auto sv = std::get<0>(sorted), si = std::get<1>(sorted);
      auto cum = torch::softmax(sv, -1).cumsum(-1);
      // Drop a token when the mass before it already reaches top_p.
      auto drop = (cum - torch::softmax(sv, -1)) >= so->top_p;
      sv = sv.masked_fill(drop, -std::numeric_limits<float>::infinity());
      l = torch::full_like(l, -std::numeric_limits<float>::infinity()).scatter(1, si, sv);
    }
    // Inverse-CDF sampling with one uniform per row drawn from (seed,
    // row_base + row, row length): a row's draw does not depend on which
    // other rows share the call, so rollouts are reproducible whatever
    // order pool replies arrive in, and (with row_base the rank's first
    // global row) whatever the number of data-parallel ranks.
    auto probs = torch::softmax(l, -1);
    std::vector<float> u(n);
    for (int64_t i = 0; i < n; i++) u[i] = recal::row_uniform(gen_seed, (uint64_t)(so->row_base + rows[i]), c.len[rows[i]]);
    auto cum = probs.cumsum(-1);
    auto target = torch::from_blob(u.data(), {n, 1}, torch::kFloat32).to(dev) * cum.narrow(1, cum.size(1) - 1, 1);
    next = torch::searchsorted(cum, target, /*out_int32=*/false, /*right=*/true).squeeze(1).clamp_max(cum.size(1) - 1);
  }
  auto next_cpu = next.to(torch::kCPU).to(torch::kInt32).contiguous();
  std::memcpy(out_tokens, next_cpu.data_ptr(), sizeof(int32_t) * n);
  if (out_logp && so->want_logp) {
    // log p = logit − logsumexp, without a [rows, vocab] log_softmax.
    auto nlp = logits.gather(1, next.unsqueeze(1)).squeeze(1) - torch::logsumexp(logits, -1);
    auto nlp_cpu = nlp.to(torch::kCPU).contiguous();
    std::memcpy(out_logp, nlp_cpu.data_ptr(), sizeof(float) * n);
  } else if (out_logp) {
    std::memset(out_logp, 0, sizeof(float) * n);
  }
  if (out_logits) {
    auto lc = logits.to(torch::kCPU).contiguous();
    std::memcpy(out_logits, lc.data_ptr(), sizeof(float) * lc.numel());
  }
}

// CUDA-graph decoding. A decode step (one new token for each row given)
// launches some 30 kernels per layer from the host; on a GPU their launches,
// not the card, bound the step. A DecodeGraph is that whole step (every
// layer, the output head, the greedy choice and its log-prob) captured once
// as a CUDA graph for a padded batch size and an attended length, and
// replayed for each step that fits it: the host copies the step's tokens,
// positions and rows in, launches the graph and copies the tokens out.
//
// Static shapes: a step of n rows runs as Bb rows (the next power of two;
// exactly n when it is all the cache's rows in order, which then attend
// their keys in place rather than a gathered copy), padded rows writing
// their keys to the cache's scratch column and their results discarded;
// keys are attended over Tb columns (the next power of two of the longest
// row, at least 64, at most the cache's columns), the rest masked.
struct DecodeGraphs {
#ifdef RECAL_CUDA
  struct Graph {
    int64_t batch = 0, cols = 0;
    bool full = false;
    bool sample = false;  // the choice is a sample at temperature 1 (RC_KERNEL_GRAPH_SAMPLE), else greedy
    Tensor in;      // [4, batch] int64: tokens, positions, cache rows, each row's uniform (float32 bits)
    Tensor logits;  // [batch, vocab] float32
    Tensor packed;  // [2, batch] int32: the chosen token, its log-prob's bits
    std::unique_ptr<at::cuda::CUDAGraph> graph;
  };
  std::vector<std::unique_ptr<Graph>> graphs;
  std::vector<const void*> weights;  // the parameters' storage the graphs read
  at::cuda::MempoolId_t pool{0, 0};  // shared by the cache's graphs, which replay one at a time
#endif
};

void free_graphs(DecodeGraphs* g) { delete g; }

#ifdef RECAL_CUDA
namespace {

constexpr size_t kMaxGraphs = 64;  // per cache; further shapes decode eagerly

int64_t pow2_at_least(int64_t n) {
  int64_t b = 1;
  while (b < n) b <<= 1;
  return b;
}

// The step's computation on the graph's static tensors; run eagerly once to
// warm up (kernels load, cuBLAS makes its workspace), then under capture.
void decode_body(const rc_policy& p, rc_cache& c, DecodeGraphs::Graph& g) {
  const auto& cfg = p.cfg;
  auto B = g.batch, Tb = g.cols, kv = cfg.num_key_value_heads, hd = cfg.head_dim;
  auto g_heads = cfg.num_attention_heads / kv;
  auto tok = g.in[0], pos = g.in[1], ri = g.in[2];  // [B]
  auto dev = p.device;
  auto [cos, sin] = rope(p, pos.unsqueeze(1));  // [B, 1, hd]
  auto cols = torch::arange(Tb, torch::TensorOptions().dtype(torch::kLong).device(dev));
  auto hide = cols.view({1, 1, 1, Tb}) > pos.view({B, 1, 1, 1});  // [B, 1, 1, Tb]
  auto x = torch::embedding(p.P(p.embed), tok.unsqueeze(1));        // [B, 1, H]
#ifdef RECAL_SDPA
  auto mask = torch::zeros({B, 1, 1, Tb}, torch::TensorOptions().dtype(p.dtype).device(dev))
                  .masked_fill_(hide, -std::numeric_limits<float>::infinity());
#else
  auto mask = torch::zeros({B, 1, 1, 1, Tb}, torch::TensorOptions().dtype(torch::kFloat32).device(dev))
                  .masked_fill_(hide.unsqueeze(1), -std::numeric_limits<float>::infinity());
#endif
  for (size_t l = 0; l < p.layers.size(); l++) {
    const auto& ly = p.layers[l];
    auto h = rms_norm(x, p.P(ly.in_norm), cfg.rms_norm_eps);
    Tensor q, k, v;
    qkv(p, ly, h, cos, sin, q, k, v);
    c.k[l].transpose(1, 2).index_put_({ri, pos}, k.view({B, kv, hd}));
    c.v[l].transpose(1, 2).index_put_({ri, pos}, v.view({B, kv, hd}));
    Tensor K = c.k[l].narrow(2, 0, Tb), V = c.v[l].narrow(2, 0, Tb);  // [rows, kv, Tb, hd]
    if (!g.full) {
      K = K.index_select(0, ri);
      V = V.index_select(0, ri);
    }
#ifdef RECAL_SDPA
    auto o = at::scaled_dot_product_attention(q.view({B, kv, g_heads, hd}), K, V, mask).reshape({B, 1, kv * g_heads * hd});
#else
    auto o = attend(p, q, K.transpose(1, 2), V.transpose(1, 2), mask);
#endif
    x = x + torch::linear(o, p.P(ly.o_w));
    x = x + mlp(p, ly, rms_norm(x, p.P(ly.post_norm), cfg.rms_norm_eps));
  }
  auto hn = rms_norm(x.squeeze(1), p.P(p.norm), cfg.rms_norm_eps);
  g.logits = torch::linear(hn, p.P(p.lm_head)).to(torch::kFloat32);
  Tensor next;
  if (g.sample) {
    // choose_and_report's inverse-CDF draw at temperature 1, on the uniform
    // it would draw (the host's, copied in with the tokens).
    auto u = g.in[3].to(torch::kInt32).view(torch::kFloat32).view({B, 1});
    auto cum = torch::softmax(g.logits, -1).cumsum(-1);
    auto target = u * cum.narrow(1, cum.size(1) - 1, 1);
    next = torch::searchsorted(cum, target, /*out_int32=*/false, /*right=*/true).squeeze(1).clamp_max(cum.size(1) - 1);
  } else {
    next = g.logits.argmax(-1);
  }
  auto lp = g.logits.gather(1, next.unsqueeze(1)).squeeze(1) - torch::logsumexp(g.logits, -1);
  g.packed = torch::stack({next.to(torch::kInt32), lp.view(torch::kInt32)});
}

std::vector<const void*> weight_ptrs(const rc_policy& p) {
  std::vector<const void*> w;
  for (const auto& t : p.params) w.push_back(t.data_ptr());
  w.push_back(p.inv_freq.data_ptr());
  return w;
}

// Captures the graph for (batch, cols, full) with in's values as the
// warm-up's inputs. On failure the capture is ended, the policy's graphs
// turned off with the reason kept, and nullptr returned: the step decodes
// eagerly.
DecodeGraphs::Graph* capture(rc_policy& p, rc_cache& c, int64_t batch, int64_t cols, bool full, bool sample,
                             const Tensor& in) {
  auto& gs = *c.graphs;
  auto g = std::make_unique<DecodeGraphs::Graph>();
  g->batch = batch;
  g->cols = cols;
  g->full = full;
  g->sample = sample;
  g->in = in.to(p.device);
  auto idx = p.device.index();
  c10::cuda::device_synchronize();  // the cache's earlier writes, on the current stream, are done
  auto stream = c10::cuda::getStreamFromPool(false, idx);
  try {
    c10::cuda::CUDAStreamGuard guard(stream);
    decode_body(p, c, *g);  // warm-up
    stream.synchronize();
    g->graph = std::make_unique<at::cuda::CUDAGraph>();
    g->graph->capture_begin(gs.pool, cudaStreamCaptureModeThreadLocal);
    try {
      decode_body(p, c, *g);
    } catch (...) {
      try {
        g->graph->capture_end();
      } catch (...) {
      }
      throw;
    }
    g->graph->capture_end();
    if (gs.graphs.empty()) gs.pool = g->graph->pool();
  } catch (const std::exception& e) {
    (void)cudaGetLastError();
    p.graph_error = std::string("CUDA graph capture (batch ") + std::to_string(batch) + ", " + std::to_string(cols) +
                    " columns): " + e.what();
    p.cuda_graphs = false;
    c10::cuda::device_synchronize();
    return nullptr;
  }
  c10::cuda::device_synchronize();
  p.graph_captures++;
  gs.graphs.push_back(std::move(g));
  return gs.graphs.back().get();
}

}  // namespace

// rc_cache_extend's decode step by a CUDA graph; false when it does not
// apply (not a one-token step on a CUDA policy with graphs on, or no graph
// could be captured): the caller decodes eagerly. lens are the rows'
// lengths before the step.
bool graph_extend(rc_cache& c, int64_t n, const int64_t* rows, int64_t width, const int32_t* tokens,
                  const std::vector<int64_t>& lens, const rc_sample_opts* so, uint64_t gen_seed, int32_t* out_tokens,
                  float* out_logp, float* out_logits) {
  rc_policy& p = *c.p;
  if (!p.device.is_cuda() || !p.cuda_graphs || width != 1) return false;
  if (!c.graphs) c.graphs.reset(new DecodeGraphs());
  auto& gs = *c.graphs;
  auto w = weight_ptrs(p);
  if (w != gs.weights) {  // the parameters' storage changed: every graph reads stale memory
    gs.graphs.clear();
    gs.pool = {0, 0};  // their pool went with them
    gs.weights = w;
  }
  bool full = n == c.rows;
  for (int64_t i = 0; i < n && full; i++) full = rows[i] == i;
  int64_t batch = full ? n : pow2_at_least(n);
  int64_t longest = *std::max_element(lens.begin(), lens.end()) + 1;
  int64_t total = c.k[0].size(2), scratch = total - 1;
  int64_t cols = std::min(total, pow2_at_least(std::max<int64_t>(64, longest)));
  // A training rollout's plain sampling (temperature 1, nothing cut or
  // banned) is drawn inside the graph; other sampling settings after it,
  // on its logits (choose_and_report).
  bool greedy = so->temperature <= 0 && !so->ban && !out_logits;
  bool sample = (p.kernels & RC_KERNEL_GRAPH_SAMPLE) && so->temperature == 1.0 && so->top_k <= 0 &&
                (so->top_p <= 0 || so->top_p >= 1) && !so->ban && !out_logits;
  std::vector<int64_t> host(4 * batch);
  for (int64_t i = 0; i < batch; i++) {
    bool real = i < n;
    host[i] = real ? tokens[i] : 0;
    host[batch + i] = real ? lens[i] : scratch;
    host[2 * batch + i] = real ? rows[i] : 0;
    float u = 0;
    // The draw choose_and_report makes: the row's length after this step.
    if (real && sample) u = recal::row_uniform(gen_seed, (uint64_t)(so->row_base + rows[i]), lens[i] + 1);
    int32_t bits;
    std::memcpy(&bits, &u, sizeof bits);
    host[3 * batch + i] = bits;
  }
  auto in = torch::from_blob(host.data(), {4, batch}, torch::TensorOptions().dtype(torch::kLong));
  c10::cuda::CUDAGuard device(p.device.index());
  DecodeGraphs::Graph* g = nullptr;
  for (auto& e : gs.graphs)
    if (e->batch == batch && e->cols == cols && e->full == full && e->sample == sample) g = e.get();
  if (!g) {
    if (gs.graphs.size() >= kMaxGraphs) return false;
    if (!(g = capture(p, c, batch, cols, full, sample, in))) return false;
  }
  g->in.copy_(in);
  g->graph->replay();
  p.graph_replays++;
  for (int64_t i = 0; i < n; i++) c.len[rows[i]] += 1;
  if (greedy || sample) {
    auto packed = g->packed.narrow(1, 0, n).to(torch::kCPU).contiguous();
    const int32_t* pk = packed.data_ptr<int32_t>();
    std::memcpy(out_tokens, pk, sizeof(int32_t) * n);
    if (out_logp && so->want_logp)
      std::memcpy(out_logp, pk + n, sizeof(float) * n);
    else if (out_logp)
      std::memset(out_logp, 0, sizeof(float) * n);
    return true;
  }
  choose_and_report(c, n, rows, g->logits.narrow(0, 0, n), so, gen_seed, out_tokens, out_logp, out_logits);
  return true;
}
#endif

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

int rc_policy_set_cuda_graphs(rc_policy* p, int32_t on, char** err) {
  return guarded(err, [&] {
    p->cuda_graphs = on != 0;
    if (on) p->graph_error.clear();
  });
}

int rc_policy_graph_stats(rc_policy* p, int64_t* captures, int64_t* replays, char** graph_error, char** err) {
  return guarded(err, [&] {
    *captures = p->graph_captures;
    *replays = p->graph_replays;
    *graph_error = p->graph_error.empty() ? nullptr : strdup(p->graph_error.c_str());
  });
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

int rc_policy_row_invariant(rc_policy* p, int32_t* out, char** err) {
  return guarded(err, [&] { *out = recal::rows_supported(*p) ? 1 : 0; });
}

int rc_policy_num_params(rc_policy* p, int64_t* out, char** err) {
  return guarded(err, [&] { *out = (int64_t)p->params.size(); });
}

int rc_cache_new(rc_policy* p, int64_t rows, int64_t capacity, rc_cache** out, char** err) {
  return guarded(err, [&] {
    if (rows <= 0 || capacity <= 0) fail("cache: rows and capacity must be positive");
    auto c = std::make_unique<rc_cache>();
    c->p = p;
    c->rows = rows;
    c->capacity = capacity;
    c->len.assign(rows, 0);
    auto opts = torch::TensorOptions().dtype(p->dtype).device(p->device);
    // On a GPU: a scratch column past the capacity, the columns a multiple
    // of 64 (rc_cache; the fused attention's masks need aligned rows).
    int64_t cols = p->device.is_cuda() ? (capacity + 1 + 63) / 64 * 64 : capacity;
    for (size_t l = 0; l < p->layers.size(); l++) {
      c->k.push_back(torch::zeros({rows, p->cfg.num_key_value_heads, cols, p->cfg.head_dim}, opts));
      c->v.push_back(torch::zeros({rows, p->cfg.num_key_value_heads, cols, p->cfg.head_dim}, opts));
    }
    *out = c.release();
  });
}

void rc_cache_free(rc_cache* c) { delete c; }

int rc_cache_reset(rc_cache* c, int64_t n, const int64_t* rows, char** err) {
  return guarded(err, [&] {
    if (!rows) {
      std::fill(c->len.begin(), c->len.end(), 0);
      return;
    }
    for (int64_t i = 0; i < n; i++) {
      if (rows[i] < 0 || rows[i] >= c->rows) fail("cache: row " + std::to_string(rows[i]) + " out of range");
      c->len[rows[i]] = 0;
    }
  });
}

int rc_cache_lengths(rc_cache* c, int64_t n, const int64_t* rows, int64_t* out, char** err) {
  return guarded(err, [&] {
    if (!rows) {
      for (int64_t r = 0; r < c->rows; r++) out[r] = c->len[r];
      return;
    }
    for (int64_t i = 0; i < n; i++) {
      if (rows[i] < 0 || rows[i] >= c->rows) fail("cache: row " + std::to_string(rows[i]) + " out of range");
      out[i] = c->len[rows[i]];
    }
  });
}

int rc_cache_extend(rc_cache* c, int64_t n, const int64_t* rows, int64_t width, const int32_t* tokens,
                    const int64_t* counts, const rc_sample_opts* so, uint64_t gen_seed, int32_t* out_tokens,
                    float* out_logp, float* out_logits, char** err) {
  return guarded(err, [&] {
    const rc_policy& p = *c->p;
    if (n <= 0 || width <= 0) fail("cache: extend needs at least one row and one token");
    check_tokens(p, n * width, tokens);
    int64_t tmax = 0;
    bool contiguous = true;
    std::vector<int64_t> lens(n);
    for (int64_t i = 0; i < n; i++) {
      auto r = rows[i];
      if (r < 0 || r >= c->rows) fail("cache: row " + std::to_string(r) + " out of range");
      if (counts[i] < 1 || counts[i] > width) fail("cache: row " + std::to_string(r) + ": count outside [1, width]");
      if (c->len[r] + counts[i] > c->capacity)
        fail("cache: row " + std::to_string(r) + ": " + std::to_string(c->len[r] + counts[i]) +
             " tokens exceed the context capacity " + std::to_string(c->capacity));
      for (int64_t j = 0; j < i; j++)
        if (rows[j] == r) fail("cache: row " + std::to_string(r) + " given twice");
      lens[i] = c->len[r];
      tmax = std::max(tmax, lens[i] + counts[i]);
      if (i > 0 && rows[i] != rows[i - 1] + 1) contiguous = false;
    }
    // A row's result must not depend on which rows share the call: that
    // depends on when pool replies arrive, on the ranks and on the rollout
    // workers (training rollouts, whose log-probs are the ratio's
    // denominator in the loss) and on eval.batch and the request mix
    // (evaluation, serving). A float32 policy on the CPU decodes by
    // recal_rows.cc's kernels, whose result for a row holds by construction
    // whatever the other rows, the BLAS kernel or the threads. Elsewhere
    // (bfloat16, CUDA) libtorch's kernels pick their strategy by shape: a
    // row's bits may depend on the call (within float rounding).
    if (recal::rows_supported(p)) {
      recal::extend_rows(*c, n, rows, width, tokens, counts, so, gen_seed, out_tokens, out_logp, out_logits);
      return;
    }
    torch::NoGradGuard ng;
#ifdef RECAL_CUDA
    if (graph_extend(*c, n, rows, width, tokens, lens, so, gen_seed, out_tokens, out_logp, out_logits)) return;
#endif
    auto dev = p.device;
    auto li = torch::TensorOptions().dtype(torch::kLong);
    auto ri = torch::from_blob(const_cast<int64_t*>(rows), {n}, li).to(dev, false, true);
    auto lt = torch::from_blob(lens.data(), {n}, li).to(dev, false, true);
    auto ct = torch::from_blob(const_cast<int64_t*>(counts), {n}, li).to(dev, false, true);
    auto tok = device_tensor(p, tokens, {n, width}, torch::kInt32).to(torch::kLong);
    auto steps = torch::arange(width, li.device(dev));
    auto pos = lt.unsqueeze(1) + steps.unsqueeze(0);     // [n, L]
    auto valid = steps.unsqueeze(0) < ct.unsqueeze(1);   // [n, L]
    // The common case: a whole block of rows at the same length, each
    // appending the same number of tokens (a batch prefill or a decode
    // step). K/V then go in with a strided copy, and a one-token step needs
    // no mask at all.
    bool uniform = contiguous;
    for (int64_t i = 0; i < n && uniform; i++) uniform = counts[i] == width && lens[i] == lens[0];
    Tensor rsel, psel, mask;
    if (!uniform) {
      rsel = ri.unsqueeze(1).expand({n, width}).masked_select(valid);
      psel = pos.masked_select(valid);
    }
    // A prefill of rows that all start empty is plain causal attention
    // (tmax == width): on a GPU with fused attention an undefined mask
    // says so (attend), and the causal kernel runs without a mask.
    bool causal = false;
#ifdef RECAL_SDPA
    causal = dev.is_cuda() && uniform && lens[0] == 0 && width > 1 && !prefill_by_matmul(p, width);
#endif
    if ((!uniform || width > 1) && !causal) {
      auto cols = torch::arange(tmax, li.device(dev));
      // Query (r, t) may see cache columns 0..pos[r, t].
      mask = torch::zeros({n, width, tmax}, torch::TensorOptions().dtype(torch::kFloat32).device(dev))
                 .masked_fill(cols.view({1, 1, tmax}) > pos.unsqueeze(2), -std::numeric_limits<float>::infinity())
                 .view({n, 1, 1, width, tmax});
    }
    auto [cos, sin] = rope(p, pos);
    auto x = torch::embedding(p.P(p.embed), tok);
    for (size_t l = 0; l < p.layers.size(); l++) {
      const auto& ly = p.layers[l];
      auto h = rms_norm(x, p.P(ly.in_norm), p.cfg.rms_norm_eps);
      Tensor q, k, v;
      qkv(p, ly, h, cos, sin, q, k, v);
      auto kc = c->k[l].transpose(1, 2), vc = c->v[l].transpose(1, 2);  // views [rows, capacity, kv, hd]
      if (uniform) {
        kc.narrow(0, rows[0], n).narrow(1, lens[0], width).copy_(k);
        vc.narrow(0, rows[0], n).narrow(1, lens[0], width).copy_(v);
      } else {
        auto vm = valid.view({n, width, 1, 1});
        auto kd = p.cfg.num_key_value_heads, hd = p.cfg.head_dim;
        kc.index_put_({rsel, psel}, k.masked_select(vm).view({-1, kd, hd}));
        vc.index_put_({rsel, psel}, v.masked_select(vm).view({-1, kd, hd}));
      }
      // [n, tmax, kv, hd] views whose per-head matrices attend uses in place.
      Tensor K, V;
      if (contiguous) {  // a view, no copy: the common case of a whole batch
        K = kc.narrow(0, rows[0], n).narrow(1, 0, tmax);
        V = vc.narrow(0, rows[0], n).narrow(1, 0, tmax);
      } else {  // one gather of the rows' first tmax positions
        K = c->k[l].narrow(2, 0, tmax).index_select(0, ri).transpose(1, 2);
        V = c->v[l].narrow(2, 0, tmax).index_select(0, ri).transpose(1, 2);
      }
      x = x + torch::linear(attend(p, q, K, V, mask), p.P(ly.o_w));
      x = x + mlp(p, ly, rms_norm(x, p.P(ly.post_norm), p.cfg.rms_norm_eps));
    }
    for (int64_t i = 0; i < n; i++) c->len[rows[i]] += counts[i];
    // Only the last new position of each row needs logits.
    auto last = x.gather(1, (ct - 1).view({n, 1, 1}).expand({n, 1, x.size(2)})).squeeze(1);
    auto hn = rms_norm(last, p.P(p.norm), p.cfg.rms_norm_eps);
    // One row (batch-1 decode): a matrix-vector product. BLAS runs it ~1.4x
    // faster than the one-row matrix product linear() would ask for, and
    // with a large vocabulary the output head is most of a decode step.
    auto logits = (n == 1 ? torch::mv(p.P(p.lm_head), hn.squeeze(0)).unsqueeze(0) : torch::linear(hn, p.P(p.lm_head)))
                      .to(torch::kFloat32);
    choose_and_report(*c, n, rows, logits, so, gen_seed, out_tokens, out_logp, out_logits);
  });
}

}  // extern "C"
