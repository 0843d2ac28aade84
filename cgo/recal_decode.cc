// recal_decode.cc — the KV cache and decoding: a cache's rows, extending
// them by a prefill or a decode step with libtorch's kernels where
// recal_rows.cc's row-invariant kernels do not apply (bfloat16, CUDA), the
// choice of the next token, and CUDA-graph decode steps. Every entry point
// Go calls is in the extern "C" block at the end; each catches every C++
// exception and reports it through its own err out-parameter (recal.h).

#include "recal_internal.h"

#include <torch/torch.h>
#include <torch/version.h>

#ifdef RECAL_CUDA
// CUDA builds (the Makefile defines RECAL_CUDA when libtorch has CUDA and
// CUDA's headers are found): CUDA-graph decoding here, the allocator's
// counters in recal_model.cc, the same headers in both; recal_internal.h
// defines RECAL_SDPA (fused attention) for libtorch 2 and later.
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

using torch::Tensor;
using namespace recal;

namespace recal {

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

}  // namespace recal

extern "C" {

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

int rc_policy_row_invariant(rc_policy* p, int32_t* out, char** err) {
  return guarded(err, [&] { *out = recal::rows_supported(*p) ? 1 : 0; });
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
