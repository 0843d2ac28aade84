#!/usr/bin/env python3
"""Independent reference for recal's PPO advantages (docs/method.md, section 14).

Plain Python 3.11 (tomllib), no third-party packages, written from
docs/method.md, not from the Go code. For a run trained with
train.algorithm = "ppo" it recomputes, from what rollouts.jsonl logs and the
run's configuration:

  1. cheapness c: sqrt(cost) joins the window of the last ppo.cost_window
     responses (every response of the run, in file order); p5 and p95 are the
     window's percentiles (linear interpolation); c = 0.5 if p95 - p5 < 1e-8,
     else 1 - clip((sqrt(cost) - p5) / (p95 - p5), 0, 1)
  2. score s: -1 if rewards_raw.format < 1, else 0 if the outcome (ans, or em
     with ppo.outcome = "em") is 0, else (1 - alpha) outcome + alpha c
  3. token rewards over the response's policy tokens k = 1..n:
     r_k = -beta kl_k + [k = n] s           (beta = ppo.kl_coef; a run file
                                             without it: train.kl_coef)
  4. GAE: delta_k = r_k + gamma V_{k+1} - V_k (V_{n+1} = 0),
     A_k = delta_k + gamma lam A_{k+1}, R_k = A_k + V_k
  5. whitening over all tokens of the step (ppo.whiten_advantages):
     (A - mu) / sqrt(var + 1e-8), var the unbiased variance (0 for one token)

and compares the score, the cheapness, every token's advantage and return,
and the response's "advantage" (its first token's) with the logged ones. The
logged values and KL terms are float32 in the Go code: they are read back as
float32 before use, and the recomputed advantages and returns are rounded to
float32, as the loss received them, before the comparison.

Usage:
  gae_reference.py check RUN_DIR   exit 0 if every difference is at most 1e-6,
                                   1 if one is larger or a record is
                                   inconsistent, 2 on unreadable input
"""

import json
import math
import os
import re
import struct
import sys
import tomllib

TOLERANCE = 1e-6

PPO_DEFAULTS = {"gamma": 1.0, "lam": 1.0, "vf_coef": 0.1, "value_clip": 0.5, "value_lr": 0.0,
                "whiten_advantages": True, "outcome": "f1", "cost_coef": 0.0, "cost_window": 1000,
                "kl_coef": 0.001}
TRAIN_KL_DEFAULT = 0.001


class InputError(Exception):
    """Unreadable or invalid input (exit status 2)."""


class Mismatch(Exception):
    """A record that cannot be recomputed (exit status 1)."""


def f32(x):
    """Rounds to the nearest float32 (what Go's float32 holds)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def load_config(path):
    with open(path, "rb") as f:
        doc = tomllib.load(f)
    train = doc.get("train", {})
    if train.get("algorithm", "grpo") != "ppo":
        raise InputError("%s: train.algorithm is %r, not \"ppo\"" % (path, train.get("algorithm", "grpo")))
    ppo = dict(PPO_DEFAULTS)
    unknown = set(doc.get("ppo", {})) - set(PPO_DEFAULTS)
    if unknown:
        raise InputError("%s: unknown [ppo] keys: %s" % (path, ", ".join(sorted(unknown))))
    if "kl_coef" not in doc.get("ppo", {}):
        # Written before ppo.kl_coef existed: such a run weighed its KL by
        # train.kl_coef.
        ppo["kl_coef"] = float(train.get("kl_coef", TRAIN_KL_DEFAULT))
    ppo.update(doc.get("ppo", {}))
    ppo["kl_coef"] = float(ppo["kl_coef"])
    return ppo


def step_configs(run_dir):
    """[(K, cfg)] sorted by K: config.toml as K = 0, config-K.toml from step K on."""
    out = []
    for name in os.listdir(run_dir):
        m = re.fullmatch(r"config-(\d+)\.toml", name)
        if name == "config.toml" or m:
            out.append((int(m.group(1)) if m else 0, load_config(os.path.join(run_dir, name))))
    if not any(k == 0 for k, _ in out):
        raise InputError("%s: no config.toml" % run_dir)
    return sorted(out, key=lambda kc: kc[0])


def config_at(configs, step):
    cfg = None
    for k, c in configs:
        if k <= step:
            cfg = c
    return cfg


def percentile(sorted_xs, q):
    pos = (len(sorted_xs) - 1) * q / 100.0
    i = math.floor(pos)
    if i + 1 >= len(sorted_xs):
        return sorted_xs[-1]
    return sorted_xs[i] + (sorted_xs[i + 1] - sorted_xs[i]) * (pos - i)


def cheapness(window, cost, size):
    r = math.sqrt(max(cost, 0.0))
    window.append(r)
    del window[:max(0, len(window) - size)]
    xs = sorted(window)
    lo, hi = percentile(xs, 5), percentile(xs, 95)
    if hi - lo < 1e-8:
        return 0.5
    return 1.0 - min(max((r - lo) / (hi - lo), 0.0), 1.0)


def score(raw, em, cfg, cheap):
    if raw["format"] < 1:
        return -1.0
    outcome = em if cfg["outcome"] == "em" else raw["ans"]
    if outcome == 0:
        return 0.0
    alpha = cfg["cost_coef"]
    return (1 - alpha) * outcome + alpha * cheap


def gae(score_, values, kls, cfg):
    """Raw advantages and returns of one response's policy tokens."""
    n = len(values)
    adv, ret = [0.0] * n, [0.0] * n
    next_value, last = 0.0, 0.0
    for k in range(n - 1, -1, -1):
        r = -cfg["kl_coef"] * kls[k] if kls is not None else 0.0
        if k == n - 1:
            r += score_
        delta = r + cfg["gamma"] * next_value - values[k]
        last = delta + cfg["gamma"] * cfg["lam"] * last
        adv[k], ret[k] = last, last + values[k]
        next_value = values[k]
    return adv, ret


