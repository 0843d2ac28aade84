#!/usr/bin/python3
"""PyTorch-eager baseline for `make bench`.

    /usr/bin/python3 bench/torch_eager.py --preset tiny --threads 2 --json

Runs the same Qwen2 model as the engine's bench presets, in plain PyTorch eager
mode (float32, CPU), using the nn.Module implementation from
torchbridge/testdata/qwen2_ref.py: HF-style eager attention, a KV cache that
grows by torch.cat each step (as HF's DynamicCache does), repeat_kv for GQA.
Weights are random (normal std 0.02, norms 1): they do not matter for speed.

Measurements (each: `--warmup` untimed runs, then `--repeats` timed runs
(`--train-repeats` for the train step) with time.perf_counter; the median is
reported):

  prefill_tok_s     batch 1 x 256-token prompt, one forward under no_grad.
                    Like the engine, lm_head is applied to the LAST position
                    only (HF eager would project all 256 positions; we do not,
                    to compare like with like). tok/s = 256 / time.
  prefill_b8_tok_s  same, batch 8 x 128 tokens. tok/s = 1024 / time.
  decode_b1_tok_s   batch 1: a 32-token prompt is prefilled (untimed), then 64
                    greedy decode steps with the KV cache are timed (each
                    step: forward of 1 token per row, lm_head on it, argmax;
                    warm-up runs decode only 8 steps).
                    tok/s = batch * 64 / time.
  decode_b64_tok_s  same with batch 64.
  train_tok_s       batch 8 x 256 tokens: full forward (full logits), log_softmax
                    + gather of next-token log-probs, clipped PPO loss
                    (ratio = exp(logp - old_logp), random advantages, clip 0.2,
                    mean over tokens), backward, clip_grad_norm_(1.0),
                    AdamW(lr 1e-5, weight_decay 0.01) step.
                    tok/s = 8 * 256 / time.

Threads: torch.set_num_threads(--threads); OMP_NUM_THREADS and
OPENBLAS_NUM_THREADS default to the same number and OMP_WAIT_POLICY to PASSIVE
(see below; set them in the environment to override).

Output with --json: one JSON object on stdout, e.g.
  {"preset": "tiny", "prefill_tok_s": ..., "decode_b1_tok_s": ...,
   "decode_b64_tok_s": ..., "train_tok_s": ..., "prefill_b8_tok_s": ...,
   "threads": 2, "omp_wait_policy": "PASSIVE", "repeats": 3, "train_repeats": 2, "torch_version": "...", "impl": "torch-eager-cpu-f32"}
"""

import argparse
import json
import os
import statistics
import sys
import time


def _threads_from_argv(default):
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--threads", type=int, default=default)
    return pre.parse_known_args()[0].threads


# Debian's torch uses libgomp for its own kernels and the pthread build of
# OpenBLAS for matmuls. With libgomp's default (active, spinning) wait policy
# the idle OpenMP workers burn the cores OpenBLAS needs: on this 2-vCPU VM
# 2-thread runs were 10-20x slower and erratic. Passive waiting fixes that.
# These must be set before torch (libgomp, OpenBLAS) is loaded; explicit
# environment settings win.
_THREADS = _threads_from_argv(os.cpu_count() or 1)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", str(_THREADS))
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(_THREADS))

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "torchbridge", "testdata"))
import qwen2_ref  # noqa: E402

VOCAB = 151936

PRESETS = {
    "tiny": dict(vocab=VOCAB, hidden=128, inter=384, layers=2, heads=4, kv_heads=2, theta=1e6, tied=True),
    "small": dict(vocab=VOCAB, hidden=256, inter=768, layers=4, heads=8, kv_heads=2, theta=1e6, tied=True),
}

PREFILL_LEN = 256
PREFILL_B8_LEN = 128
DECODE_PROMPT = 32
DECODE_STEPS = 64
DECODE_WARMUP_STEPS = 8  # warm-up runs decode this many steps (untimed)
TRAIN_BATCH = 8
TRAIN_LEN = 256


def make_model(preset, seed=0):
    p = PRESETS[preset]
    cfg = qwen2_ref.hf_config(p["vocab"], p["hidden"], p["inter"], p["layers"], p["heads"],
                              p["kv_heads"], p["theta"], p["tied"])
    torch.manual_seed(seed)
    m = qwen2_ref.Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        for name, prm in m.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                prm.fill_(1.0)
            elif name.endswith(".bias"):
                prm.zero_()
            else:
                prm.normal_(0.0, 0.02)
    return m, cfg


def timeit(fn, warmup, repeats):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def bench_prefill(m, batch, length, warmup, repeats):
    ids = torch.randint(0, VOCAB, (batch, length))

    def run():
        with torch.no_grad():
            logits, _ = m(ids, None, logits_to_keep=1)
            torch.argmax(logits[:, -1], dim=-1)

    t = timeit(run, warmup, repeats)
    return batch * length / t


