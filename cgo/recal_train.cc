// recal_train.cc — training: per-token scoring, the clipped policy-gradient
// loss with its k3 KL term and entropy bonus (the output head fused and
// chunked), the supervised loss, PPO's value head, and AdamW with float32
// gradient sums and master weights. Every entry point Go calls is in the
// extern "C" block at the end (recal.h).

#include "recal_internal.h"

#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

using torch::Tensor;
using namespace recal;

namespace {

// The output head, fused and chunked. For hidden states h [N, H] (no
// autograd) and targets [N], each chunk of rows computes its [chunk, vocab]
// logits once, then log p(target), the entropy and, when coef is given, the
// gradient of a per-token loss L(logp) analytically:
//   dL/dlogits = c · (onehot(target) − softmax) + e · softmax ⊙ (log softmax + H)
// where c = dL/dlogp (from coef) and e the entropy-bonus weight per token.
// The head weight's gradient is accumulated in float32 into p.head_grad
// (added to the gradient sums by flush_grads), or straight into the sum when
// that is zero (rc_policy::head_grad_target), and dL/dh is returned, so
// autograd never stores a [tokens, vocab] tensor.
struct HeadGrad {
  // Per-token dL/dlogp for a chunk [s, s+n) given its log-probs and entropies.
  std::function<Tensor(int64_t s, int64_t n, const Tensor& lp, const Tensor& ent)> coef;
  // Per-token weight of −H in the loss (entropy bonus); undefined for none.
  Tensor ent_weight;
};

void head(rc_policy& p, const Tensor& h, const Tensor& targets, int64_t chunk, Tensor& logp, Tensor& ent,
          const HeadGrad* grad, Tensor* hgrad) {
  torch::NoGradGuard ng;
  auto N = h.size(0);
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(p.device);
  logp = torch::zeros({N}, f32);
  ent = torch::zeros({N}, f32);
  const auto& W = p.P(p.lm_head);
  Tensor Wg;  // float32, whatever the policy's dtype: chunks accumulate exactly
  if (grad) {
    *hgrad = torch::zeros_like(h);
    // This call's own sum, added to grad32 whole by flush_grads, or the
    // zeroed sum itself.
    Wg = p.head_grad_target();
  }
  for (int64_t s = 0; s < N; s += chunk) {
    auto n = std::min(chunk, N - s);
    auto hc = h.narrow(0, s, n);
    auto tg = targets.narrow(0, s, n).unsqueeze(1);
    auto x = torch::linear(hc, W).to(torch::kFloat32);  // logits, shifted in place below
    x.sub_(std::get<0>(x.max(1, true)));
    auto e = x.exp();                                  // unnormalised probabilities
    auto se = e.sum(1);
    auto lse = se.log();
    auto lp = x.gather(1, tg).squeeze(1) - lse;
    // H = lse − Σ p·x, with Σ e·x as a batched dot product (no temporary).
    auto ex = torch::bmm(e.unsqueeze(1), x.unsqueeze(2)).view({n});
    auto H = lse - ex / se;
    logp.narrow(0, s, n).copy_(lp);
    ent.narrow(0, s, n).copy_(H);
    if (!grad) continue;
    auto c = grad->coef(s, n, lp, H);
    e.div_(se.unsqueeze(1));  // softmax
    if (grad->ent_weight.defined()) {
      auto w = grad->ent_weight.narrow(0, s, n).unsqueeze(1);
      x.sub_(lse.unsqueeze(1)).add_(H.unsqueeze(1)).mul_(w).sub_(c.unsqueeze(1));
      e.mul_(x);
    } else {
      e.mul_(-c.unsqueeze(1));
    }
    e.scatter_add_(1, tg, c.unsqueeze(1));
    hgrad->narrow(0, s, n).copy_(torch::matmul(e.to(W.scalar_type()), W));
    Wg.addmm_(e.t(), hc.to(torch::kFloat32));
  }
}

// The value head's output for hidden states h [N, H]: [N] float32 (with
// autograd when h has it).
Tensor value_of(const rc_policy& p, const Tensor& h) {
  return torch::linear(h, p.P(p.value_w), p.P(p.value_b)).squeeze(-1).to(torch::kFloat32);
}

}  // namespace

