#!/usr/bin/env python3
"""summary.py RUN_DIR [LOG] — one JSON line summarising a recal training run:
the warm-up's NLL (first, last, every 10th step) and wall time (from the
log's timestamps: its first line to the last "sft" line), and per GRPO step
the reward, F1, loss, KL, gradient norm and step and rollout seconds, plus
the last validation. Compares runs of one config on two devices."""
import datetime
import json
import os
import re
import sys


def jsonl(path):
    try:
        with open(path) as f:
            return [json.loads(l) for l in f if l.strip()]
    except FileNotFoundError:
        return []


def stamp(line):
    m = re.match(r"time=(\S+)", line)
    if not m:
        return None
    return datetime.datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()


def main():
    run = sys.argv[1]
    out = {"run": run}
    sft = jsonl(os.path.join(run, "sft.jsonl"))
    if sft:
        out["sft_steps"] = len(sft)
        out["sft_nll"] = {r["step"]: round(r["nll"], 5) for r in sft if r["step"] == 1 or r["step"] % 10 == 0 or r is sft[-1]}
    if len(sys.argv) > 2:
        first = last_sft = first_step = took = None
        with open(sys.argv[2]) as f:
            for line in f:
                t = stamp(line)
                if t is None:
                    continue
                first = first or t
                if "msg=sft " in line:
                    last_sft = t
                if "msg=step " in line and first_step is None:
                    first_step = t
                m = re.search(r'msg="training finished".*took=(\S+)', line)
                if m:
                    took = m.group(1)
        if first and last_sft:
            out["sft_wall_s_from_first_log_line"] = round(last_sft - first, 2)
        out["took"] = took
    steps = jsonl(os.path.join(run, "metrics.jsonl"))
    if steps:
        keys = ["step", "f1", "loss", "kl", "grad_norm", "entropy", "step_time_s", "rollout_time_s", "score_time_s",
                "update_time_s", "tokens_per_s", "policy_tokens", "device_peak_gib"]
        out["grpo"] = [{k: (round(r[k], 5) if isinstance(r.get(k), float) else r.get(k)) for k in keys} | {"ans": round(r["reward"]["ans"], 4), "format": round(r["reward"]["format"], 4)} for r in steps]
        n = len(steps)
        tail = steps[1:] if n > 1 else steps  # the first step warms up the kernels
        out["grpo_mean_step_s_after_first"] = round(sum(r["step_time_s"] for r in tail) / len(tail), 3)
        out["grpo_mean_rollout_s_after_first"] = round(sum(r["rollout_time_s"] for r in tail) / len(tail), 3)
    val = jsonl(os.path.join(run, "validation.jsonl"))
    if val:
        out["validation"] = val[-1].get("avg")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
