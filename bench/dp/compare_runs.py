#!/usr/bin/python3
"""Compares two recal runs for bench/dp/acceptance.sh.

    compare_runs.py RUN_A RUN_B [--weights BOUND]   training runs
    compare_runs.py --eval EVAL_A EVAL_B            evaluation folders

Training runs: rollouts.jsonl, metrics.jsonl and validation.jsonl line by
line, equal but for the timings (step_time_s, rollout_time_s, tokens_per_s,
latency_ns) and metrics' cost (a sum over ranks in another order: relative
1e-9); then the weights of checkpoints/last (model.safetensors, max |a − b|,
at most BOUND). Evaluation folders: every results-*.jsonl the same but for
latencies. Prints one line of what was compared; exits 1 on a difference.
"""
import json
import os
import struct
import sys

import numpy as np

TIMING = {"step_time_s", "rollout_time_s", "tokens_per_s", "latency_ns", "latency_s", "elapsed_s"}


def drop(v):
    if isinstance(v, dict):
        return {k: drop(x) for k, x in v.items() if k not in TIMING}
    if isinstance(v, list):
        return [drop(x) for x in v]
    return v


def jsonl(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        raw = data[a:b]
        if t["dtype"] == "F32":
            x = np.frombuffer(raw, np.float32)
        elif t["dtype"] == "BF16":
            x = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif t["dtype"] == "F16":
            x = np.frombuffer(raw, np.float16).astype(np.float32)
        else:
            continue
        out[name] = x.astype(np.float64)
    return out


def main():
    args = sys.argv[1:]
    bad = []
    said = []
    if args[0] == "--eval":
        a, b = args[1], args[2]
        files = sorted(f for f in os.listdir(a) if f.startswith("results-") and f.endswith(".jsonl"))
        rows = 0
        for f in files:
            la, lb = jsonl(os.path.join(a, f)), jsonl(os.path.join(b, f))
            key = lambda r: json.dumps({k: r.get(k) for k in ("dataset", "id", "question_id")}, sort_keys=True)
            la, lb = sorted(map(drop, la), key=key), sorted(map(drop, lb), key=key)
            rows += len(la)
            if la != lb:
                bad.append(f)
        said.append("%d per-question results in %s %s" % (rows, ", ".join(files), "differ: " + ", ".join(bad) if bad else "identical"))
    else:
        a, b = args[0], args[1]
        bound = float(args[args.index("--weights") + 1]) if "--weights" in args else 0.0
        for f in ("rollouts.jsonl", "metrics.jsonl", "validation.jsonl"):
            pa, pb = os.path.join(a, f), os.path.join(b, f)
            if not os.path.exists(pa):
                continue
            la, lb = [drop(x) for x in jsonl(pa)], [drop(x) for x in jsonl(pb)]
            costs = 0.0
            if f == "metrics.jsonl":
                for x, y in zip(la, lb):
                    u, v = x.pop("cost", 0.0), y.pop("cost", 0.0)
                    costs = max(costs, abs(u - v) / max(abs(u), abs(v), 1e-300))
            diff = len(la) != len(lb) or la != lb or costs > 1e-9
            if diff:
                bad.append(f)
                first = next((i for i, (x, y) in enumerate(zip(la, lb)) if x != y), min(len(la), len(lb)))
                said.append("%s differs (%d against %d lines, first at line %d)" % (f, len(la), len(lb), first + 1))
            else:
                extra = " (cost within %.1g relative)" % costs if costs else ""
                said.append("%s %d lines equal%s" % (f, len(la), extra))
        wa = tensors(os.path.join(a, "checkpoints", "last", "model.safetensors"))
        wb = tensors(os.path.join(b, "checkpoints", "last", "model.safetensors"))
        n = sum(x.size for x in wa.values())
        worst = max(float(np.max(np.abs(wa[k] - wb[k]))) if wa[k].size else 0.0 for k in wa)
        said.append("checkpoints/last: %d values, max |a - b| = %.3g (bound %g)" % (n, worst, bound))
        if set(wa) != set(wb) or worst > bound:
            bad.append("weights")
    print("; ".join(said))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