namespace recal {

// Names the optimizer tensors (state_names, state_name_ptrs) after the
// parameters that have them.
void name_state(rc_policy& p) {
  p.state_names.clear();
  for (auto& n : p.names) p.state_names.push_back("exp_avg/" + n);
  for (auto& n : p.names) p.state_names.push_back("exp_avg_sq/" + n);
  if (!p.master.empty())
    for (auto& n : p.names) p.state_names.push_back("master/" + n);
  p.state_name_ptrs.clear();
  for (auto& n : p.state_names) p.state_name_ptrs.push_back(n.c_str());
}

void set_trainable(rc_policy& p, bool on) {
  p.trainable = on;
  if (!on) p.unbucket_grads();
  for (auto& t : p.params) {
    t.requires_grad_(on);
    if (!on) t.mutable_grad() = Tensor();
  }
  if (!on) {
    p.grad32.clear();
    p.gathered.clear();
    p.exp_avg.clear();
    p.exp_avg_sq.clear();
    p.master.clear();
    p.state_names.clear();
    p.state_name_ptrs.clear();
  }
}

// Creates the optimizer state of the parameters that have none yet: zero
// moments and, for non-float32 policies, a float32 master copy; of this
// rank's share of each parameter's elements (a 1-D tensor) when sharded.
void extend_optimizer(rc_policy& p) {
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(p.device);
  auto shape = [&](size_t i) -> std::vector<int64_t> {
    if (!p.sharded()) return p.params[i].sizes().vec();
    return {p.own_hi[i] - p.own_lo[i]};
  };
  auto value = [&](size_t i) {
    auto w = p.params[i].detach();
    if (p.sharded()) w = w.reshape({-1}).narrow(0, p.own_lo[i], p.own_hi[i] - p.own_lo[i]);
    return w.to(torch::kFloat32).clone();
  };
  for (size_t i = p.exp_avg.size(); i < p.params.size(); i++) {
    p.exp_avg.push_back(torch::zeros(shape(i), f32));
    p.exp_avg_sq.push_back(torch::zeros(shape(i), f32));
  }
  if (p.dtype != torch::kFloat32)
    for (size_t i = p.master.size(); i < p.params.size(); i++) p.master.push_back(value(i));
  name_state(p);
}

// Makes this policy hold the optimizer state of rank's share among world
// ranks (world 1: all of it). Whole state already there is cut to the
// share; state sharded another way cannot be re-cut here (it goes whole
// through a checkpoint: gather, write, load, shard).
void shard_optimizer(rc_policy& p, int64_t rank, int64_t world) {
  if (world < 1 || rank < 0 || rank >= world)
    fail("shard optimizer: rank " + std::to_string(rank) + " of " + std::to_string(world) + ": want 0 ≤ rank < world");
  if (p.shard_world == world && p.shard_rank == rank) return;
  bool have = !p.exp_avg.empty();
  if (have && p.sharded())
    fail("shard optimizer: the state is already sharded as rank " + std::to_string(p.shard_rank) + " of " +
         std::to_string(p.shard_world) + "; reshard through a checkpoint");
  torch::NoGradGuard ng;
  p.shard_rank = rank;
  p.shard_world = world;
  p.own_lo.assign(p.params.size(), 0);
  p.own_hi.assign(p.params.size(), 0);
  for (size_t i = 0; i < p.params.size(); i++) {
    if (world == 1) {
      p.own_hi[i] = p.params[i].numel();
      continue;
    }
    auto [lo, hi] = p.share(i, rank, world);
    p.own_lo[i] = lo;
    p.own_hi[i] = hi;
  }
  if (!have || world == 1) return;
  auto cut = [&](std::vector<Tensor>& v) {
    for (size_t i = 0; i < v.size(); i++)
      v[i] = v[i].reshape({-1}).narrow(0, p.own_lo[i], p.own_hi[i] - p.own_lo[i]).clone();
  };
  cut(p.exp_avg);
  cut(p.exp_avg_sq);
  cut(p.master);
}

std::vector<Tensor> grad_norm_terms(const Tensor& g) {
  std::vector<Tensor> terms;
  auto n = g.numel();
  if (n <= kStepSlice) {
    terms.push_back(g.pow(2).sum());
    return terms;
  }
  if (!g.is_contiguous()) fail("step: a non-contiguous tensor cannot be updated in slices");
  for (int64_t off = 0; off < n; off += kStepSlice)
    terms.push_back(g.view({-1}).narrow(0, off, std::min(kStepSlice, n - off)).pow(2).sum());
  return terms;
}

void ensure_optimizer(rc_policy& p) {
  if (!p.exp_avg.empty()) return;
  extend_optimizer(p);
}

}  // namespace recal

