#!/usr/bin/env python3
"""Independent reference for ReCal's calibrated advantages (docs/method.md).

Plain Python 3.11 (tomllib), no third-party packages. It re-implements the
calibration pipeline from docs/method.md, not from the Go code, over the six
raw components ans, info, format, route, balance and cost (the last not in
the paper, weight 0 by default), and the cost component itself:

  r_cost = clip(1 - spend / (T * c_max), 0, 1), and 1 when T * c_max <= 0
           (spend: the response's pool spend in USD, 0 with no call;
           T: calls allowed, router.max_turns; c_max: the dearest single
           call the pool could make about the question)

  1. gating:   r_m <- r_m if r_ans > delta else 0, for m in `gated` (never ans)
  2. scalar:   r = sum_m lambda_m r_m              (after gating)
  3. advantage CAE on:  A = sum_m lambda_m (r_m - mu_i,m) / (sigma_i,m + eps)
               CAE off: A = (r - mu_i) / (sigma_i + eps)
  4. reweight: tau_i = clip(sigma_i / mean_i(sigma_i), tau_min, tau_max),
               tau_i = 1 when that mean < eps; A <- tau_i A
               (sigma_i: std of group i's scalar rewards)
  5. datanorm: A_hat = (A - mu_d) / (sigma_d + eps) over dataset d's responses

All standard deviations are population ones (divide by n). Groups and datasets
are taken in order of first appearance and every sum runs in input order with
plain float additions, so results match the Go package bit for bit.

Usage:
  reference.py calibrate FILE   FILE (or - for stdin) is JSON
                                {"config": {...}, "batch": [{"group": 3,
                                "dataset": "nq", "raw": {"ans": 1, ...}}]};
                                prints {"advantages": [...], "tau": [...]}
  reference.py generate OUT     writes the golden cases (fixed seeds) to OUT
  reference.py check RUN_DIR    recomputes every advantage in
                                RUN_DIR/rollouts.jsonl from its rewards_raw and
                                the [calibration] table of RUN_DIR/config.toml
                                (from step K on, of config-K.toml: written when
                                a resume changed the configuration);
                                exit 0 if max |diff| <= 1e-4, 1 if larger (or a
                                record is inconsistent), 2 on unreadable input

Config keys are those of recal.toml's [calibration] table; a missing key takes
the Go DefaultConfig value (below).
"""

import json
import math
import random
import sys

COMPONENTS = ["ans", "info", "format", "route", "balance", "cost"]

DEFAULTS = {
    "gating": True,
    "gated": ["info", "format", "route", "balance", "cost"],
    "gate_threshold": 0.0,
    "component_advantages": True,
    "variance_reweighting": True,
    "tau_min": 0.8,
    "tau_max": 1.25,
    "dataset_normalization": True,
    "epsilon": 1e-6,
    "weights": {"ans": 1.0, "info": 0.5, "format": 0.5, "route": 0.25, "balance": 0.25, "cost": 0.0},
}

CHECK_TOLERANCE = 1e-4


class InputError(Exception):
    """Unreadable or invalid input (exit status 2)."""


def resolve_config(table):
    """Fills a [calibration] table with defaults and validates it."""
    table = dict(table or {})
    unknown = set(table) - set(DEFAULTS)
    if unknown:
        raise InputError("unknown calibration keys: %s" % ", ".join(sorted(unknown)))
    cfg = {k: v for k, v in DEFAULTS.items() if k != "weights"}
    cfg["weights"] = dict(DEFAULTS["weights"])
    for k, v in table.items():
        if k == "weights":
            bad = set(v) - set(COMPONENTS)
            if bad:
                raise InputError("unknown calibration.weights keys: %s" % ", ".join(sorted(bad)))
            cfg["weights"].update({m: float(x) for m, x in v.items()})
        else:
            cfg[k] = v
    for k in ("gate_threshold", "tau_min", "tau_max", "epsilon"):
        cfg[k] = float(cfg[k])
    for g in cfg["gated"]:
        if g not in COMPONENTS or g == "ans":
            raise InputError("calibration.gated: bad component %r" % g)
    if cfg["tau_min"] > cfg["tau_max"]:
        raise InputError("calibration.tau_min > calibration.tau_max")
    if not cfg["epsilon"] > 0:
        raise InputError("calibration.epsilon must be > 0")
    if any(w < 0 for w in cfg["weights"].values()) or all(w == 0 for w in cfg["weights"].values()):
        raise InputError("calibration.weights must be >= 0 and not all zero")
    return cfg


