/*
 * recal.h — the C ABI between Go (package torchbridge) and libtorch.
 *
 * Conventions:
 *  - Opaque handles; every handle has a *_free function.
 *  - Every fallible call returns an int status: 0 = ok, non-zero = error, in
 *    which case *err receives a malloc'd, NUL-terminated message that the
 *    caller frees with free(). No thread-local "last error".
 *  - Results come back through out-parameters. Pointers passed in are only
 *    read during the call; the C++ side copies what it keeps.
 *  - Token ids are int32; floats are float32 unless stated otherwise.
 */
#ifndef RECAL_H
#define RECAL_H

#include <stdint.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A Qwen2-architecture decoder: weights, optional AdamW state, gradients. */
typedef struct rc_policy rc_policy;
/* A KV cache over a fixed number of sequences ("rows") for one policy. */
typedef struct rc_cache rc_cache;

/* Element types shared by tensors crossing the boundary (safetensors names). */
enum rc_dtype { RC_F32 = 0, RC_BF16 = 1, RC_F16 = 2 };

/* Architecture hyper-parameters, as Hugging Face's Qwen2Config names them. */
typedef struct rc_config {
  int64_t vocab_size;
  int64_t hidden_size;
  int64_t intermediate_size;
  int64_t num_hidden_layers;
  int64_t num_attention_heads;
  int64_t num_key_value_heads;
  int64_t head_dim;
  int64_t max_position_embeddings;
  double rope_theta;
  double rms_norm_eps;
  int32_t tie_word_embeddings;
} rc_config;

/* Sets the number of intra-op CPU threads (and OpenBLAS's) of the calling
   thread's later work; n <= 0 leaves them. May be called between pieces of
   work (the training loop decodes with fewer threads than it trains). */
int rc_set_threads(int32_t n, char** err);
/* Hands the pages of the CPU heap's free memory back to the system (glibc's
 * malloc_trim; a no-op elsewhere). */
int rc_release_memory(char** err);

/* The number of intra-op CPU threads the calling thread's work uses. */
int rc_get_threads(int32_t* out, char** err);

/* Checks the row-invariant decoding kernels (recal_rows.cc): their AVX-512
 * path (matrix products), AVX2 path and portable path compute the same bits
 * on random data with every tile shape and length tail, and exp's special
 * values; *vector is 2 when the CPU ran the AVX-512 and AVX2 paths, 1 when
 * only the AVX2 path (0: only the portable one exists here). An error names
 * the kernel, the shape and the first element that differ. */
int rc_kernels_check(uint64_t seed, int32_t* vector, char** err);

/* The OpenBLAS kernel ("core") the process runs and OpenBLAS's build
 * summary, as OpenBLAS names them (openblas_get_corename,
 * openblas_get_config), NUL-terminated in core[core_cap] and
 * config[config_cap]; both are "" when libtorch's BLAS is not OpenBLAS. */
int rc_blas_kernel(char* core, int32_t core_cap, char* config, int32_t config_cap, char** err);

/* Reports whether the linked libtorch can use CUDA (1) or not (0). */
int rc_cuda_available(int32_t* out, char** err);

/* Creates a policy with zero-filled parameters on the device ("cpu", "cuda",
 * "cuda:1") in the dtype (RC_F32 or RC_BF16). */
int rc_policy_new(const rc_config* cfg, const char* device, int32_t dtype, rc_policy** out, char** err);

/* Frees the policy and everything it owns, and (glibc) hands the heap's free
 * pages back to the system. NULL is a no-op. */
void rc_policy_free(rc_policy* p);

/* Number of parameter tensors. */
int rc_policy_num_params(rc_policy* p, int64_t* out, char** err);

/* Makes the policy hold only rank's share (of world ranks) of its AdamW
 * moments and float32 master weights (ZeRO-1): each parameter's elements
 * are cut into world nearly equal ranges at multiples of 64, rank r
 * holding the r-th of every parameter; rc_policy_step then updates this
 * rank's ranges only, and rc_dist_gather_params gives every rank the
 * others'. State already present
 * whole is cut to the share; world 1 undoes nothing (reshard through a
 * checkpoint). Optimizer tensors are then written by name whole (the rank
 * keeps its share) and read whole only after rc_dist_gather_state. */
int rc_policy_shard_optimizer(rc_policy* p, int64_t rank, int64_t world, char** err);

