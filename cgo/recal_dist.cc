// recal_dist.cc — data-parallel collectives for recal on libtorch's c10d:
// rendezvous through a TCPStore hosted by rank 0 (or by the launcher:
// torchrun's agent store), a ProcessGroupGloo on CPU
// (and a ProcessGroupNCCL for CUDA gradients when built against a CUDA
// libtorch, USE_C10D_NCCL), the bucketed all-reduce of a policy's gradients,
// and all-gather and broadcast of byte buffers. Every entry point catches
// every C++ exception and reports it through its err out-parameter (see
// recal.h).
//
// Failure model: every collective waits at most the group's timeout. A dead
// peer closes its sockets, so Gloo usually fails at once ("Connection closed
// by peer"); a live but absent peer fails after the timeout. After a failure
// the group is left unusable (Gloo's pairs are in an error state, and a
// timed-out operation may still own its buffers), so later calls return the
// first failure without communicating.

#include "recal_internal.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_GLOO
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#endif

#ifdef RECAL_GLOO_SEGMENTS
#include <dlfcn.h>
#include <gloo/allreduce.h>
#include <gloo/math.h>
#endif

#include <algorithm>
#include <chrono>
#include <limits>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

using recal::fail;
using recal::guarded;

#ifdef USE_C10D_GLOO

#ifdef RECAL_GLOO_SEGMENTS
// The gradient all-reduce calls Gloo's allreduce itself (SegmentedAllreduce).
// These are the Gloo functions it reaches that are not inline in Gloo's
// headers: weak references, resolved when the process starts from the
// libgloo that Debian's libtorch loads, so the bridge links without -lgloo
// (cgo's flags name libtorch's libraries only); gloo_linked says whether
// they were.
asm(".weak _ZN4gloo9allreduceERKNS_16AllreduceOptionsE");
asm(".weak _ZNK4gloo7Context10getTimeoutEv");
asm(".weak _ZN4gloo7Context19createUnboundBufferEPvm");

namespace {

// The most bytes Gloo's ring all-reduce moves per step of its pipeline. c10d
// keeps Gloo's default, 1 MiB, which it does not let a caller change: a
// bucket holding the embedding's gradient (78 MB for the tiny preset, 545 MB
// for Qwen2.5-0.5B) then takes 76 to 520 steps with 2 ranks, each a
// hand-over between Gloo's worker and its socket thread. With 4 MiB the same ring
// moves the same bytes in fewer, larger steps: 2 ranks on loopback, the
// tiny and small presets' buckets (Gloo alone, two buckets at a time on
// two threads as c10d runs them), 15–20 % less time on the 2-core VM, and
// no change for 25 MiB buckets; 8 MiB did as well, 16 MiB or more was
// slower (too few steps left to overlap the ring's sends and reductions).
// Gloo's scratch per all-reduce grows from 2 MiB to 8 MiB.
constexpr size_t kSegmentBytes = 4 << 20;

// Whether the weak Gloo references above resolved to the libgloo whose
// headers this file was compiled with (Debian's, which its libtorch loads).
bool gloo_linked() {
  static const bool ok = [] {
    const char* syms[] = {"_ZN4gloo9allreduceERKNS_16AllreduceOptionsE", "_ZNK4gloo7Context10getTimeoutEv",
                          "_ZN4gloo7Context19createUnboundBufferEPvm"};
    for (auto s : syms) {
      void* f = dlsym(RTLD_DEFAULT, s);
      Dl_info info;
      if (!f || !dladdr(f, &info) || !info.dli_fname || !std::strstr(info.dli_fname, "libgloo.so")) return false;
    }
    return true;
  }();
  return ok;
}

// c10d's Gloo process group with the members a subclass may use opened to
// the bridge: its tags, contexts and work queue run SegmentedAllreduce on
// c10d's own worker threads, in the order of c10d's other collectives.
struct GlooGroup : c10d::ProcessGroupGloo {
  using ProcessGroupGloo::ProcessGroupGloo;
  using ProcessGroupGloo::enqueue;
  using ProcessGroupGloo::getContext;
  using ProcessGroupGloo::nextTag;
};

// One float32 bucket's all-reduce (sum) as c10d's allreduce runs it (Gloo's
// ring, on a worker thread of c10d's, waited on like c10d's own work), in
// pipeline steps of up to kSegmentBytes.
struct SegmentedAllreduce : c10d::ProcessGroupGloo::AsyncWork {
  SegmentedAllreduce(std::shared_ptr<gloo::Context> ctx, at::Tensor t, uint32_t tag)
      : AsyncWork({{t}}, "recal:allreduce_grads"), ctx_(std::move(ctx)), t_(std::move(t)), tag_(tag) {}
  void run() override {
    gloo::AllreduceOptions o(ctx_);
    o.setOutput(t_.data_ptr<float>(), (size_t)t_.numel());
    o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    o.setTag(tag_);
    o.setMaxSegmentSize(kSegmentBytes);
    gloo::allreduce(o);
  }