def cost_reward(spend, calls_allowed, dearest):
    """The cost component: the share of the most the response could have
    spent (calls_allowed calls of the dearest call) that it did not spend."""
    budget = calls_allowed * dearest
    if not budget > 0:
        return 1.0
    return min(max(1.0 - spend / budget, 0.0), 1.0)


def mean_std(xs):
    """Mean and population std, summed left to right (no math.fsum)."""
    n = len(xs)
    total = 0.0
    for x in xs:
        total += x
    mu = total / n
    ss = 0.0
    for x in xs:
        ss += (x - mu) * (x - mu)
    return mu, math.sqrt(ss / n)


def first_appearance(keys):
    """Maps each distinct key to the indices holding it, in first-seen order."""
    out = {}
    for i, k in enumerate(keys):
        out.setdefault(k, []).append(i)
    return out


def calibrate(cfg, batch):
    """batch: list of {"group", "dataset", "raw": {component: value}}.
    Returns (advantages, taus)."""
    if not batch:
        raise InputError("empty batch")
    eps = cfg["epsilon"]
    lam = [cfg["weights"][m] for m in COMPONENTS]
    raws = []
    for i, resp in enumerate(batch):
        row = []
        for m in COMPONENTS:
            x = float(resp["raw"][m])
            if not math.isfinite(x):
                raise InputError("response %d: %s = %r" % (i, m, x))
            row.append(x)
        raws.append(row)

    groups = first_appearance([resp["group"] for resp in batch])
    for gid, idx in groups.items():
        if len({batch[i]["dataset"] for i in idx}) != 1:
            raise InputError("group %r spans datasets" % (gid,))

    # 1. gating
    rewards = []
    for row in raws:
        row = list(row)
        if cfg["gating"] and not row[0] > cfg["gate_threshold"]:
            for m, name in enumerate(COMPONENTS):
                if name in cfg["gated"]:
                    row[m] = 0.0
        rewards.append(row)

    # 2. scalar reward
    scalar = []
    for row in rewards:
        r = 0.0
        for m in range(len(COMPONENTS)):
            r += lam[m] * row[m]
        scalar.append(r)

    # 3. advantage
    adv = [0.0] * len(batch)
    group_sigma = {}
    for gid, idx in groups.items():
        mu, sigma = mean_std([scalar[i] for i in idx])
        group_sigma[gid] = sigma
        if not cfg["component_advantages"]:
            for i in idx:
                adv[i] = (scalar[i] - mu) / (sigma + eps)
            continue
        comp = {i: [0.0] * len(COMPONENTS) for i in idx}
        for m in range(len(COMPONENTS)):
            mu_m, sigma_m = mean_std([rewards[i][m] for i in idx])
            for i in idx:
                comp[i][m] = (rewards[i][m] - mu_m) / (sigma_m + eps)
        for i in idx:
            a = 0.0
            for m in range(len(COMPONENTS)):
                a += lam[m] * comp[i][m]
            adv[i] = a

    # 4. variance-aware reweighting
    taus = [1.0] * len(batch)
    if cfg["variance_reweighting"]:
        sigma_bar, _ = mean_std(list(group_sigma.values()))
        for gid, idx in groups.items():
            if sigma_bar < eps:
                tau = 1.0
            else:
                tau = min(max(group_sigma[gid] / sigma_bar, cfg["tau_min"]), cfg["tau_max"])
            for i in idx:
                taus[i] = tau
                adv[i] = tau * adv[i]

    # 5. per-dataset normalisation
    if cfg["dataset_normalization"]:
        out = list(adv)
        for _, idx in first_appearance([resp["dataset"] for resp in batch]).items():
            mu_d, sigma_d = mean_std([adv[i] for i in idx])
            for i in idx:
                out[i] = (adv[i] - mu_d) / (sigma_d + eps)
        adv = out
    return adv, taus


# ---------------------------------------------------------------- generate

DATASETS = ["nq", "triviaqa", "popqa", "hotpotqa", "2wiki", "musique", "bamboogle"]