/* Turns activation checkpointing per decoder layer on (1) or off (0) for the
 * backward passes that follow: a layer's activations are recomputed in the
 * backward instead of kept from the forward, so the trunk holds one layer's
 * activations at a time (plus each layer's input) for about one more
 * forward pass of compute. The gradients are the plain backward's. */
int rc_policy_set_checkpointing(rc_policy* p, int32_t on, char** err);

/* Turns CUDA-graph decoding on (1, the default) or off (0). On a CUDA
 * policy in a CUDA build, a one-token step of every row given (a decode
 * step) replays a CUDA graph of the whole step (all layers, the output head
 * and the greedy choice) captured per padded batch size and attended
 * length, instead of launching each kernel from the host; elsewhere, and
 * with graphs off, libtorch's kernels run one by one (eager). A no-op on the
 * CPU. */
int rc_policy_set_cuda_graphs(rc_policy* p, int32_t on, char** err);

/* Kernel choices of the forward passes that do not backpropagate
 * (decoding, scoring, the KL reference), a set of RC_KERNEL_* flags; all
 * on by default (RC_KERNELS_DEFAULT). Turning one off runs the arithmetic
 * the bridge ran before it existed, for comparisons on one machine:
 *   RC_KERNEL_FUSED_PROJ: one product for the q, k and v projections and
 *     one for the gate and up projections, and one rotary pass over q and
 *     k together. Needs the fused layout: those weights then live in one
 *     tensor per layer (each parameter a view of it), made at creation on a
 *     CUDA device and, when this flag is set, on any other.
 *   RC_KERNEL_GRAPH_SAMPLE: CUDA-graph decode steps also sample (temperature
 *     1, no top-k, top-p or bans: a training rollout's setting) inside the
 *     graph, with the uniform the eager choice would draw.
 *   RC_KERNEL_F32_PREFILL_MATMUL: float32 prefills on a GPU attend by matrix
 *     products rather than the fused kernel (faster there: the fused
 *     kernels run float32 without tensor cores and on keys copied per
 *     query head). */
#define RC_KERNEL_FUSED_PROJ 1
#define RC_KERNEL_GRAPH_SAMPLE 2
#define RC_KERNEL_F32_PREFILL_MATMUL 4
#define RC_KERNELS_DEFAULT 7
int rc_policy_set_kernels(rc_policy* p, int32_t flags, char** err);

/* Counts of the policy's CUDA-graph decoding since it was created: graphs
 * captured, steps replayed. *graph_error is NULL, or (malloc'd, the caller
 * frees it) why a capture failed, after which the policy decodes eagerly. */
int rc_policy_graph_stats(rc_policy* p, int64_t* captures, int64_t* replays, char** graph_error, char** err);

/* The CUDA caching allocator's counters for device ("cuda", "cuda:N"), in
 * bytes: out[0] allocated now, out[1] peak allocated, out[2] reserved now,
 * out[3] peak reserved, the peaks since the last reset, out[4] the
 * device's total memory and out[5] its free memory (cudaMemGetInfo);
 * reset_peak != 0 resets the peaks after reading. Fails in builds without
 * CUDA. */
int rc_device_memory(const char* device, int32_t reset_peak, int64_t* out, char** err);

/* *out = 1 when the policy decodes by the row-invariant kernels
 * (recal_rows.cc: float32 on the CPU), so that a row's logits, sample and
 * log-prob do not depend on the other rows of an extend call, the BLAS or
 * the threads; 0 when libtorch's kernels decode it (bfloat16, CUDA). */
int rc_policy_row_invariant(rc_policy* p, int32_t* out, char** err);

/* Name (Hugging Face naming, borrowed pointer valid while p lives), rank and
 * shape (up to 4 dims) of parameter i. */
int rc_policy_param_info(rc_policy* p, int64_t i, const char** name, int32_t* ndim, int64_t* shape, char** err);

/* Copies raw little-endian data of the given dtype into parameter `name`,
 * converting to the policy's dtype. nbytes must equal numel * element size. */
int rc_policy_set_param(rc_policy* p, const char* name, int32_t dtype, const void* data, int64_t nbytes, char** err);
/* Elements [offset, offset + nbytes/size of dtype) of parameter name, in its
 * flat (row-major) order, from raw data of dtype: a checkpoint's tensor
 * loaded piece by piece. */