 private:
  std::shared_ptr<gloo::Context> ctx_;
  at::Tensor t_;
  uint32_t tag_;
};

}  // namespace

using GlooPG = GlooGroup;
#else
using GlooPG = c10d::ProcessGroupGloo;
#endif

struct rc_dist {
  int rank = 0, size = 1;
  std::chrono::milliseconds timeout{300000};
  int64_t bucket_bytes = 0;
  c10::intrusive_ptr<c10d::Store> store;  // the TCPStore, or a PrefixStore over the launcher's
  c10::intrusive_ptr<GlooPG> gloo;        // bytes, barrier, CPU gradients
#ifdef USE_C10D_NCCL
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl;  // CUDA gradients
#endif
  std::string broken;  // the first failure; non-empty makes every later call fail
  // ZeRO-2: the policies whose gradients are sharded over this group
  // (rc_dist_shard_gradients), and the bucket all-reduces in flight.
  std::vector<rc_policy*> grad_policies;
  std::vector<std::pair<size_t, c10::intrusive_ptr<c10d::Work>>> pending;
};

namespace {

// Runs one collective (fn), turning any failure into a message naming the
// operation and this rank, and leaving the group unusable.
template <typename Fn>
void collective(rc_dist* d, const char* op, Fn&& fn) {
  auto where = std::string(op) + " (rank " + std::to_string(d->rank) + " of " + std::to_string(d->size) + ")";
  if (!d->broken.empty()) fail(where + ": the group failed earlier: " + d->broken);
  std::string msg;
  try {
    fn();
    return;
  } catch (const c10::Error& e) {
    msg = e.what_without_backtrace();
  } catch (const std::exception& e) {
    msg = e.what();
  } catch (...) {
    msg = "unknown C++ exception";
  }
  d->broken = where + ": " + msg;
  fail(d->broken);
}

// Waits for w within the group's timeout; rethrows its failure.
void wait(rc_dist* d, const c10::intrusive_ptr<c10d::Work>& w) { w->wait(d->timeout); }

torch::Tensor bytes(int64_t n) { return torch::empty({n}, torch::TensorOptions().dtype(torch::kUInt8)); }

// All-gathers one int64 per rank.
std::vector<int64_t> allgather_i64(rc_dist* d, int64_t v) {
  auto in = torch::full({1}, v, torch::TensorOptions().dtype(torch::kInt64));
  std::vector<torch::Tensor> inputs{in};
  std::vector<std::vector<torch::Tensor>> outputs(1);
  for (int r = 0; r < d->size; r++) outputs[0].push_back(torch::empty_like(in));
  c10d::AllgatherOptions o;
  o.timeout = d->timeout;
  wait(d, d->gloo->allgather(outputs, inputs, o));
  std::vector<int64_t> out;
  for (auto& t : outputs[0]) out.push_back(t.item<int64_t>());
  return out;
}

// Broadcasts t (in place) from root.
void broadcast(rc_dist* d, torch::Tensor& t, int root) {
  std::vector<torch::Tensor> ts{t};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  o.timeout = d->timeout;
  wait(d, d->gloo->broadcast(ts, o));
}

c10::intrusive_ptr<c10d::Work> allreduce(rc_dist* d, torch::Tensor& t) {
#ifdef RECAL_GLOO_SEGMENTS
  if (t.device().is_cpu() && t.scalar_type() == torch::kFloat32 && t.is_contiguous() && t.numel() > 0 &&
      gloo_linked()) {
    auto tag = d->gloo->nextTag();
    auto w = c10::make_intrusive<SegmentedAllreduce>(d->gloo->getContext(tag), t, tag);
    d->gloo->enqueue(w);
    return w;
  }
#endif
  std::vector<torch::Tensor> ts{t};
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::SUM;
  o.timeout = d->timeout;
#ifdef USE_C10D_NCCL
  if (t.is_cuda()) {
    if (!d->nccl) fail("gradients on " + t.device().str() + " need the nccl backend");
    return d->nccl->allreduce(ts, o);
  }
#endif
  return d->gloo->allreduce(ts, o);
}

// ZeRO-2 (rc_dist_shard_gradients). When each bucket of p is complete and
// the order every rank reduces them in: a bucket of layer parameters only
// after the backward of the lowest layer it holds (checkpointed layers
// report it: rc_policy::after_layer), any other (the embedding, the output
// head, the final norm, a value head) at the end; by that layer, then by
// index, descending, as the backward makes them.
void order_buckets(rc_policy* p) {
  std::vector<int64_t> layer_of(p->params.size(), -1);
  for (size_t l = 0; l < p->layers.size(); l++) {
    const auto& ly = p->layers[l];
    for (int i : {ly.in_norm, ly.q_w, ly.q_b, ly.k_w, ly.k_b, ly.v_w, ly.v_b, ly.o_w, ly.post_norm, ly.gate, ly.up, ly.down})
      if (i >= 0) layer_of[i] = (int64_t)l;
  }
  size_t nb = p->buckets.size();
  p->bucket_ready.assign(nb, 0);
  p->bucket_order.clear();
  for (size_t b = 0; b < nb; b++) {
    int64_t ready = std::numeric_limits<int64_t>::max();
    for (size_t i = p->bucket_spans[b].first; i < p->bucket_spans[b].second; i++) ready = std::min(ready, layer_of[i]);
    p->bucket_ready[b] = ready;
    p->bucket_order.push_back(b);
  }
  std::stable_sort(p->bucket_order.begin(), p->bucket_order.end(), [&](size_t a, size_t b) {
    return p->bucket_ready[a] != p->bucket_ready[b] ? p->bucket_ready[a] > p->bucket_ready[b] : a > b;
  });
  p->buckets_reduced = 0;
}

// Starts the all-reduce of the next buckets in p's order that are complete
// once layer's backward is done (layer -1: all the rest). Gradients of
// theirs still in .grad (a bfloat16 policy's) join their sums first
// (rc_policy::flush_grad).
void launch_ready(rc_dist* d, rc_policy* p, int64_t layer) {
  while (p->buckets_reduced < p->bucket_order.size()) {
    size_t b = p->bucket_order[p->buckets_reduced];
    if (layer >= 0 && p->bucket_ready[b] < layer) break;
    for (size_t i = p->bucket_spans[b].first; i < p->bucket_spans[b].second; i++) p->flush_grad(i);
    collective(d, "allreduce_grads", [&] { d->pending.emplace_back(b, allreduce(d, p->buckets[b])); });
    p->buckets_reduced++;
  }
}

// Waits for the first n bucket all-reduces in flight; for each, keeps its
// parameters' gradient norm terms, then gives back the bucket's pages that
// hold none of this rank's shares (what is left there is never read: the
// step reads the shares, and zeroes the buckets after).
void settle(rc_dist* d, rc_policy* p, size_t n) {
  n = std::min(n, d->pending.size());
  if (p->norm_terms.size() != p->params.size()) p->norm_terms.assign(p->params.size(), {});
  for (size_t k = 0; k < n; k++) {
    auto [b, w] = d->pending[k];
    collective(d, "allreduce_grads", [&] { wait(d, w); });
    for (size_t i = p->bucket_spans[b].first; i < p->bucket_spans[b].second; i++)
      p->norm_terms[i] = recal::grad_norm_terms(p->grad32[i]);
    auto& t = p->buckets[b];
    if (!t.device().is_cpu()) continue;
    auto base = (uintptr_t)t.data_ptr();
    auto drop = [](uintptr_t from, uintptr_t to) {
      auto [lo, hi] = rc_policy::inner_pages(from, to);
      if (hi > lo) madvise((void*)lo, hi - lo, MADV_DONTNEED);  // refused: the pages stay, nothing else changes
    };
    uintptr_t kept = base;  // the end of the last share
    int64_t off = 0;
    for (size_t i = p->bucket_spans[b].first; i < p->bucket_spans[b].second; i++) {
      int64_t lo = p->own_lo[i], hi = p->own_hi[i];
      if (hi > lo) {
        drop(kept, base + (uintptr_t)(off + lo) * 4);
        kept = base + (uintptr_t)(off + hi) * 4;
      }
      off += p->params[i].numel();
    }
    drop(kept, base + t.nbytes());
  }
  d->pending.erase(d->pending.begin(), d->pending.begin() + n);
}

// Ends p's ZeRO-2 on d (either is being freed, or it is turned off).
void unlink(rc_dist* d, rc_policy* p) {
  p->grad_group = nullptr;
  p->after_layer = nullptr;
  p->norm_terms.clear();
  d->grad_policies.erase(std::remove(d->grad_policies.begin(), d->grad_policies.end(), p), d->grad_policies.end());
}

}  // namespace