extern "C" {

int rc_policy_set_trainable(rc_policy* p, int32_t trainable, char** err) {
  return guarded(err, [&] { set_trainable(*p, trainable != 0); });
}

int rc_policy_score(rc_policy* p, int64_t batch, int64_t len, const int32_t* tokens, const int64_t* lengths,
                    const float* mask, float* logp, float* entropy, char** err) {
  return guarded(err, [&] {
    torch::NoGradGuard ng;
    check_tokens(*p, batch * len, tokens);
    if (logp) std::memset(logp, 0, sizeof(float) * batch * len);
    if (entropy) std::memset(entropy, 0, sizeof(float) * batch * len);
    auto tok = device_tensor(*p, tokens, {batch, len}, torch::kInt32).to(torch::kLong);
    auto idx = scored_positions(*p, batch, len, lengths, mask);
    if (idx.numel() == 0) return;
    auto h = forward_full(*p, tok).reshape({batch * len, -1}).index_select(0, idx);
    auto targets = tok.reshape({-1}).roll(-1).index_select(0, idx);
    Tensor lp, ent;
    head(*p, h, targets, 256, lp, ent, nullptr, nullptr);
    auto idx_cpu = idx.to(torch::kCPU);
    auto ii = idx_cpu.accessor<int64_t, 1>();
    auto lpc = lp.to(torch::kCPU).contiguous(), entc = ent.to(torch::kCPU).contiguous();
    auto la = lpc.accessor<float, 1>(), ea = entc.accessor<float, 1>();
    for (int64_t i = 0; i < idx_cpu.size(0); i++) {
      if (logp) logp[ii[i]] = la[i];
      if (entropy) entropy[ii[i]] = ea[i];
    }
  });
}

int rc_policy_backward(rc_policy* p, int64_t batch, int64_t len, const int32_t* tokens, const int64_t* lengths,
                       const float* mask, const float* adv, const float* old_logp, const float* ref_logp,
                       const rc_ppo_inputs* ppo, const rc_loss_opts* o, rc_loss_stats* stats, char** err) {
  return guarded(err, [&] {
    if (!p->trainable) fail("backward on a frozen policy");
    if (ppo && p->value_w < 0) fail("ppo loss: the policy has no value head (rc_policy_add_value_head)");
    if (ppo && (!ppo->adv || !ppo->returns)) fail("ppo loss: per-token advantages and returns are required");
    if (!ppo && !adv) fail("loss: no advantages");
    check_tokens(*p, batch * len, tokens);
    *stats = rc_loss_stats{};
    torch::AutoGradMode grad_on(true);
    auto tok = device_tensor(*p, tokens, {batch, len}, torch::kInt32).to(torch::kLong);
    auto idx = scored_positions(*p, batch, len, lengths, mask);
    auto N = idx.numel();
    if (N == 0) return;
    auto f32 = torch::kFloat32;
    auto targets = tok.reshape({-1}).roll(-1).index_select(0, idx);
    auto w = device_tensor(*p, mask, {batch * len}, f32).index_select(0, idx);
    auto rows = idx.div(len, "floor");
    // GRPO: one advantage per row; PPO: one per token.
    auto a = ppo ? device_tensor(*p, ppo->adv, {batch * len}, f32).index_select(0, idx)
                 : device_tensor(*p, adv, {batch}, f32).index_select(0, rows);
    Tensor old = old_logp ? device_tensor(*p, old_logp, {batch * len}, f32).index_select(0, idx) : Tensor();
    Tensor ref = ref_logp ? device_tensor(*p, ref_logp, {batch * len}, f32).index_select(0, idx) : Tensor();

    // The trunk runs once with autograd; the output head and the loss run in
    // chunks outside it (see head()), and dL/dh flows back in one call.
    auto h = forward_full(*p, tok).reshape({batch * len, -1}).index_select(0, idx);
    auto chunk = o->head_chunk > 0 ? o->head_chunk : 256;
    auto eps = o->clip_eps, klc = o->kl_coef, sc = o->scale;
    auto ws = w * sc;
    Tensor ratio_all = torch::zeros({N}, torch::TensorOptions().dtype(f32).device(p->device));
    Tensor clip_all = torch::zeros_like(ratio_all), kl_all = torch::zeros_like(ratio_all), loss_all = torch::zeros_like(ratio_all);
    HeadGrad hg;
    hg.coef = [&](int64_t s, int64_t n, const Tensor& lp, const Tensor& H) {
      auto as = a.narrow(0, s, n), wn = ws.narrow(0, s, n);
      auto ratio = old.defined() ? torch::exp(lp - old.narrow(0, s, n)) : torch::ones_like(lp);
      auto pg1 = ratio * as, pg2 = torch::clamp(ratio, 1.0 - eps, 1.0 + eps) * as;
      auto through = (pg1 <= pg2).to(f32);  // the min takes the unclipped term: gradient flows
      auto c = -as * ratio * through;        // d(−min(ρA, clip(ρ)A))/dlogp
      auto per_tok = -torch::min(pg1, pg2);
      if (ref.defined()) {
        auto d = ref.narrow(0, s, n) - lp;
        auto kl = torch::exp(d) - d - 1;
        kl_all.narrow(0, s, n).copy_(kl);
        if (klc != 0) {
          c = c + klc * (1 - torch::exp(d));
          per_tok = per_tok + klc * kl;
        }
      }
      if (o->entropy_coef != 0) per_tok = per_tok - o->entropy_coef * H;
      ratio_all.narrow(0, s, n).copy_(ratio);
      clip_all.narrow(0, s, n).copy_(1 - through);
      loss_all.narrow(0, s, n).copy_(per_tok * wn);
      return c * wn;
    };
    if (o->entropy_coef != 0) hg.ent_weight = ws * o->entropy_coef;
    // PPO's clipped value loss (verl's compute_value_loss) on the same
    // hidden states, with autograd through the value head and the trunk.
    Tensor vl, vclip, vloss;
    if (ppo) {
      auto v = value_of(*p, h);
      auto R = device_tensor(*p, ppo->returns, {batch * len}, f32).index_select(0, idx);
      auto l1 = (v - R).pow(2);
      vl = l1;
      if (ppo->old_values && o->value_clip > 0) {
        auto vo = device_tensor(*p, ppo->old_values, {batch * len}, f32).index_select(0, idx);
        auto vc = torch::max(torch::min(v, vo + o->value_clip), vo - o->value_clip);
        auto l2 = (vc - R).pow(2);
        vl = torch::max(l1, l2);
        vclip = (l2 > l1).to(f32);
      }
      vl = 0.5 * vl;
      vloss = (vl * ws).sum() * o->vf_coef;
    }
    Tensor lp, ent, hgrad;
    head(*p, h.detach(), targets, chunk, lp, ent, &hg, &hgrad);
    if (ppo)
      torch::autograd::backward({h, vloss}, {hgrad, torch::ones_like(vloss)});
    else
      torch::autograd::backward({h}, {hgrad});
    p->flush_grads();  // into the float32 sums: micro-batches accumulate in float32
    torch::NoGradGuard ng;
    if (ppo) {
      stats->value_loss = (vl.detach() * w).sum().item<double>();
      if (vclip.defined()) stats->value_clipped = (vclip * w).sum().item<double>();
      loss_all.add_(vl.detach() * ws * o->vf_coef);
    }
    stats->loss = loss_all.sum().item<double>();
    stats->tokens = w.sum().item<double>();
    stats->clipped = (clip_all * w).sum().item<double>();
    stats->kl = (kl_all * w).sum().item<double>();
    stats->entropy = (ent * w).sum().item<double>();
    stats->ratio = (ratio_all * w).sum().item<double>();
  });
}

int rc_policy_backward_nll(rc_policy* p, int64_t batch, int64_t len, const int32_t* tokens, const int64_t* lengths,
                           const float* mask, double scale, int64_t head_chunk, double* nll, char** err) {
  return guarded(err, [&] {
    if (!p->trainable) fail("backward on a frozen policy");
    check_tokens(*p, batch * len, tokens);
    *nll = 0;
    torch::AutoGradMode grad_on(true);
    auto tok = device_tensor(*p, tokens, {batch, len}, torch::kInt32).to(torch::kLong);
    auto idx = scored_positions(*p, batch, len, lengths, mask);
    auto N = idx.numel();
    if (N == 0) return;
    auto targets = tok.reshape({-1}).roll(-1).index_select(0, idx);
    auto w = device_tensor(*p, mask, {batch * len}, torch::kFloat32).index_select(0, idx);
    auto h = forward_full(*p, tok).reshape({batch * len, -1}).index_select(0, idx);
    HeadGrad hg;
    hg.coef = [&](int64_t s, int64_t n, const Tensor& lp, const Tensor& H) { return -w.narrow(0, s, n) * scale; };
    Tensor lp, ent, hgrad;
    head(*p, h.detach(), targets, head_chunk > 0 ? head_chunk : 256, lp, ent, &hg, &hgrad);
    torch::autograd::backward({h}, {hgrad});
    p->flush_grads();
    torch::NoGradGuard ng;
    *nll = -(lp * w).sum().item<double>();
  });
}

int rc_policy_add_value_head(rc_policy* p, char** err) {
  return guarded(err, [&] {
    if (p->value_w >= 0) fail("the policy already has a value head");
    if (p->sharded()) fail("add the value head before sharding the optimizer state");
    torch::NoGradGuard ng;
    p->value_w = p->add("value_head.weight", {1, p->cfg.hidden_size});
    p->value_b = p->add("value_head.bias", {1});
    for (int i : {p->value_w, p->value_b}) p->params[i].requires_grad_(p->trainable);
    if (p->grad32.size() > 0) p->grad32.resize(p->params.size());
    if (!p->exp_avg.empty()) extend_optimizer(*p);  // fresh moments for the head; the others' are kept
  });
}

int rc_policy_values(rc_policy* p, int64_t batch, int64_t len, const int32_t* tokens, const int64_t* lengths,
                     const float* mask, float* values, char** err) {
  return guarded(err, [&] {
    if (p->value_w < 0) fail("values: the policy has no value head (rc_policy_add_value_head)");
    torch::NoGradGuard ng;
    check_tokens(*p, batch * len, tokens);
    std::memset(values, 0, sizeof(float) * batch * len);
    auto tok = device_tensor(*p, tokens, {batch, len}, torch::kInt32).to(torch::kLong);
    auto idx = scored_positions(*p, batch, len, lengths, mask);
    if (idx.numel() == 0) return;
    auto h = forward_full(*p, tok).reshape({batch * len, -1}).index_select(0, idx);
    auto v = value_of(*p, h).to(torch::kCPU).contiguous();
    auto idx_cpu = idx.to(torch::kCPU);
    auto ii = idx_cpu.accessor<int64_t, 1>();
    auto va = v.accessor<float, 1>();
    for (int64_t i = 0; i < idx_cpu.size(0); i++) values[ii[i]] = va[i];
  });
}

int rc_policy_step(rc_policy* p, const rc_adamw_opts* o, double* grad_norm, char** err) {
  return guarded(err, [&] {
    if (!p->trainable) fail("step on a frozen policy");
    torch::NoGradGuard ng;
    ensure_optimizer(*p);
    std::vector<Tensor> grads;  // float32 sums over the micro-batches
    for (size_t i = 0; i < p->params.size(); i++) grads.push_back(p->grad(i));
    // A parameter above kStepSlice elements (a large vocabulary's
    // embedding) is updated slice by slice, so the step's float32
    // temporaries are a few slices (kStepSlice × 4 bytes each), not a few
    // copies of it; the update is elementwise, so the weights get the same
    // bits. Smaller parameters (every parameter of the tiny presets) are
    // one slice, as before.
    // fn(cut) for each slice of n elements, cut(t) being that slice of a
    // tensor of n elements (t itself when one slice holds them all).
    auto slices = [&](int64_t n, auto fn) {
      if (n <= kStepSlice) return fn([](const Tensor& t) { return t; });
      for (int64_t off = 0; off < n; off += kStepSlice)
        fn([off, len = std::min(kStepSlice, n - off)](const Tensor& t) {
          if (!t.is_contiguous()) fail("step: a non-contiguous tensor cannot be updated in slices");
          return t.view({-1}).narrow(0, off, len);
        });
    };
    // The norm: sharded sums (ZeRO-2) kept their terms when they were
    // reduced, computed by the same code from the same whole sums.
    auto total = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(p->device));
    bool kept = p->grads_sharded();
    for (size_t i = 0; i < grads.size(); i++) {
      if (!grads[i].defined()) continue;
      for (auto& t : kept ? p->norm_terms[i] : grad_norm_terms(grads[i])) total = total + t;
    }
    double norm = std::sqrt(total.item<double>());
    *grad_norm = norm;
    if (!std::isfinite(norm)) {  // skip the update; keep the state clean
      p->clear_grads();
      return;
    }
    double coef = 1.0;
    if (o->max_grad_norm > 0 && norm > o->max_grad_norm) coef = o->max_grad_norm / (norm + 1e-6);
    p->step++;
    double bc1 = 1.0 - std::pow(o->beta1, (double)p->step), bc2 = 1.0 - std::pow(o->beta2, (double)p->step);
    for (size_t i = 0; i < p->params.size(); i++) {
      if (!grads[i].defined()) continue;
      // Sharded (ZeRO-1): this rank's share of the elements only; the
      // others come with rc_dist_gather_params. The update is elementwise,
      // so a share's elements get exactly the bits the whole would.
      Tensor g = grads[i], param = p->params[i];
      if (p->sharded()) {
        auto lo = p->own_lo[i], n = p->own_hi[i] - lo;
        if (n == 0) continue;
        g = g.reshape({-1}).narrow(0, lo, n);
        param = param.view({-1}).narrow(0, lo, n);
      }
      auto w = p->master.empty() ? param : p->master[i];
      bool value = (int)i == p->value_w || (int)i == p->value_b;
      double lr = value && o->value_lr > 0 ? o->value_lr : o->lr;
      slices(g.numel(), [&](auto cut) {
        Tensor gs = cut(g), ws = cut(w), m = cut(p->exp_avg[i]), v = cut(p->exp_avg_sq[i]);
        if (coef != 1.0) gs = gs * coef;
        ws.mul_(1.0 - lr * o->weight_decay);
        m.mul_(o->beta1).add_(gs, 1.0 - o->beta1);
        v.mul_(o->beta2).addcmul_(gs, gs, 1.0 - o->beta2);
        auto denom = (v.sqrt() / std::sqrt(bc2)).add_(o->eps);
        ws.addcdiv_(m, denom, -lr / bc1);
        if (!p->master.empty()) cut(param).copy_(ws);
      });
    }
    p->clear_grads();
  });
}

int rc_policy_shard_optimizer(rc_policy* p, int64_t rank, int64_t world, char** err) {
  return guarded(err, [&] { shard_optimizer(*p, rank, world); });
}

int rc_policy_zero_grad(rc_policy* p, char** err) {
  return guarded(err, [&] { p->clear_grads(); });
}

int rc_policy_prepare_update(rc_policy* p, int64_t bucket_bytes, char** err) {
  return guarded(err, [&] {
    if (!p->trainable) fail("prepare_update on a frozen policy");
    torch::NoGradGuard ng;
    ensure_optimizer(*p);
    if (bucket_bytes > 0) p->bucket_grads(bucket_bytes);
  });
}

int rc_policy_reset_optimizer(rc_policy* p, char** err) {
  return guarded(err, [&] {
    torch::NoGradGuard ng;
    for (auto& t : p->exp_avg) t.zero_();
    for (auto& t : p->exp_avg_sq) t.zero_();
    p->step = 0;
  });
}

}  // extern "C"