int rc_policy_set_param_range(rc_policy* p, const char* name, int32_t dtype, int64_t offset, const void* data,
                              int64_t nbytes, char** err);

/* Copies parameter `name` (or optimizer tensor, see rc_policy_state_*, or
 * "grad/<param>", the accumulated gradient, zeros when none) into buf as dtype. nbytes must equal numel * element size.
 * Gradients accumulate over backward calls in float32 whatever the policy's
 * dtype: each call's gradients are added into float32 sums. */
int rc_policy_get_param(rc_policy* p, const char* name, int32_t dtype, void* buf, int64_t nbytes, char** err);

/* Initialises parameters randomly from seed (normal, std for matrices; norms
 * to one; biases to zero). */
int rc_policy_init_random(rc_policy* p, uint64_t seed, double std, char** err);

/* Freezes (1) or unfreezes (0) the policy: a frozen one keeps no gradients
 * and no optimizer state (used for the KL reference policy). */
int rc_policy_set_trainable(rc_policy* p, int32_t trainable, char** err);

/* Per-token scoring of full sequences under no-grad. tokens is [batch, len]
 * row-major; lengths[b] is the valid length of row b (the rest is padding).
 * For t in [0, len-1): logp[b, t] = log p(tokens[b, t+1] | tokens[b, :t+1]),
 * entropy[b, t] = entropy of that next-token distribution. When mask is not
 * NULL only positions with mask[b, t] > 0 are computed (the output head is
 * the costly part). Other positions, and those past lengths[b]-1, are 0.
 * Either output may be NULL. Output shape is [batch, len]. */
int rc_policy_score(rc_policy* p, int64_t batch, int64_t len, const int32_t* tokens, const int64_t* lengths,
                    const float* mask, float* logp, float* entropy, char** err);

/* Hyper-parameters of the clipped policy-gradient loss. */
typedef struct rc_loss_opts {
  double clip_eps;      /* ratio clip ε (0.2) */
  double kl_coef;       /* k3 KL coefficient (0 = no KL) */
  double entropy_coef;  /* entropy bonus coefficient (0 = none) */
  double scale;         /* multiplies the token sum: 1/(policy tokens in the mini-batch) */
  int64_t head_chunk;   /* tokens per lm_head chunk (bounds logits memory) */
  double vf_coef;       /* weight of the value loss (PPO; used only with rc_ppo_inputs) */
  double value_clip;    /* value clip ε_v around old_values (PPO; ≤ 0: no clip) */
} rc_loss_opts;

/* Statistics of one rc_policy_backward call, sums over masked tokens. */
typedef struct rc_loss_stats {
  double loss;          /* sum of per-token loss * scale */
  double tokens;        /* masked tokens */
  double clipped;       /* tokens whose ratio was clipped in the objective */
  double kl;            /* sum of k3 KL terms */
  double entropy;       /* sum of entropies */
  double ratio;         /* sum of ratios */
  double value_loss;    /* PPO: sum of ½·max((V−R)², (clip(V)−R)²), before vf_coef and scale */
  double value_clipped; /* PPO: tokens whose clipped value term was the larger */
} rc_loss_stats;

/* The per-token inputs of PPO's actor-critic loss, each [batch, len] laid
 * out like mask (position t: the state before token t+1). */
typedef struct rc_ppo_inputs {
  const float* adv;         /* per-token advantages; they replace the per-row adv */
  const float* returns;     /* value targets R */
  const float* old_values;  /* values when the batch was scored (centre of the value clip); NULL: no clip */
} rc_ppo_inputs;

/* Computes the GRPO loss on [batch, len] tokens and accumulates gradients:
 * per token (mask[b,t] > 0, t indexes the predicted token t+1 as in score):
 *   ρ = exp(logp − old_logp); pg = −min(ρA, clip(ρ, 1−ε, 1+ε)A)
 *   kl = exp(ref − logp) − (ref − logp) − 1          (when ref_logp != NULL)
 *   loss = Σ mask·(pg + kl_coef·kl − entropy_coef·H) · scale
 * adv is per row. old_logp may be NULL (then ρ = 1 with gradient, i.e. the
 * on-policy case).
 * With ppo != NULL (PPO with a value head, see rc_policy_add_value_head) A
 * is ppo->adv per token (adv may be NULL) and the clipped value loss is
 * added, V being the value head's output at the token's state:
 *   vl = ½·max((V − R)², (clip(V, V_old − ε_v, V_old + ε_v) − R)²)
 *   loss += Σ mask·vf_coef·vl · scale
 * Its gradient reaches the value head and, through the shared trunk, the
 * policy's weights. */
