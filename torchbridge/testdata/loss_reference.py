#!/usr/bin/env python3
"""Independent reference for the GRPO loss of rc_policy_backward (recal.h).

Written from the objective, not from recal_train.cc: in float64 with PyTorch, the
way PPO-style trainers (verl's compute_policy_loss) write it, from logged
per-token quantities of one mini-batch:

  ratio    rho = exp(logp - old_logp)
  pg       = max(-A rho, -A clip(rho, 1 - eps, 1 + eps))   (= -min(rho A, clip(rho) A))
  clipped  = token where -A clip(rho) > -A rho             (the clipped term wins)
  k3 KL    = exp(ref - logp) - (ref - logp) - 1            (Schulman's k3 estimator)
  loss     = sum_t mask_t (pg_t + kl_coef k3_t - entropy_coef H_t) / N

N is the mini-batch's number of policy tokens (mask > 0): the token mean the
trainer gets by giving every micro-batch scale = 1/N. A is the sequence's
advantage; t runs over tokens 1.. (token 0 has no prefix).

Usage:
  loss_reference.py FILE   FILE (or - for stdin) is JSON
                           {"clip_eps": .2, "kl_coef": .3, "entropy_coef": .05,
                            "sequences": [{"advantage": 1.3, "mask": [...],
                              "logp": [...], "old_logp": [...],
                              "ref_logp": [...], "entropy": [...]}]}
                           (per-token lists indexed by token, as
                           torchbridge.Sequence; ref_logp may be absent: no KL)
                           prints {"loss", "tokens", "clipped", "kl",
                           "entropy", "ratio"}: loss as above, the others sums
                           over masked tokens weighted by the mask, as
                           rc_loss_stats reports them
Exit status 2 on unreadable input.
"""

import json
import sys

import torch


def reference(doc):
    eps = float(doc["clip_eps"])
    kl_coef = float(doc["kl_coef"])
    ent_coef = float(doc["entropy_coef"])
    f64 = torch.float64
    mask, adv, logp, old, ref, ent = [], [], [], [], [], []
    has_ref = None
    for i, s in enumerate(doc["sequences"]):
        n = len(s["mask"])
        keys = ["logp", "old_logp", "entropy"] + (["ref_logp"] if "ref_logp" in s else [])
        for k in keys:
            if len(s[k]) != n:
                raise ValueError("sequence %d: %s has %d entries for %d tokens" % (i, k, len(s[k]), n))
        if has_ref is None:
            has_ref = "ref_logp" in s
        elif has_ref != ("ref_logp" in s):
            raise ValueError("sequence %d: ref_logp given for some sequences only" % i)
        # Token 0 has no prefix: it is never scored.
        mask += s["mask"][1:]
        adv += [s["advantage"]] * (n - 1)
        logp += s["logp"][1:]
        old += s["old_logp"][1:]
        ent += s["entropy"][1:]
        ref += s["ref_logp"][1:] if has_ref else [0.0] * (n - 1)
    mask, adv, logp, old, ref, ent = (torch.tensor(v, dtype=f64) for v in (mask, adv, logp, old, ref, ent))
    on = mask > 0
    mask = torch.where(on, mask, torch.zeros_like(mask))
    n_tokens = int(on.sum())
    if n_tokens == 0:
        raise ValueError("no policy tokens")

    ratio = torch.exp(logp - old)
    pg_losses1 = -adv * ratio
    pg_losses2 = -adv * torch.clamp(ratio, 1.0 - eps, 1.0 + eps)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)
    clipped = (pg_losses2 > pg_losses1).to(f64)
    if has_ref:
        d = ref - logp
        k3 = torch.exp(d) - d - 1.0
    else:
        k3 = torch.zeros_like(logp)
    per_token = pg_losses + kl_coef * k3 - ent_coef * ent
    loss = (mask * per_token).sum() / n_tokens
    return {
        "loss": loss.item(),
        "tokens": mask.sum().item(),
        "clipped": (mask * clipped).sum().item(),
        "kl": (mask * k3).sum().item(),
        "entropy": (mask * ent).sum().item(),
        "ratio": (mask * ratio).sum().item(),
    }


def main(argv):
    if len(argv) != 2:
        sys.stderr.write(__doc__)
        return 2
    try:
        f = sys.stdin if argv[1] == "-" else open(argv[1])
        doc = json.load(f)
        out = reference(doc)
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.stderr.write("loss_reference.py: %s\n" % e)
        return 2
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
