// recal_internal.h — definitions shared by the bridge's C++ files (recal.cc,
// recal_dist.cc); not part of the C ABI. It holds the policy's layout, so
// that the distributed operations can reach its gradients, and the error
// convention of every extern "C" entry point.
#ifndef RECAL_INTERNAL_H
#define RECAL_INTERNAL_H

#include "recal.h"

#include <torch/torch.h>

#include <cstring>
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
};

// Runs fn, converting every exception into a status and a malloc'd message.
template <typename Fn>
int guarded(char** err, Fn&& fn) {
  try {
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

  // Moves the gradients autograd left in .grad into the float32 sums.
  void flush_grads() {
    torch::NoGradGuard ng;
    if (grad32.size() != params.size()) grad32.resize(params.size());
    for (size_t i = 0; i < params.size(); i++) {
      auto& t = params[i];
      torch::Tensor g;
      if (t.grad().defined()) g = t.grad().to(torch::kFloat32);  // float32 .grad: the same tensor, no copy
      if ((int)i == lm_head && head_grad.defined()) g = g.defined() ? head_grad.add_(g) : head_grad;
      if (!g.defined()) continue;
      if (grad32[i].defined())
        grad32[i].add_(g);
      else
        grad32[i] = g;
      t.mutable_grad() = torch::Tensor();
    }
    head_grad = torch::Tensor();
  }

  // Drops every gradient.
  void clear_grads() {
    for (auto& t : params) t.mutable_grad() = torch::Tensor();
    grad32.clear();
    head_grad = torch::Tensor();
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
      size_t n = params.size();
      if (i < n) return exp_avg[i];
      if (i < 2 * n) return exp_avg_sq[i - n];
      return master[i - 2 * n];
    }
    recal::fail("no tensor named \"" + name + "\"");
  }
};

#endif  // RECAL_INTERNAL_H