def bench_decode(m, batch, warmup, repeats):
    ids = torch.randint(0, VOCAB, (batch, DECODE_PROMPT))
    ts = []
    for r in range(warmup + repeats):
        steps = DECODE_WARMUP_STEPS if r < warmup else DECODE_STEPS
        with torch.no_grad():
            logits, past = m(ids, None, logits_to_keep=1)  # prefill: not timed
            nxt = torch.argmax(logits[:, -1], dim=-1)
            t0 = time.perf_counter()
            for _ in range(steps):
                logits, past = m(nxt[:, None], past, logits_to_keep=1)
                nxt = torch.argmax(logits[:, -1], dim=-1)
            dt = time.perf_counter() - t0
        if r >= warmup:
            ts.append(dt)
    return batch * DECODE_STEPS / statistics.median(ts)


def bench_train(m, warmup, repeats):
    m.train()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-5, weight_decay=0.01)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (TRAIN_BATCH, TRAIN_LEN), generator=g)
    tgt = ids[:, 1:]
    adv = torch.randn(TRAIN_BATCH, TRAIN_LEN - 1, generator=g)
    old_noise = 0.01 * torch.randn(TRAIN_BATCH, TRAIN_LEN - 1, generator=g)
    old_logp = None

    def step():
        nonlocal old_logp
        logits, _ = m(ids, None, logits_to_keep=0)  # [B, T, V], full logits
        logp_all = torch.log_softmax(logits[:, :-1], dim=-1)
        logp = logp_all.gather(-1, tgt[..., None]).squeeze(-1)  # [B, T-1]
        if old_logp is None:
            old_logp = (logp.detach() + old_noise)
        ratio = torch.exp(logp - old_logp)
        loss = -torch.min(ratio * adv, torch.clamp(ratio, 0.8, 1.2) * adv).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()

    t = timeit(step, warmup, repeats)
    m.eval()
    return TRAIN_BATCH * TRAIN_LEN / t


def bench_sgemm(n):
    """GFLOP/s of torch.mm on two n x n float32 matrices (OpenBLAS's sgemm
    with Debian's torch): the best of 5 runs of 5 products, after one."""
    g = torch.Generator().manual_seed(0)
    a = torch.rand(n, n, generator=g)
    b = torch.rand(n, n, generator=g)
    c = torch.empty(n, n)
    torch.mm(a, b, out=c)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(5):
            torch.mm(a, b, out=c)
        best = min(best, (time.perf_counter() - t) / 5)
    return 2 * n ** 3 / best / 1e9


def main():
    ap = argparse.ArgumentParser(description="PyTorch eager Qwen2 CPU baseline")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per measurement (median reported)")
    ap.add_argument("--train-repeats", type=int, default=2, help="timed train steps (median reported)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed warm-up runs per measurement")
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    ap.add_argument("--sgemm", action="store_true",
                    help="only measure float32 matrix products of 1024x1024 on --threads threads (GFLOP/s, best of 5 runs of 5)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    if args.sgemm:
        print(json.dumps({"sgemm_gflops": round(bench_sgemm(1024), 2), "threads": args.threads,
                          "torch_version": torch.__version__}))
        return
    m, _ = make_model(args.preset)
    m.eval()

    def log(msg):
        if not args.json:
            print(msg, flush=True)
        else:
            print(msg, file=sys.stderr, flush=True)

    t_all = time.perf_counter()
    res = {"preset": args.preset}
    res["prefill_tok_s"] = bench_prefill(m, 1, PREFILL_LEN, args.warmup, args.repeats)
    log("prefill b1x%d: %.1f tok/s" % (PREFILL_LEN, res["prefill_tok_s"]))
    res["decode_b1_tok_s"] = bench_decode(m, 1, args.warmup, args.repeats)
    log("decode b1: %.1f tok/s" % res["decode_b1_tok_s"])
    res["decode_b64_tok_s"] = bench_decode(m, 64, args.warmup, args.repeats)
    log("decode b64: %.1f tok/s" % res["decode_b64_tok_s"])
    res["train_tok_s"] = bench_train(m, args.warmup, args.train_repeats)
    log("train b%dx%d: %.1f tok/s" % (TRAIN_BATCH, TRAIN_LEN, res["train_tok_s"]))
    res["prefill_b8_tok_s"] = bench_prefill(m, 8, PREFILL_B8_LEN, args.warmup, args.repeats)
    log("prefill b8x%d: %.1f tok/s" % (PREFILL_B8_LEN, res["prefill_b8_tok_s"]))
    for k in list(res):
        if k.endswith("_tok_s"):
            res[k] = round(res[k], 2)
    res.update({
        "threads": args.threads,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
        "repeats": args.repeats,
        "train_repeats": args.train_repeats,
        "torch_version": torch.__version__,
        "impl": "torch-eager-cpu-f32",
        "wall_s": round(time.perf_counter() - t_all, 2),
    })
    if args.json:
        print(json.dumps(res))
    else:
        print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
