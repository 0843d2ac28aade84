#!/usr/bin/python3
"""torch.distributed side of bench/dist (the gradient all-reduce of `make bench`).

One rank of a torch.distributed gloo group (env:// rendezvous: RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT), started by bench/dist/main.go, which
keeps it alive and drives it through stdin so that its measurements
interleave with recal's:

    /usr/bin/python3 bench/dist/torch_allreduce.py --shapes shapes.json --threads 1

It holds float32 gradients of the parameter shapes in --shapes (a JSON list,
the policy's parameters in order) and reads commands, one a line:

    MODE N   run N timed all-reduces (sum) of MODE; rank 0 answers one JSON
             line {"times": [seconds, ...]} (each run preceded by a barrier,
             timed with time.perf_counter, ended by the blocking wait)
    quit     leave the group and exit

Modes:
  flat      one preallocated contiguous tensor of all the gradients, one
            dist.all_reduce: the communication alone, no copies.
  flatten   the gradient list flattened into a new buffer
            (torch._utils._flatten_dense_tensors), one all_reduce, the sums
            copied back into the gradients.
  bucketed  the list in buckets of --bucket-mib MiB (DDP's default 25) kept
            between calls, each filled and started with async_op=True in
            turn, then waited and copied back: DDP's reducer after backward
            (gradient_as_bucket_view=False).
  views     the same buckets, the gradients being views of them
            (gradient_as_bucket_view=True): no copies, the buckets' async
            all-reduces alone.

Threads: torch.set_num_threads(--threads); the parent sets OMP_NUM_THREADS
and OMP_WAIT_POLICY=PASSIVE to match recal's ranks.
"""
import argparse
import json
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--bucket-mib", type=int, default=25)
    args = ap.parse_args()

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

    cap = args.bucket_mib * (1 << 20) // 4
    buckets, cur, n = [], [], 0
    for i, g in enumerate(grads):  # as recal's: a bucket closes once it reaches cap
        cur.append(g)
        n += g.numel()
        if n >= cap or i + 1 == len(grads):
            buckets.append(cur)
            cur, n = [], 0
    bufs = [torch.empty(sum(g.numel() for g in b)) for b in buckets]

    def run_flat():
        dist.all_reduce(flat)

    def run_flatten():
        buf = _flatten_dense_tensors(grads)
        dist.all_reduce(buf)
        for g, s in zip(grads, _unflatten_dense_tensors(buf, grads)):
            g.copy_(s)

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

    def run_views():
        works = [dist.all_reduce(buf, async_op=True) for buf in bufs]
        for w in works:
            w.wait()

    modes = {"flat": run_flat, "flatten": run_flatten, "bucketed": run_bucketed, "views": run_views}
    for line in sys.stdin:
        f = line.split()
        if not f:
            continue
        if f[0] == "quit":
            break
        fn, reps = modes[f[0]], int(f[1])
        times = []
        for _ in range(reps):
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        if rank == 0:
            sys.stdout.write(json.dumps({"numel": numel, "times": times}) + "\n")
            sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