int rc_policy_backward(rc_policy* p, int64_t batch, int64_t len, const int32_t* tokens, const int64_t* lengths,
                       const float* mask, const float* adv, const float* old_logp, const float* ref_logp,
                       const rc_ppo_inputs* ppo, const rc_loss_opts* opts, rc_loss_stats* stats, char** err);

/* Adds PPO's value head to the policy: "value_head.weight" [1, hidden] and
 * "value_head.bias" [1], zero-initialised (every value starts at 0), in the
 * policy's dtype. They are parameters like the others (listed by
 * rc_policy_param_info, read and written by name, trained, in the optimizer
 * state, whose moments start at zero when it already exists). Fails when
 * the policy already has one. */
int rc_policy_add_value_head(rc_policy* p, char** err);

/* The value head's output under no-grad, laid out like rc_policy_score:
 * values[b, t] = V(state after tokens[b, :t+1]), the value of the state
 * from which token t+1 is drawn, for t < lengths[b]-1 and, when mask is not
 * NULL, mask[b, t] > 0; other positions are 0. */
int rc_policy_values(rc_policy* p, int64_t batch, int64_t len, const int32_t* tokens, const int64_t* lengths,
                     const float* mask, float* values, char** err);

/* Supervised loss: mean negative log-likelihood over masked tokens, times
 * scale, with gradient accumulation. Returns the token sum of NLL in *nll. */
int rc_policy_backward_nll(rc_policy* p, int64_t batch, int64_t len, const int32_t* tokens, const int64_t* lengths,
                           const float* mask, double scale, int64_t head_chunk, double* nll, char** err);

/* AdamW hyper-parameters (PyTorch semantics, decoupled weight decay). */
typedef struct rc_adamw_opts {
  double lr, beta1, beta2, eps, weight_decay, max_grad_norm; /* max_grad_norm <= 0: no clipping */
  double value_lr; /* learning rate of the value head's parameters; <= 0: lr */
} rc_adamw_opts;

/* Clips the gradient norm, takes one AdamW step and zeroes the gradients.
 * *grad_norm receives the total norm (of the float32 gradient sums) before
 * clipping. Non-finite gradients skip the step: weights, moments and the step
 * counter stay as they were, the gradients are dropped, the call returns ok
 * and *grad_norm is non-finite (the caller counts and reports skips). */
int rc_policy_step(rc_policy* p, const rc_adamw_opts* opts, double* grad_norm, char** err);

/* Zeroes accumulated gradients without stepping. */
int rc_policy_zero_grad(rc_policy* p, char** err);

/* Resets the AdamW state to that of a fresh optimizer: moments to zero and
 * the step counter to 0 (bias correction starts over). Float32 master
 * weights, which are the weights rather than optimizer state, are kept.
 * A no-op for a policy that has not stepped yet. */
int rc_policy_reset_optimizer(rc_policy* p, char** err);

/* Allocates now what the first update would otherwise allocate after the
 * first backward: the optimizer state it lacks (zero moments and, for
 * non-float32 policies, the master copy; of this rank's share when
 * sharded) and, when bucket_bytes > 0, the float32 gradient sums as
 * all-reduce buckets of that size (rc_dist_allreduce_grads with the same
 * bucket_bytes then finds them there). Changes no value: the moments are
 * zero, as a fresh optimizer's, and a backward adds into the zeroed sums.
 * Allocated before the first activations, they are not placed after them
 * in the heap, so the process's peak is the sum of what is live. */
int rc_policy_prepare_update(rc_policy* p, int64_t bucket_bytes, char** err);

/* Optimizer state: tensors are named "exp_avg/<param>", "exp_avg_sq/<param>"
 * and, for non-float32 policies, "master/<param>" (the float32 master copy);
 * read and written with rc_policy_get_param/rc_policy_set_param.
 * rc_policy_state_names lists them (borrowed pointers, valid until the next
 * step or free); *count receives the count. */