# name, seed, config table, number of datasets, shuffle responses, constant groups only
CASES = [
    ("recal_two_datasets", 1, {}, 2, False, False),
    ("wo_lsc", 2, {"gating": False, "component_advantages": False}, 3, True, False),
    ("wo_cae", 3, {"component_advantages": False}, 2, False, False),
    ("wo_dao", 4, {"variance_reweighting": False, "dataset_normalization": False}, 2, True, False),
    ("wo_both", 5, {"gating": False, "component_advantages": False,
                    "variance_reweighting": False, "dataset_normalization": False}, 2, False, False),
    ("custom_gate_narrow_tau_one_dataset", 6,
     {"gate_threshold": 0.5, "gated": ["info", "route"], "tau_min": 0.9, "tau_max": 1.1,
      "weights": {"ans": 2.0, "info": 0.0, "format": 1.0, "route": 0.5, "balance": 0.1}}, 1, True, False),
    ("custom_wide_tau_big_eps_three_datasets", 7,
     {"gating": False, "tau_min": 0.5, "tau_max": 2.0, "epsilon": 1e-3}, 3, True, False),
    ("recal_constant_groups", 8, {}, 2, False, True),
    ("cost_ungated_one_dataset", 9,
     {"gated": ["info", "format", "route", "balance"], "weights": {"cost": 1.0}}, 1, True, False),
    ("cost_heavy_gate_half", 10,
     {"gate_threshold": 0.5, "weights": {"ans": 1.0, "info": 0.0, "format": 0.2, "route": 0.0,
                                          "balance": 0.0, "cost": 2.0}}, 3, True, False),
]

# The cost component in every setting of the four switches (gating, CAE,
# reweighting, dataset normalisation), cost gated (the default) and weighted.
SWITCHES = ["gating", "component_advantages", "variance_reweighting", "dataset_normalization"]
for bits in range(16):
    on = [bool(bits >> (3 - k) & 1) for k in range(4)]
    table = dict(zip(SWITCHES, on))
    table["weights"] = {"cost": 0.4}
    CASES.append(("cost_g%d_c%d_r%d_d%d" % tuple(int(b) for b in on), 100 + bits, table, 2, bits % 2 == 1, False))

T = 3  # calls allowed (router.max_turns) in the random batches


def random_response(rng):
    """Rewards shaped like router's: F1s in [0,1], format 0/1, route from k calls."""
    ans = rng.choice([0.0, 0.0, 1.0, round(rng.random(), 3)])
    info = rng.choice([0.0, round(rng.random(), 3)])
    fmt = float(rng.random() < 0.7)
    k = rng.randint(0, 3)
    route = 0.0 if k == 0 else 1.0 - (k - 1) / 3.0
    balance = 0.0 if k == 0 else round(rng.random(), 3)
    return dict(zip(COMPONENTS, [ans, info, fmt, route, balance]))


def calls_of(route):
    """The number of pool calls k that gave route = 1 - (k-1)/T (0: none)."""
    return 0 if route == 0 else round(1 + T * (1 - route))


def add_cost(crng, dearest, raw):
    """Sets raw["cost"] from a spend drawn for raw's calls: each call costs
    up to the dearest call, and now and then a response spends more than T
    dearest calls (a priced bound below a real call), which the clip takes."""
    k = calls_of(raw["route"])
    spend = 0.0
    for _ in range(k):
        spend += round(crng.uniform(0.0, dearest), 9)
    if k and crng.random() < 0.1:
        spend = (T + 1) * dearest
    raw["cost"] = cost_reward(spend, T, dearest)


def random_batch(rng, crng, n_datasets, shuffle, constant):
    """The other components are drawn from rng, the cost from crng, so the
    batches of the cases made before the cost component are unchanged."""
    names = rng.sample(DATASETS, n_datasets)
    ids = rng.sample(range(-20, 1000), rng.randint(3, 7))
    batch = []
    for gid in ids:
        dataset = rng.choice(names)
        same = constant or rng.random() < 0.15
        # The question's dearest call, USD; 0 now and then: a free pool.
        dearest = crng.choice([0.0, round(crng.uniform(1e-5, 2e-3), 9), round(crng.uniform(1e-5, 2e-3), 9)])
        first = random_response(rng)
        add_cost(crng, dearest, first)
        for _ in range(4):
            if same:
                raw = dict(first)
            else:
                raw = random_response(rng)
                add_cost(crng, dearest, raw)
            batch.append({"group": gid, "dataset": dataset, "raw": raw})
    if shuffle:
        rng.shuffle(batch)
    return batch