namespace recal {
void forget_grad_group(rc_policy* p) {
  if (p->grad_group) unlink(p->grad_group, p);
}
}  // namespace recal

extern "C" {

int rc_dist_new(const rc_dist_opts* o, rc_dist** out, char** err) {
  return guarded(err, [&] {
    *out = nullptr;
    if (o->world_size < 1) fail("process group: world size " + std::to_string(o->world_size) + ": want at least 1");
    if (o->rank < 0 || o->rank >= o->world_size)
      fail("process group: rank " + std::to_string(o->rank) + ": want 0 to " + std::to_string(o->world_size - 1));
    if (o->master_port < 1 || o->master_port > 65535)
      fail("process group: master port " + std::to_string(o->master_port) + ": want 1 to 65535");
    std::string addr = o->master_addr ? o->master_addr : "";
    if (addr.empty()) fail("process group: master address is empty");
    std::string backend = o->backend && *o->backend ? o->backend : "gloo";
    if (backend != "gloo" && backend != "nccl") fail("process group: backend \"" + backend + "\": want gloo or nccl");
#ifndef USE_C10D_NCCL
    if (backend == "nccl")
      fail("process group: backend \"nccl\": this build has no NCCL (build against a CUDA libtorch with CUDA's and NCCL's headers, see LIBTORCH and CUDA_INC in the Makefile)");
#endif
    auto d = std::make_unique<rc_dist>();
    d->rank = o->rank;
    d->size = o->world_size;
    if (o->timeout_s > 0) d->timeout = std::chrono::milliseconds((int64_t)(o->timeout_s * 1000.0));
    d->bucket_bytes = o->bucket_bytes > 0 ? o->bucket_bytes : (int64_t)25 << 20;
    auto where = "process group at " + addr + ":" + std::to_string(o->master_port) + " (rank " +
                 std::to_string(o->rank) + " of " + std::to_string(o->world_size) + ", " + backend + "): ";
    std::string stage = "rendezvous: ";
    try {
      // Rendezvous: rank 0 hosts the store and waits for every rank to
      // connect; or, under torchrun's agent store, the launcher hosts it and
      // every rank is a client using the keys under the attempt's prefix
      // (torch.distributed.rendezvous._create_c10d_store does the same).
      bool agent = o->store_prefix != nullptr;
      c10d::TCPStoreOptions so;
      so.port = (uint16_t)o->master_port;
      so.isServer = !agent && o->rank == 0;
      so.numWorkers = (size_t)o->world_size;
      so.waitWorkers = !agent;  // with the agent's store the joined/ keys below do the waiting
      so.timeout = d->timeout;
      auto tcp = c10::make_intrusive<c10d::TCPStore>(addr, so);
      if (agent)
        d->store = c10::make_intrusive<c10d::PrefixStore>(o->store_prefix, tcp);
      else
        d->store = tcp;
      // Every rank checks in, so a missing one is named rather than left
      // to surface as a socket timeout inside Gloo.
      std::vector<std::string> keys;
      for (int r = 0; r < o->world_size; r++) keys.push_back("recal/joined/" + std::to_string(r));
      d->store->set(keys[o->rank], std::vector<uint8_t>{1});
      try {
        d->store->wait(keys, d->timeout);
      } catch (const std::exception&) {
        std::string missing;
        for (int r = 0; r < o->world_size; r++)
          if (!d->store->check({keys[r]})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        if (missing.empty()) throw;
        std::ostringstream m;
        m << "rank(s) " << missing << " did not join within " << d->timeout.count() / 1000.0 << " s";
        fail(m.str());
      }
      stage = "gloo: ";

      // Gloo, as torch.distributed makes it: the interface GLOO_SOCKET_IFNAME
      // names, else the address this host's name resolves to (loopback when
      // it resolves to none).
      auto go = c10d::ProcessGroupGloo::Options::create(d->timeout);
      const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
      go->devices.push_back(ifname && *ifname ? c10d::ProcessGroupGloo::createDeviceForInterface(ifname)
                                              : c10d::ProcessGroupGloo::createDefaultDevice());
      go->threads = 2;
      auto gstore = c10::make_intrusive<c10d::PrefixStore>("recal/gloo", d->store);
      d->gloo = c10::make_intrusive<GlooPG>(gstore, o->rank, o->world_size, go);
#ifdef USE_C10D_NCCL
      if (backend == "nccl") {
        // Without blocking wait a failed NCCL collective hangs the host; with
        // it, waits honour the timeout. Read when the group is made.
        setenv("NCCL_BLOCKING_WAIT", "1", 0);
        setenv("TORCH_NCCL_BLOCKING_WAIT", "1", 0);
        stage = "nccl: ";
        auto no = c10d::ProcessGroupNCCL::Options::create();
        no->timeout = d->timeout;
        auto nstore = c10::make_intrusive<c10d::PrefixStore>("recal/nccl", d->store);
        d->nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(nstore, o->rank, o->world_size, no);
      }
#endif
    } catch (const c10::Error& e) {
      fail(where + stage + e.what_without_backtrace());
    } catch (const std::exception& e) {
      fail(where + stage + e.what());
    }
    *out = d.release();
  });
}

void rc_dist_free(rc_dist* d) {
  try {
    if (!d) return;
    d->pending.clear();
    while (!d->grad_policies.empty()) unlink(d, d->grad_policies.back());
    delete d;  // joins Gloo's threads; waits for queued work (bounded by the timeout)
  } catch (...) {
  }
}

int rc_dist_allreduce_grads(rc_dist* d, rc_policy* p, char** err) {
  return guarded(err, [&] {
    if (!p->trainable) fail("allreduce_grads: the policy is frozen");
    torch::NoGradGuard ng;
    p->flush_grads();  // the float32 sums hold every gradient from here on
    // The sums live in the policy's buckets from the first call on (the
    // gradients as bucket views): each bucket is all-reduced where it is.
    p->bucket_grads(d->bucket_bytes);
    if (p->grad_group == d) {  // ZeRO-2: the buckets an armed backward left, in the same order
      p->after_layer = nullptr;
      if (p->bucket_order.size() != p->buckets.size()) fail("allreduce_grads: the gradient buckets changed while sharded");
      launch_ready(d, p, -1);
      settle(d, p, d->pending.size());
      return;
    }
    collective(d, "allreduce_grads", [&] {
      std::vector<c10::intrusive_ptr<c10d::Work>> works;
      for (auto& b : p->buckets) works.push_back(allreduce(d, b));
      for (auto& w : works) wait(d, w);
    });
  });
}

int rc_dist_shard_gradients(rc_dist* d, rc_policy* p, int32_t on, char** err) {
  return guarded(err, [&] {
    if (!on) {
      if (p->grad_group == d) unlink(d, p);
      return;
    }
    if (p->grad_group == d) return;
    if (p->grad_group) fail("shard_gradients: the policy's gradients are sharded over another group");
    if (!p->trainable) fail("shard_gradients: the policy is frozen");
    if (!p->device.is_cpu())
      fail("shard_gradients: the policy is on " + p->device.str() + "; sharded gradients give their memory back on the CPU only");
    if (p->shard_world != d->size || p->shard_rank != d->rank || d->size < 2)
      fail("shard_gradients: the optimizer must be sharded over this group of " + std::to_string(d->size) +
           " ranks first (rank " + std::to_string(p->shard_rank) + " of " + std::to_string(p->shard_world) + " now; at least 2)");
    if (p->buckets.empty() || p->bucketed_params != p->params.size())
      fail("shard_gradients: the gradient buckets must be made first (rc_dist_prepare_update)");
    order_buckets(p);
    p->grad_group = d;
    d->grad_policies.push_back(p);
  });
}

int rc_dist_reduce_in_backward(rc_dist* d, rc_policy* p, char** err) {
  return guarded(err, [&] {
    if (p->grad_group != d) fail("reduce_in_backward: the policy's gradients are not sharded over this group (rc_dist_shard_gradients)");
    if (p->buckets_reduced > 0) fail("reduce_in_backward: this update's buckets are being reduced already");
    if (p->bucket_order.size() != p->buckets.size() || p->bucketed_params != p->params.size())
      fail("reduce_in_backward: the gradient buckets changed since rc_dist_shard_gradients");
    p->after_layer = [d, p](int64_t layer) {
      // Start the buckets this layer completed, then settle those started
      // before (their all-reduces ran during this layer's backward).
      size_t older = d->pending.size();
      launch_ready(d, p, layer);
      settle(d, p, older);
    };
  });
}

int rc_dist_prepare_update(rc_dist* d, rc_policy* p, char** err) {
  return rc_policy_prepare_update(p, d->bucket_bytes, err);
}

int rc_dist_gather_params(rc_dist* d, rc_policy* p, char** err) {
  return guarded(err, [&] {
    if (p->shard_world != d->size || p->shard_rank != d->rank)
      fail("gather_params: the policy's optimizer is sharded as rank " + std::to_string(p->shard_rank) + " of " +
           std::to_string(p->shard_world) + ", the group is rank " + std::to_string(d->rank) + " of " +
           std::to_string(d->size));
    if (!p->sharded()) return;
    torch::NoGradGuard ng;
    // In rounds: rank r's elements are its shares of the parameters, one
    // after the other in parameter order; in round k every rank sends its
    // elements k·cap … (k+1)·cap, at most cap elements, about
    // bucket_bytes. The buffers (this rank's piece, every rank's, and
    // c10d's flat copy of them) then hold one round of every rank's
    // shares, however large a parameter is. The rounds depend on the
    // shapes alone: every rank cuts the same ones.
    int64_t es = (int64_t)c10::elementSize(p->dtype);
    int64_t cap = std::max<int64_t>(1 << 16, d->bucket_bytes / es);
    size_t n = p->params.size();
    // at[r][i]: where parameter i's share starts among rank r's elements.
    std::vector<std::vector<int64_t>> at(d->size, std::vector<int64_t>(n + 1, 0));
    int64_t longest = 0;
    for (int r = 0; r < d->size; r++) {
      for (size_t i = 0; i < n; i++) {
        auto s = p->share(i, r, d->size);
        at[r][i + 1] = at[r][i] + (s.second - s.first);
      }
      longest = std::max(longest, at[r][n]);
    }
    auto flat = [&](size_t i) { return p->params[i].view({-1}).view(torch::kUInt8); };
    auto opts = torch::TensorOptions().dtype(torch::kUInt8).device(p->device);
    // Copies between rank r's elements [k·cap, (k+1)·cap) and buf (a short
    // last round leaves the rest of buf unused): into buf when out.
    auto move = [&](int r, int64_t k, const torch::Tensor& buf, bool out) {
      int64_t g0 = k * cap, g1 = std::min(g0 + cap, at[r][n]);
      for (size_t i = 0; i < n; i++) {
        int64_t lo = std::max(g0, at[r][i]), hi = std::min(g1, at[r][i + 1]);
        if (hi <= lo) continue;
        auto first = p->share(i, r, d->size).first + (lo - at[r][i]);
        auto pv = flat(i).narrow(0, first * es, (hi - lo) * es);
        auto bv = buf.narrow(0, (lo - g0) * es, (hi - lo) * es);
        if (out)
          bv.copy_(pv);
        else
          pv.copy_(bv);
      }
    };
    for (int64_t k = 0; k * cap < longest; k++) {
      auto mine = torch::zeros({cap * es}, opts);  // the values travel as bytes (Gloo has no bfloat16)
      move(d->rank, k, mine, true);
      std::vector<torch::Tensor> all;
      for (int r = 0; r < d->size; r++) all.push_back(torch::empty({cap * es}, opts));
      collective(d, "gather_params", [&] {
        std::vector<std::vector<torch::Tensor>> outputs{all};
        std::vector<torch::Tensor> inputs{mine};
        c10d::AllgatherOptions o;
        o.timeout = d->timeout;
#ifdef USE_C10D_NCCL
        if (mine.is_cuda()) {
          if (!d->nccl) fail("parameters on " + mine.device().str() + " need the nccl backend");
          wait(d, d->nccl->allgather(outputs, inputs, o));
          all = outputs[0];
          return;
        }
#endif
        wait(d, d->gloo->allgather(outputs, inputs, o));
        all = outputs[0];
      });
      for (int r = 0; r < d->size; r++)
        if (r != d->rank) move(r, k, all[r], false);
    }
  });
}

int rc_dist_gather_state(rc_dist* d, rc_policy* p, int32_t root, char** err) {
  return guarded(err, [&] {
    if (root < 0) {  // drop what an earlier call gathered
      p->gathered.clear();
      return;
    }
    if (root >= d->size) fail("gather_state: root " + std::to_string(root) + " of " + std::to_string(d->size));
    if (!p->sharded()) return;
    if (p->shard_world != d->size || p->shard_rank != d->rank) fail("gather_state: the policy is sharded for another group");
    torch::NoGradGuard ng;
    recal::ensure_optimizer(*p);
    // Per rank: its shares of exp_avg, exp_avg_sq (and master), in state
    // order, as one CPU float32 buffer padded to the longest.
    size_t n = p->params.size(), kinds = p->master.empty() ? 2 : 3;
    auto kind = [&](size_t k, size_t i) -> torch::Tensor& {
      return k == 0 ? p->exp_avg[i] : k == 1 ? p->exp_avg_sq[i] : p->master[i];
    };
    std::vector<int64_t> len(d->size, 0);
    for (int r = 0; r < d->size; r++)
      for (size_t i = 0; i < n; i++) {
        auto s = p->share(i, r, d->size);
        len[r] += (int64_t)kinds * (s.second - s.first);
      }
    int64_t most = *std::max_element(len.begin(), len.end());
    auto cpu = torch::TensorOptions().dtype(torch::kFloat32);
    auto mine = torch::zeros({most}, cpu);
    int64_t off = 0;
    for (size_t k = 0; k < kinds; k++)
      for (size_t i = 0; i < n; i++) {
        auto m = kind(k, i).numel();
        if (m > 0) mine.narrow(0, off, m).copy_(kind(k, i).to(torch::kCPU));
        off += m;
      }
    std::vector<torch::Tensor> all;
    if (d->rank == root)
      for (int r = 0; r < d->size; r++) all.push_back(torch::empty({most}, cpu));
    collective(d, "gather_state", [&] {
      std::vector<std::vector<torch::Tensor>> outputs;
      if (d->rank == root) outputs.push_back(all);
      std::vector<torch::Tensor> inputs{mine};
      c10d::GatherOptions o;
      o.rootRank = root;
      o.timeout = d->timeout;
      wait(d, d->gloo->gather(outputs, inputs, o));
      if (d->rank == root) all = outputs[0];
    });
    if (d->rank != root) return;
    p->gathered.clear();
    for (size_t k = 0; k < kinds; k++)
      for (size_t i = 0; i < n; i++) p->gathered.push_back(torch::empty({p->params[i].numel()}, cpu));
    for (int r = 0; r < d->size; r++) {
      int64_t at = 0;
      for (size_t k = 0; k < kinds; k++)
        for (size_t i = 0; i < n; i++) {
          auto s = p->share(i, r, d->size);
          auto m = s.second - s.first;
          if (m > 0) p->gathered[k * n + i].narrow(0, s.first, m).copy_(all[r].narrow(0, at, m));
          at += m;
        }
    }
    for (size_t k = 0; k < kinds; k++)
      for (size_t i = 0; i < n; i++) p->gathered[k * n + i] = p->gathered[k * n + i].view(p->params[i].sizes());
  });
}

int rc_dist_allgather(rc_dist* d, const void* data, int64_t len, void** out, int64_t* lens, char** err) {
  return guarded(err, [&] {
    *out = nullptr;
    if (len < 0) fail("allgather: negative length");
    collective(d, "allgather", [&] {
      auto n = allgather_i64(d, len);
      int64_t max = 0, total = 0;
      for (int r = 0; r < d->size; r++) {
        lens[r] = n[r];
        max = std::max(max, n[r]);
        total += n[r];
      }
      if (max == 0) return;
      auto in = bytes(max);
      if (len > 0) std::memcpy(in.data_ptr(), data, (size_t)len);
      if (max > len) std::memset((char*)in.data_ptr() + len, 0, (size_t)(max - len));
      std::vector<torch::Tensor> inputs{in};
      std::vector<std::vector<torch::Tensor>> outputs(1);
      for (int r = 0; r < d->size; r++) outputs[0].push_back(bytes(max));
      c10d::AllgatherOptions o;
      o.timeout = d->timeout;
      wait(d, d->gloo->allgather(outputs, inputs, o));
      auto buf = (char*)std::malloc((size_t)total);
      if (!buf) fail("out of memory for " + std::to_string(total) + " bytes");
      int64_t off = 0;
      for (int r = 0; r < d->size; r++) {
        std::memcpy(buf + off, outputs[0][r].data_ptr(), (size_t)n[r]);
        off += n[r];
      }
      *out = buf;
    });
  });
}

int rc_dist_broadcast(rc_dist* d, int32_t root, const void* data, int64_t len, void** out, int64_t* out_len,
                      char** err) {
  return guarded(err, [&] {
    *out = nullptr;
    *out_len = 0;
    if (root < 0 || root >= d->size)
      fail("broadcast: root " + std::to_string(root) + ": want 0 to " + std::to_string(d->size - 1));
    if (d->rank == root && len < 0) fail("broadcast: negative length");
    collective(d, "broadcast", [&] {
      auto n = torch::full({1}, d->rank == root ? len : 0, torch::TensorOptions().dtype(torch::kInt64));
      broadcast(d, n, root);
      int64_t size = n.item<int64_t>();
      if (size == 0) return;
      auto buf = bytes(size);
      if (d->rank == root) std::memcpy(buf.data_ptr(), data, (size_t)size);
      broadcast(d, buf, root);
      auto res = (char*)std::malloc((size_t)size);
      if (!res) fail("out of memory for " + std::to_string(size) + " bytes");
      std::memcpy(res, buf.data_ptr(), (size_t)size);
      *out = res;
      *out_len = size;
    });
  });
}

int rc_dist_barrier(rc_dist* d, char** err) {
  return guarded(err, [&] {
    collective(d, "barrier", [&] {
      c10d::BarrierOptions o;
      o.timeout = d->timeout;
      wait(d, d->gloo->barrier(o));
    });
  });
}

}  // extern "C"

#else  // !USE_C10D_GLOO

// Without Gloo's headers (libtorch archives and pip wheels ship none; see
// GLOO_INC in the Makefile) the bridge has no process group: a job of one
// process needs none, and every rc_dist call says why there is none.
struct rc_dist {};

namespace recal {
void forget_grad_group(rc_policy*) {}
}  // namespace recal

namespace {
[[noreturn]] void no_gloo() {
  fail("process group: this build has no Gloo (its headers were not found when it was built: see GLOO_INC in the Makefile), so it runs one process only");
}
}  // namespace

extern "C" {

int rc_dist_new(const rc_dist_opts*, rc_dist** out, char** err) {
  return guarded(err, [&] {
    *out = nullptr;
    no_gloo();
  });
}

void rc_dist_free(rc_dist* d) { delete d; }

int rc_dist_allreduce_grads(rc_dist*, rc_policy*, char** err) { return guarded(err, [&] { no_gloo(); }); }

int rc_dist_gather_params(rc_dist*, rc_policy*, char** err) { return guarded(err, [&] { no_gloo(); }); }

int rc_dist_shard_gradients(rc_dist*, rc_policy*, int32_t, char** err) { return guarded(err, [&] { no_gloo(); }); }

int rc_dist_reduce_in_backward(rc_dist*, rc_policy*, char** err) { return guarded(err, [&] { no_gloo(); }); }

int rc_dist_gather_state(rc_dist*, rc_policy*, int32_t, char** err) { return guarded(err, [&] { no_gloo(); }); }

int rc_dist_allgather(rc_dist*, const void*, int64_t, void** out, int64_t*, char** err) {
  return guarded(err, [&] {
    *out = nullptr;
    no_gloo();
  });
}

int rc_dist_broadcast(rc_dist*, int32_t, const void*, int64_t, void** out, int64_t* out_len, char** err) {
  return guarded(err, [&] {
    *out = nullptr;
    *out_len = 0;
    no_gloo();
  });
}

int rc_dist_barrier(rc_dist*, char** err) { return guarded(err, [&] { no_gloo(); }); }

}  // extern "C"

#endif  // USE_C10D_GLOO

// The rendezvous store alone (rc_store_serve, for launchers and tests that
// play torchrun's agent) needs no Gloo.
extern "C" {

struct rc_store {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

int rc_store_serve(int32_t port, double timeout_s, rc_store** out, int32_t* out_port, char** err) {
  return guarded(err, [&] {
    *out = nullptr;
    if (port < 0 || port > 65535) fail("store: port " + std::to_string(port) + ": want 0 to 65535");
    c10d::TCPStoreOptions so;
    so.port = (uint16_t)port;
    so.isServer = true;
    so.waitWorkers = false;  // the workers wait for one another (their joined/ keys)
    so.numWorkers.reset();  // c10::optional (libtorch 1.x) or std::optional (2.x)
    if (timeout_s > 0) so.timeout = std::chrono::milliseconds((int64_t)(timeout_s * 1000.0));
    auto s = std::make_unique<rc_store>();
    try {
      s->store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
    } catch (const c10::Error& e) {
      fail("store server on port " + std::to_string(port) + ": " + e.what_without_backtrace());
    }
    *out_port = s->store->getPort();
    *out = s.release();
  });
}

void rc_store_free(rc_store* s) {
  try {
    delete s;
  } catch (...) {
  }
}

}  // extern "C"