int rc_policy_state_names(rc_policy* p, const char*** names, int64_t* count, char** err);
/* Step counter of the optimizer. */
int rc_policy_state_step(rc_policy* p, int64_t* step, char** err);
int rc_policy_set_state_step(rc_policy* p, int64_t step, char** err);

/* Creates a KV cache for `rows` sequences of at most `capacity` tokens. */
int rc_cache_new(rc_policy* p, int64_t rows, int64_t capacity, rc_cache** out, char** err);

/* Frees the cache. NULL is a no-op. */
void rc_cache_free(rc_cache* c);

/* Empties rows (their length becomes 0). rows == NULL resets all. */
int rc_cache_reset(rc_cache* c, int64_t n, const int64_t* rows, char** err);

/* Sampling settings for one extend call. temperature 0 = greedy. */
typedef struct rc_sample_opts {
  double temperature;
  double top_p;       /* 1 = off */
  int64_t top_k;      /* 0 = off */
  int32_t want_logp;  /* 0: out_logp is not computed (saves a pass over [rows, vocab]) */
  int64_t row_base;   /* added to each cache row's index in the draw (a data-parallel rank's first global row) */
  const int32_t* ban;        /* NULL, or the tokens row i must not be sampled: ban_counts[i] of them per row, concatenated */
  const int64_t* ban_counts; /* [n]; used when ban is not NULL */
} rc_sample_opts;

/* Appends tokens to n rows and samples the next token of each. tokens is
 * [n, width] row-major with counts[i] ≤ width valid tokens for row rows[i]
 * (counts[i] ≥ 1). Afterwards the cache holds them; out_tokens[i] receives
 * the next token sampled from the distribution after row i's last new token,
 * out_logp[i] (when sample->want_logp) its log-probability under the
 * unscaled softmax. out_logits, if
 * not NULL, receives [n, vocab] float32 logits of that position. Sampling
 * draws one uniform per row from (gen_seed, sample->row_base + row, the
 * row's length), so a row's sample does not depend on the other rows of the
 * call. */
int rc_cache_extend(rc_cache* c, int64_t n, const int64_t* rows, int64_t width, const int32_t* tokens,
                    const int64_t* counts, const rc_sample_opts* sample, uint64_t gen_seed, int32_t* out_tokens,
                    float* out_logp, float* out_logits, char** err);

/* Current length of each of the n rows (or all rows when rows == NULL). */
int rc_cache_lengths(rc_cache* c, int64_t n, const int64_t* rows, int64_t* out, char** err);

/* ---- Data-parallel collectives on c10d (cgo/recal_dist.cc) ------------- */

/* A member of a group of processes ("ranks") that run collectives together
 * over c10d: Gloo on CPU, plus NCCL for CUDA gradients in CUDA builds. Every
 * rank must call the same collectives in the same order. Each collective
 * waits at most the group's timeout; after a failure the group is unusable
 * and later calls return that failure. */
typedef struct rc_dist rc_dist;

/* How a process joins a group. */
typedef struct rc_dist_opts {
  int32_t rank;             /* this process, 0 ≤ rank < world_size */
  int32_t world_size;       /* number of processes */
  const char* master_addr;  /* host of the rendezvous store, which rank 0 serves */
  int32_t master_port;      /* its TCP port */
  double timeout_s;         /* rendezvous and every collective; ≤ 0: 300 s */
  const char* backend;      /* "gloo" (NULL or "" too) or "nccl" (CUDA builds) */
  int64_t bucket_bytes;     /* gradient all-reduce bucket size; ≤ 0: 25 MiB */
  const char* store_prefix; /* NULL: rank 0 serves the store. Else a launcher serves it (torchrun's
                               agent store): every rank connects as a client and keys its entries
                               under this prefix, e.g. "/worker/attempt_0" */
} rc_dist_opts;

/* Joins the group: rank 0 (or the launcher, see store_prefix) serves a
 * TCPStore at master_addr:master_port, every rank connects and the process
 * group forms. Blocks until all world_size ranks have joined or the timeout
 * passes. */
int rc_dist_new(const rc_dist_opts* opts, rc_dist** out, char** err);

/* Leaves the group and frees it, waiting for queued work. NULL is a no-op. */
void rc_dist_free(rc_dist* d);

