// recal_params.cc — the tensors a checkpoint holds: the policy's parameters
// and the optimizer's state, listed, read and written by name in a
// checkpoint's dtypes, and random initialisation. Every entry point Go calls
// is in the extern "C" block (recal.h).

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

// Copies src (flat, any dtype) into elements [offset, offset + its length)
// of parameter i, in flat order, and into the parameter's float32 master
// copy where there is one (sharded: the part in this rank's share).
void set_param_elems(rc_policy& p, int i, const Tensor& src, int64_t offset) {
  auto n = src.numel();
  p.params[i].view({-1}).narrow(0, offset, n).copy_(src);
  if (p.master.empty()) return;
  int64_t lo = p.sharded() ? p.own_lo[i] : 0, hi = p.sharded() ? p.own_hi[i] : p.params[i].numel();
  int64_t a = std::max(lo, offset), b = std::min(hi, offset + n);
  if (a < b) p.master[i].view({-1}).narrow(0, a - lo, b - a).copy_(src.narrow(0, a - offset, b - a));
}

}  // namespace

extern "C" {

int rc_policy_param_info(rc_policy* p, int64_t i, const char** name, int32_t* ndim, int64_t* shape, char** err) {
  return guarded(err, [&] {
    if (i < 0 || i >= (int64_t)p->params.size()) fail("parameter index out of range");
    *name = p->names[i].c_str();
    auto s = p->params[i].sizes();
    *ndim = (int32_t)s.size();
    for (size_t d = 0; d < s.size() && d < 4; d++) shape[d] = s[d];
  });
}

int rc_policy_set_param(rc_policy* p, const char* name, int32_t dtype, const void* data, int64_t nbytes, char** err) {
  return guarded(err, [&] {
    torch::NoGradGuard ng;
    // An optimizer tensor of a sharded policy is given whole (as a
    // checkpoint holds it); this rank keeps its share.
    if (p->sharded() && p->index.find(name) == p->index.end()) {
      for (size_t k = 0; k < p->state_names.size(); k++) {
        if (p->state_names[k] != name) continue;
        size_t n = p->params.size(), i = k % n;
        auto& dst = k < n ? p->exp_avg[i] : k < 2 * n ? p->exp_avg_sq[i] : p->master[i];
        auto st = scalar_type(dtype);
        auto want = p->params[i].numel() * (int64_t)c10::elementSize(st);
        if (nbytes != want)
          fail("tensor \"" + std::string(name) + "\": " + std::to_string(nbytes) + " bytes, want " + std::to_string(want) +
               " for shape " + shape_str(p->params[i].sizes()));
        auto src = torch::from_blob(const_cast<void*>(data), {p->params[i].numel()}, torch::TensorOptions().dtype(st));
        dst.copy_(src.narrow(0, p->own_lo[i], p->own_hi[i] - p->own_lo[i]));
        return;
      }
    }
    auto dst = p->find_tensor(name);
    auto st = scalar_type(dtype);
    auto want = dst.numel() * (int64_t)c10::elementSize(st);
    if (nbytes != want)
      fail("tensor \"" + std::string(name) + "\": " + std::to_string(nbytes) + " bytes, want " + std::to_string(want) +
           " for shape " + shape_str(dst.sizes()));
    auto src = torch::from_blob(const_cast<void*>(data), dst.sizes(), torch::TensorOptions().dtype(st));
    // A parameter keeps its float32 master copy (if any) in step.
    auto it = p->index.find(name);
    if (it != p->index.end())
      set_param_elems(*p, it->second, src.reshape({-1}), 0);
    else
      dst.copy_(src);
  });
}

int rc_policy_set_param_range(rc_policy* p, const char* name, int32_t dtype, int64_t offset, const void* data,
                              int64_t nbytes, char** err) {
  return guarded(err, [&] {
    torch::NoGradGuard ng;
    auto it = p->index.find(name);
    if (it == p->index.end()) fail("no parameter \"" + std::string(name) + "\"");
    auto i = it->second;
    auto& dst = p->params[i];
    auto st = scalar_type(dtype);
    int64_t es = (int64_t)c10::elementSize(st), numel = dst.numel();
    if (nbytes < 0 || nbytes % es != 0 || offset < 0 || offset > numel || nbytes / es > numel - offset)
      fail("tensor \"" + std::string(name) + "\": " + std::to_string(nbytes) + " bytes at element " + std::to_string(offset) +
           " do not fit its " + std::to_string(numel) + " elements");
    int64_t n = nbytes / es;
    if (n == 0) return;
    set_param_elems(*p, i, torch::from_blob(const_cast<void*>(data), {n}, torch::TensorOptions().dtype(st)), offset);
  });
}

int rc_policy_get_param(rc_policy* p, const char* name, int32_t dtype, void* buf, int64_t nbytes, char** err) {
  return guarded(err, [&] {
    torch::NoGradGuard ng;
    auto src = p->find_tensor(name);
    auto st = scalar_type(dtype);
    auto want = src.numel() * (int64_t)c10::elementSize(st);
    if (nbytes != want)
      fail("tensor \"" + std::string(name) + "\": buffer of " + std::to_string(nbytes) + " bytes, want " + std::to_string(want));
    auto t = src.detach().to(torch::kCPU).to(st).contiguous();
    std::memcpy(buf, t.data_ptr(), (size_t)want);
  });
}

int rc_policy_init_random(rc_policy* p, uint64_t seed, double std, char** err) {
  return guarded(err, [&] {
    torch::NoGradGuard ng;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    for (size_t i = 0; i < p->params.size(); i++) {
      auto& t = p->params[i];
      const auto& n = p->names[i];
      Tensor v;
      if (n.find("norm.weight") != std::string::npos)
        v = torch::ones(t.sizes());
      else if (t.dim() == 1)
        v = torch::zeros(t.sizes());
      else
        v = at::normal(0.0, std, t.sizes(), gen);
      t.copy_(v);
      if (!p->master.empty()) p->master[i].copy_(v);
    }
  });
}

int rc_policy_state_names(rc_policy* p, const char*** names, int64_t* count, char** err) {
  return guarded(err, [&] {
    if (p->trainable) ensure_optimizer(*p);
    *names = p->state_name_ptrs.empty() ? nullptr : p->state_name_ptrs.data();
    *count = (int64_t)p->state_name_ptrs.size();
  });
}

int rc_policy_state_step(rc_policy* p, int64_t* step, char** err) {
  return guarded(err, [&] { *step = p->step; });
}

int rc_policy_set_state_step(rc_policy* p, int64_t step, char** err) {
  return guarded(err, [&] {
    if (step < 0) fail("negative optimizer step");
    p->step = step;
  });
}

}  // extern "C"