def generate(path):
    cases = []
    for name, seed, table, n_datasets, shuffle, constant in CASES:
        rng = random.Random(seed)
        crng = random.Random(seed + 1000003)
        batch = random_batch(rng, crng, n_datasets, shuffle, constant)
        adv, taus = calibrate(resolve_config(table), batch)
        cases.append({"name": name, "seed": seed, "config": table, "batch": batch,
                      "advantages": adv, "tau": taus})
    with open(path, "w") as f:
        json.dump({"generator": "calibration/testdata/reference.py generate", "cases": cases}, f, indent=1)
        f.write("\n")


# ---------------------------------------------------------------- check

def step_configs(run_dir):
    """[(K, cfg)] sorted by K: config.toml as K = 0, config-K.toml from step K on."""
    import os
    import re
    import tomllib
    out = []
    for name in os.listdir(run_dir):
        m = re.fullmatch(r"config-(\d+)\.toml", name)
        if name == "config.toml" or m:
            with open(os.path.join(run_dir, name), "rb") as f:
                out.append((int(m.group(1)) if m else 0, resolve_config(tomllib.load(f).get("calibration", {}))))
    if not any(k == 0 for k, _ in out):
        raise InputError("%s: no config.toml" % run_dir)
    return sorted(out, key=lambda kc: kc[0])


def check(run_dir):
    try:
        configs = step_configs(run_dir)
        steps = {}
        with open(run_dir + "/rollouts.jsonl") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                rec = json.loads(line)
                try:
                    # A run logged before the cost component has none: 0.
                    raw = dict(rec["rewards_raw"])
                    raw.setdefault("cost", 0.0)
                    resp = {"group": rec["group"], "dataset": rec["dataset"],
                            "raw": {m: raw[m] for m in COMPONENTS},
                            "advantage": float(rec["advantage"]), "line": lineno}
                except (KeyError, TypeError, ValueError) as e:
                    raise InputError("rollouts.jsonl:%d: missing or bad field %s" % (lineno, e))
                steps.setdefault(rec["step"], []).append(resp)
    except (OSError, ValueError) as e:
        raise InputError(str(e))
    if not steps:
        raise InputError("rollouts.jsonl: no records")

    worst, worst_where, failed = 0.0, None, False
    for step in sorted(steps):
        batch = steps[step]
        cfg = [c for k, c in configs if k <= step][-1]
        try:
            adv, _ = calibrate(cfg, batch)
        except InputError as e:
            print("step %s: cannot recompute: %s" % (step, e))
            failed = True
            continue
        diffs = [abs(a - r["advantage"]) if math.isfinite(r["advantage"]) else math.inf
                 for a, r in zip(adv, batch)]
        k = max(range(len(diffs)), key=diffs.__getitem__)
        n_groups = len({r["group"] for r in batch})
        print("step %s: %d responses, %d groups, max |diff| = %.3g" % (step, len(batch), n_groups, diffs[k]))
        if diffs[k] > worst or worst_where is None:
            worst, worst_where = diffs[k], (step, batch[k]["line"], adv[k], batch[k]["advantage"])
    if worst_where is None:
        print("overall: %d steps, none could be recomputed" % len(steps))
    else:
        step, line, want, got = worst_where
        print("overall: %d steps, max |diff| = %.3g (step %s, rollouts.jsonl:%s: recomputed %r, logged %r), tolerance %g"
              % (len(steps), worst, step, line, want, got, CHECK_TOLERANCE))
    if failed or worst > CHECK_TOLERANCE:
        print("FAIL")
        return 1
    print("OK")
    return 0


def main(argv):
    if len(argv) != 3 or argv[1] not in ("calibrate", "generate", "check"):
        sys.stderr.write(__doc__)
        return 2
    try:
        if argv[1] == "check":
            return check(argv[2])
        if argv[1] == "generate":
            generate(argv[2])
            return 0
        f = sys.stdin if argv[2] == "-" else open(argv[2])
        doc = json.load(f)
        adv, taus = calibrate(resolve_config(doc.get("config")), doc["batch"])
        json.dump({"advantages": adv, "tau": taus}, sys.stdout)
        sys.stdout.write("\n")
        return 0
    except InputError as e:
        sys.stderr.write("reference.py: %s\n" % e)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
