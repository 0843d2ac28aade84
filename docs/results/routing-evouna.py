#!/usr/bin/env python3
"""Measurements of docs/results/routing-evouna.md that recal does not print.

  python3 docs/results/routing-evouna.py escalation RUN_DIR FIRST LAST
      For the training rollouts of GRPO steps FIRST..LAST (RUN_DIR/rollouts.jsonl):
      of the responses whose first two calls were made, how many asked a third
      model, split by whether the first two replies agree: router.Agreeing's
      rule (version 2: on what the models wrote, the calls' "evidence" when
      the rollouts have it, either way round, a reply of at most five words
      its own answer); for runs made before evidence was recorded, version 1
      (the second reply's stated answer mentioned by the first reply).
  python3 docs/results/routing-evouna.py teacher FRONTIER_WORK [LOG]
      The "agree" route's rule (fid, chatgpt, then gpt4 when they disagree)
      applied to the test questions' reference answers of a `recal frontier`
      work folder (eval/reference/results-model-*.jsonl): EM, USD and calls
      per question. With LOG (the outcome log, .jsonl or .jsonl.gz), also
      the same cascade deciding agreement on the logged reply texts instead
      of the rendered ones (fid's logged answer in chatgpt's logged reply),
      scored by the same reference answers: what the rendering adds; and
      deciding it by router.Agreeing version 2 on the logged texts, which is
      what the policy's note reads since replay evidence.
  python3 docs/results/routing-evouna.py copies RESULTS_JSONL
      For a policy's eval results (a `recal frontier` work folder's
      eval/<point>/results-*.jsonl): its EM against the EM of answering, on
      its own routes, with the last reply's stated answer (what the warm-up
      shows), and how many answers differ from that, by the number of calls.

Standard library only; normalisation as recal's data.Normalize (SQuAD's).
"""
import collections
import gzip
import json
import re
import string
import sys

PUNCT = set(string.punctuation)


def norm(s):
    s = "".join(c for c in s.lower() if c not in PUNCT)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def mentions(text, answer):
    a = norm(answer)
    return a != "" and (" " + a + " ") in (" " + norm(text) + " ")


def stated(reply):
    k = reply.lower().rfind("answer is")
    if k < 0:
        return None
    return " ".join(reply[k + len("answer is"):].strip().rstrip(".").split()[:8])


def agree(first, second):
    a = stated(second)
    return a is not None and mentions(first, a)


def short(reply):
    """router.ShortAnswer: the stated answer, else a reply of at most five words."""
    a = stated(reply)
    if a is not None:
        return a or None
    text = reply.strip().rstrip(".")
    return text if 0 < len(text.split()) <= 5 else None


def agree2(x, y):
    """router.Agreeing, version 2, on two texts the models wrote."""
    a, b = short(x), short(y)
    return (a is not None and mentions(y, a)) or (b is not None and mentions(x, b))


def written(call):
    return call.get("evidence") or call["reply"]


def escalation(run, lo, hi):
    c = collections.Counter()
    for line in open(run + "/rollouts.jsonl"):
        o = json.loads(line)
        if not lo <= o["step"] <= hi:
            continue
        calls = o["calls"] or []
        if len(calls) < 2 or calls[0].get("failed") or calls[1].get("failed"):
            c["fewer than 2 calls made"] += 1
            continue
        if any("evidence" in c for c in calls):
            agreed = agree2(written(calls[0]), written(calls[1]))
        else:
            agreed = agree(calls[0]["reply"], calls[1]["reply"])
        key = "agree" if agreed else "disagree"
        c[(key, "escalated" if len(calls) > 2 else "stopped")] += 1
    for key in ("agree", "disagree"):
        esc, stop = c[(key, "escalated")], c[(key, "stopped")]
        n = esc + stop
        print(f"{key:9s} {n:5d} responses, escalated {esc:5d} ({100 * esc / max(n, 1):.1f}%)")
    print(f"fewer than 2 calls made: {c['fewer than 2 calls made']}")


def em(answer, golden):
    return any(norm(answer) == norm(g) for g in golden)


def copies(path):
    by = collections.defaultdict(lambda: collections.Counter())
    for line in open(path):
        o = json.loads(line)
        calls = [c for c in o.get("calls") or [] if not c.get("failed")]
        k = len(o.get("calls") or [])
        c = by[k]
        c["n"] += 1
        c["policy"] += o["em"]
        if not calls:
            continue
        a = stated(calls[-1]["reply"]) or ""
        c["last reply"] += em(a, o["golden_answers"])
        if norm(a) != norm(o["answer"]):
            c["differ"] += 1
            c["differ, unanswered"] += not o["answer"].strip()
            c["differ, policy right"] += o["em"]
            c["differ, last reply right"] += em(a, o["golden_answers"])
    total = collections.Counter()
    for k in sorted(by):
        total.update(by[k])
        c = by[k]
        print(f"{k} calls: {c['n']:4d} questions, policy EM {c['policy'] / c['n']:.3f}, last reply's answer "
              f"{c['last reply'] / c['n']:.3f}; {c['differ']} answers differ (policy right {c['differ, policy right']}, "
              f"last reply right {c['differ, last reply right']}, no answer {c['differ, unanswered']})")
    n = total["n"]
    print(f"all:     {n:4d} questions, policy EM {total['policy'] / n:.3f}, last reply's answer "
          f"{total['last reply'] / n:.3f}; {total['differ']} answers differ (policy right {total['differ, policy right']}, "
          f"last reply right {total['differ, last reply right']}, no answer {total['differ, unanswered']})")


def cascade(res, agreed):
    n = em = cost = calls = 0
    for q, d in res.items():
        n += 1
        c = d["fid"]["cost"] + d["chatgpt"]["cost"]
        if agreed(q, d):
            em, calls = em + d["chatgpt"]["em"], calls + 2
        else:
            em, calls, c = em + d["gpt4"]["em"], calls + 3, c + d["gpt4"]["cost"]
        cost += c
    return f"{n} questions: EM {em / n:.3f}, {cost / n:.6f} USD and {calls / n:.2f} calls per question"


def teacher(work, log=None):
    res = collections.defaultdict(dict)
    for m in ("fid", "chatgpt", "gpt4"):
        for line in open(f"{work}/eval/reference/results-model-{m}.jsonl"):
            o = json.loads(line)
            res[o["id"]][m] = o
    print("rendered replies:", cascade(res, lambda q, d: agree(d["fid"]["response"], d["chatgpt"]["response"])))
    if log is None:
        return
    logged = {}
    with (gzip.open(log, "rt") if log.endswith(".gz") else open(log)) as f:
        for line in f:
            o = json.loads(line)
            logged[(o["question_id"], o["model"])] = o.get("reply") or ""
    print("logged replies:  ", cascade(res, lambda q, d: mentions(logged[(q, "chatgpt")], logged[(q, "fid")])))
    print("logged, rule v2: ", cascade(res, lambda q, d: agree2(logged[(q, "fid")] or d["fid"]["response"],
                                                               logged[(q, "chatgpt")] or d["chatgpt"]["response"])))


if __name__ == "__main__":
    if sys.argv[1:2] == ["escalation"] and len(sys.argv) == 5:
        escalation(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif sys.argv[1:2] == ["teacher"] and len(sys.argv) in (3, 4):
        teacher(*sys.argv[2:])
    elif sys.argv[1:2] == ["copies"] and len(sys.argv) == 3:
        copies(sys.argv[2])
    else:
        sys.exit(__doc__)
