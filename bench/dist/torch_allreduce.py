#!/usr/bin/python3
"""torch.distributed baseline for the gradient all-reduce of `make bench`.

    /usr/bin/python3 bench/dist/torch_allreduce.py --shapes shapes.json \
        --port 29511 --world 2 --threads 1 --warmup 3 --repeats 10

Launches --world processes of itself on loopback (torch.distributed, gloo
backend, env:// rendezvous at 127.0.0.1:--port) that all-reduce (sum) float32
gradients of the parameter shapes in --shapes (a JSON list of shapes, the
policy's parameters in order, written by bench/dist/main.go), three ways:

  flat_s      one preallocated contiguous tensor of all the gradients, one
              dist.all_reduce: the communication alone, no copies (a lower
              bound on what any gradient all-reduce can take).
  flatten_s   a list of gradient tensors of the given shapes: flatten them
              into one buffer (torch._utils._flatten_dense_tensors), one
              all_reduce, copy the results back into the gradients: the same
              work as recal's all-reduce with one bucket.
  bucketed_s  the same list in buckets of --bucket-mib MiB (DDP's default
              25), each all_reduce started with async_op=True as soon as its
              bucket is filled, then waited and copied back: what DDP's
              reducer does after backward.

Each: --warmup untimed runs, then --repeats timed runs (time.perf_counter on
rank 0, each run ended by the blocking all-reduce); the median is reported,
in seconds, as one JSON object on stdout.

Threads: torch.set_num_threads(--threads) in every rank; OMP_NUM_THREADS
and OMP_WAIT_POLICY=PASSIVE default to match (set them to override).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def worker(args):
    import torch
    import torch.distributed as dist
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    shapes = json.load(open(args.shapes))
    gen = torch.Generator().manual_seed(rank)
    grads = [torch.randn(s, generator=gen) for s in shapes]
    numel = sum(g.numel() for g in grads)
    flat = torch.randn(numel, generator=gen)

    def run_flat():
        dist.all_reduce(flat)

    def run_flatten():
        buf = _flatten_dense_tensors(grads)
        dist.all_reduce(buf)
        for g, s in zip(grads, _unflatten_dense_tensors(buf, grads)):
            g.copy_(s)

    cap = args.bucket_mib * (1 << 20) // 4
    buckets, cur, n = [], [], 0
    for g in grads:
        cur.append(g)
        n += g.numel()
        if n >= cap:
            buckets.append(cur)
            cur, n = [], 0
    if cur:
        buckets.append(cur)
    bufs = [torch.empty(sum(g.numel() for g in b)) for b in buckets]

    def run_bucketed():
        works = []
        for b, buf in zip(buckets, bufs):
            off = 0
            for g in b:
                buf[off:off + g.numel()].copy_(g.view(-1))
                off += g.numel()
            works.append(dist.all_reduce(buf, async_op=True))
        for b, buf, w in zip(buckets, bufs, works):
            w.wait()
            off = 0
            for g in b:
                g.view(-1).copy_(buf[off:off + g.numel()])
                off += g.numel()

    out = {"numel": numel}
    for name, fn in [("flat_s", run_flat), ("flatten_s", run_flatten), ("bucketed_s", run_bucketed)]:
        for _ in range(args.warmup):
            fn()
        times = []
        for _ in range(args.repeats):
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        out[name] = statistics.median(times)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", required=True)
    ap.add_argument("--port", type=int, default=29511)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--bucket-mib", type=int, default=25)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    procs = []
    for r in range(args.world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(args.world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(args.port))
        env.setdefault("OMP_NUM_THREADS", str(args.threads))
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker"] + sys.argv[1:], env=env,
                                      stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL))
    out = procs[0].communicate()[0]
    codes = [p.wait() for p in procs]
    if any(codes):
        sys.exit("torch_allreduce: ranks exited with %s" % codes)
    sys.stdout.write(out.decode())


if __name__ == "__main__":
    main()
