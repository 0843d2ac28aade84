#!/usr/bin/env python3
"""serve_probe.py — starts `recal serve` with the given arguments, waits for the
base URL it prints, then sends chat completions: N one after another, then C
clients at once (R requests each), and prints one JSON line of timings and
the first answers. Standard library only (the GPU machine has no network).

    serve_probe.py --sequential 4 --clients 32 --requests 2 -- bin/recal serve --checkpoint ... --set ...
"""
import argparse
import json
import subprocess
import sys
import threading
import time
import urllib.request

QUESTIONS = [
    "who wrote the novel nineteen eighty-four?",
    "what is the capital of australia?",
    "which river flows through the city where the eiffel tower stands?",
    "who was president of the united states when the first moon landing happened?",
    "in what year did the berlin wall fall?",
    "what is the largest planet in the solar system?",
    "who painted the mona lisa?",
    "the director of jaws also directed which 1993 dinosaur film?",
]


def ask(base, model, q):
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": q}]}).encode()
    req = urllib.request.Request(base + "/chat/completions", data=body, headers={"Content-Type": "application/json"})
    t = time.time()
    with urllib.request.urlopen(req, timeout=300) as r:
        out = json.load(r)
    return time.time() - t, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sequential", type=int, default=4)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--label", default="")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    res = {"label": a.label, "cmd": " ".join(cmd)}
    try:
        base = proc.stdout.readline().strip()  # the API's base URL, once ready
        if not base.startswith("http"):
            raise SystemExit(f"serve printed {base!r}, not a URL (exit {proc.poll()})")
        res["ready_s"] = round(time.time() - t0, 2)
        with urllib.request.urlopen(base + "/models", timeout=30) as r:
            model = json.load(r)["data"][0]["id"]
        res["model"] = model
        lat = []
        answers = []
        for i in range(a.sequential):
            dt, out = ask(base, model, QUESTIONS[i % len(QUESTIONS)])
            lat.append(dt)
            answers.append(out["choices"][0]["message"]["content"][:120])
        res["sequential_s"] = [round(x, 3) for x in lat]
        res["answers"] = answers
        errs, clat = [], []
        lock = threading.Lock()

        def client(k):
            for j in range(a.requests):
                try:
                    dt, _ = ask(base, model, QUESTIONS[(k + j) % len(QUESTIONS)])
                    with lock:
                        clat.append(dt)
                except Exception as e:  # noqa: BLE001 — counted and reported
                    with lock:
                        errs.append(repr(e)[:200])

        t = time.time()
        ths = [threading.Thread(target=client, args=(k,)) for k in range(a.clients)]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        wall = time.time() - t
        clat.sort()
        n = len(clat)
        res["concurrent"] = {
            "clients": a.clients, "requests": n, "errors": len(errs), "first_errors": errs[:3],
            "wall_s": round(wall, 3), "req_per_s": round(n / wall, 2) if wall > 0 else None,
            "p50_s": round(clat[n // 2], 3) if n else None, "p99_s": round(clat[min(n - 1, int(n * 0.99))], 3) if n else None,
        }
        res["sequential_req_per_s"] = round(len(lat) / sum(lat), 2) if lat else None
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    res["exit"] = proc.returncode
    print(json.dumps(res))


if __name__ == "__main__":
    main()