def whiten(advs):
    flat = [a for adv in advs for a in adv]
    if not flat:
        return advs
    mu = sum(flat) / len(flat)
    var = sum((a - mu) * (a - mu) for a in flat) / len(flat)
    var = var * (len(flat) / (len(flat) - 1)) if len(flat) > 1 else 0.0
    inv = 1.0 / math.sqrt(var + 1e-8)
    return [[(a - mu) * inv for a in adv] for adv in advs]


def check_step(step, recs, cfg, window):
    """Largest |recomputed - logged| over a step's records."""
    worst = 0.0

    def cmp(what, lineno, want, got):
        nonlocal worst
        d = abs(want - got)
        if not math.isfinite(d):
            raise Mismatch("line %d: %s: recomputed %r, logged %r" % (lineno, what, want, got))
        worst = max(worst, d)

    advs, rets = [], []
    for lineno, rec in recs:
        p = rec["ppo"]
        cheap = cheapness(window, float(p["cost"]), int(cfg["cost_window"]))
        cmp("cheapness", lineno, cheap, float(p["cheapness"]))
        s = score(rec["rewards_raw"], float(rec["em"]), cfg, cheap)
        cmp("score", lineno, s, float(p["score"]))
        values = [f32(v) for v in p["values"]]
        kls = [f32(x) for x in p["kl"]] if p.get("kl") is not None else None
        if kls is not None and len(kls) != len(values):
            raise Mismatch("line %d: %d KL terms for %d values" % (lineno, len(kls), len(values)))
        if len(p["advantages"]) != len(values) or len(p["returns"]) != len(values):
            raise Mismatch("line %d: advantages, returns and values differ in length" % lineno)
        # The logged score is what the Go code used; recompute from it, so
        # that a score mismatch is reported once, not through every token.
        adv, ret = gae(float(p["score"]), values, kls, cfg)
        advs.append(adv)
        rets.append(ret)
    if cfg["whiten_advantages"]:
        advs = whiten(advs)
    for (lineno, rec), adv, ret in zip(recs, advs, rets):
        p = rec["ppo"]
        for k in range(len(adv)):
            cmp("advantage of token %d" % k, lineno, f32(adv[k]), f32(float(p["advantages"][k])))
            cmp("return of token %d" % k, lineno, f32(ret[k]), f32(float(p["returns"][k])))
        if adv:
            cmp("advantage (first token's)", lineno, adv[0], float(rec["advantage"]))
    return worst


def check(run_dir):
    try:
        configs = step_configs(run_dir)
        steps = {}
        with open(os.path.join(run_dir, "rollouts.jsonl")) as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                rec = json.loads(line)
                if "ppo" not in rec:
                    raise InputError("line %d: no \"ppo\" record (not a train.algorithm = \"ppo\" run?)" % lineno)
                steps.setdefault(int(rec["step"]), []).append((lineno, rec))
    except (OSError, ValueError, KeyError, TypeError, InputError) as e:
        print("gae_reference.py: %s" % e, file=sys.stderr)
        return 2
    if not steps:
        print("gae_reference.py: %s/rollouts.jsonl holds no record" % run_dir, file=sys.stderr)
        return 2
    window, worst, tokens = [], 0.0, 0
    try:
        for step in sorted(steps):
            d = check_step(step, steps[step], config_at(configs, step), window)
            tokens += sum(len(r["ppo"]["values"]) for _, r in steps[step])
            print("step %d: %d responses, max |diff| %.3g" % (step, len(steps[step]), d))
            worst = max(worst, d)
    except (Mismatch, KeyError, TypeError, ValueError) as e:
        print("gae_reference.py: %s" % e, file=sys.stderr)
        return 1
    ok = worst <= TOLERANCE
    print("%d steps, %d policy tokens: max |recomputed - logged| = %.3g (tolerance %g): %s"
          % (len(steps), tokens, worst, TOLERANCE, "ok" if ok else "MISMATCH"))
    return 0 if ok else 1


def main(argv):
    if len(argv) != 3 or argv[1] != "check":
        print(__doc__, file=sys.stderr)
        return 2
    return check(argv[2])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
