#!/usr/bin/env python3
"""Strata against PyTorch on the same BF16 MoE layer, alternating runs, best of each.

The host this was written on is shared and its figures move by 20-40% from one minute to the
next, so a single back-to-back pair is not a comparison. This script alternates `strata bench
moe --formats bf16 --json` and `bench_torch_moe.py --json` for a number of rounds and keeps,
for each token count, the fastest seconds per call of each side (each of those is already the
median of its own calls), then prints the ratio PyTorch / Strata (> 1: Strata is faster).
It only needs the Python standard library; the PyTorch side runs under --python.

Usage:
  /work/venv-ref/bin/python scripts/bench_moe_vs_torch.py --strata target/release/strata \\
      --python /work/venv-ref/bin/python [--rounds 3] [--tokens 1,8,64,512,4096] [--threads N]
      [--json]
"""

import argparse
import json
import os
import subprocess
import sys


def run_json(cmd, env=None):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strata", default="target/release/strata")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", default="1,8,64,512,4096")
    p.add_argument("--threads", type=int, default=None,
                   help="threads for both sides (STRATA_THREADS and torch); default: all cores")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    env = dict(os.environ)
    torch_threads = []
    if a.threads:
        env["STRATA_THREADS"] = str(a.threads)
        torch_threads = ["--threads", str(a.threads)]
    torch_script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_torch_moe.py")
    best = {"strata": {}, "torch": {}}
    peaks = []
    for r in range(a.rounds):
        s = run_json([a.strata, "bench", "moe", "--formats", "bf16", "--tokens", a.tokens,
                      "--json"], env)
        peaks.append(s["peaks"])
        t = run_json([a.python, torch_script, "--tokens", a.tokens, "--json"] + torch_threads)
        for side, doc in (("strata", s), ("torch", t)):
            for row in doc["results"]:
                prev = best[side].get(row["tokens"])
                best[side][row["tokens"]] = min(prev, row["seconds"]) if prev else row["seconds"]
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    rows = []
    for tok in sorted(best["strata"]):
        s, t = best["strata"][tok], best["torch"].get(tok)
        rows.append({"tokens": tok, "strata_s": s, "torch_s": t, "speedup": t / s if t else None})
    if a.json:
        print(json.dumps({"rounds": a.rounds, "threads": a.threads, "strata_peaks": peaks,
                          "rows": rows}, indent=2))
        return
    print("| tokens | PyTorch s | Strata bf16 s | speed-up |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| {row['tokens']} | {row['torch_s']:.4f} | {row['strata_s']:.4f} | {row['speedup']:.2f}x |")


if __name__ == "__main__":
    main()