/* Sums the accumulated gradients of p over the ranks. From the first call
 * on, p keeps its float32 gradient sums in buckets of about
 * opts.bucket_bytes (PyTorch DDP's gradient_as_bucket_view): the sums are
 * views of the buckets, and a float32 policy's backward passes add their
 * gradients into them directly, so each bucket is all-reduced where it is,
 * with no copy. Every rank passes a policy of the same parameter shapes. A
 * missing gradient counts as zeros; every gradient is defined afterwards on
 * every rank. */
int rc_dist_allreduce_grads(rc_dist* d, rc_policy* p, char** err);

/* rc_policy_prepare_update with this group's bucket size: the optimizer
 * state and the gradient buckets rc_dist_allreduce_grads would make. */
int rc_dist_prepare_update(rc_dist* d, rc_policy* p, char** err);

/* After rc_policy_step on a policy sharded as this rank of this group
 * (rc_policy_shard_optimizer), gives every rank the parameter elements the
 * other ranks updated (an all-gather of the shares, in the parameters'
 * dtype, in rounds of about the group's bucket_bytes of parameters, so its
 * buffers hold one round). A no-op for an unsharded policy of a group of
 * one. */
int rc_dist_gather_params(rc_dist* d, rc_policy* p, char** err);

/* ZeRO-2 on the CPU: on (non-zero), the gradient sums of p, sharded as this
 * rank of this group (rc_policy_shard_optimizer) and bucketed
 * (rc_dist_prepare_update), are sharded too: rc_dist_allreduce_grads (and
 * an armed backward, rc_dist_reduce_in_backward) all-reduces each bucket as
 * ZeRO-1 does, keeps the terms of the gradient norm rc_policy_step clips
 * by, and gives back the bucket's pages that hold none of this rank's
 * shares; the step reads only this rank's shares. The same weights bit for
 * bit. Off: whole sums again. The group must outlive the setting (freeing
 * either ends it). */
int rc_dist_shard_gradients(rc_dist* d, rc_policy* p, int32_t on, char** err);

/* Arms p's next backward (rc_policy_backward, rc_policy_backward_nll: the
 * last of this rank's update, whose gradients complete the sums) to
 * all-reduce, with checkpointed layers, each bucket as soon as the
 * backward has made every gradient in it, layer by layer from the top;
 * rc_dist_allreduce_grads, which every rank then calls, reduces the rest.
 * Every rank reduces the buckets in the same order, wherever it does, so
 * a rank that arms no backward (it had no rows) still meets the others. A
 * policy whose gradients are not sharded (rc_dist_shard_gradients) is an
 * error. */
int rc_dist_reduce_in_backward(rc_dist* d, rc_policy* p, char** err);

/* Gathers a sharded policy's whole optimizer state on rank root (CPU
 * float32), where the optimizer tensors can then be read by name whole
 * (rc_policy_get_param, to write a checkpoint); every rank calls it. root
 * −1 drops what an earlier call gathered. A no-op for an unsharded policy. */
int rc_dist_gather_state(rc_dist* d, rc_policy* p, int32_t root, char** err);

/* All-gathers byte buffers of any length: this rank gives len bytes of data;
 * lens (world_size entries) receives each rank's length and *out their
 * concatenation in rank order, malloc'd (free with free(); NULL when all are
 * empty). */
int rc_dist_allgather(rc_dist* d, const void* data, int64_t len, void** out, int64_t* lens, char** err);

/* Broadcasts the root's len bytes of data (read on the root only). Every
 * rank, the root too, receives a malloc'd copy in *out (free with free();
 * NULL when empty) and its length in *out_len. */
int rc_dist_broadcast(rc_dist* d, int32_t root, const void* data, int64_t len, void** out, int64_t* out_len,
                      char** err);

/* Returns when every rank has reached the barrier. */
int rc_dist_barrier(rc_dist* d, char** err);

/* A TCPStore server alone, as torchrun's agent serves one for its workers
 * (TORCHELASTIC_USE_AGENT_STORE=True): it listens on port (0: a free one,
 * reported in *out_port) on every interface until freed. */
typedef struct rc_store rc_store;

/* Starts a store server. */
int rc_store_serve(int32_t port, double timeout_s, rc_store** out, int32_t* out_port, char** err);

/* Stops the server and frees it. NULL is a no-op. */
void rc_store_free(rc_store* s);

#ifdef __cplusplus
}
#endif

#endif /* RECAL_H */
