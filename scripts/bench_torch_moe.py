#!/usr/bin/env python3
"""PyTorch BF16 baseline for `strata bench moe`: the same MoE layer, shape and routing on CPU.

The layer is written the way Hugging Face's Qwen3-MoE block runs it (loop over experts with
tokens, F.linear for gate/up and down, SiLU(gate) * up, index_add_ of the weighted outputs),
in bfloat16, which PyTorch sends to oneDNN (AMX or AVX-512 BF16 where the CPU has them).
Routing is uniform like the Rust benchmark: token t's j-th expert is (t * topk + j + offset)
% experts, the offset advancing each call so that weights come from DRAM.

Usage: /work/venv-ref/bin/python scripts/bench_torch_moe.py [--tokens 1,8,64,512,4096] [--json]
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--inter", type=int, default=768)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--tokens", default="1,8,64,512,4096")
    p.add_argument("--min-seconds", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    h, i, e, k = a.hidden, a.inter, a.experts, a.topk
    g = torch.Generator().manual_seed(0)
    # Stored like nn.Linear weights: gate_up [E, 2I, H], down [E, H, I].
    w_gu = ((torch.rand(e, 2 * i, h, generator=g) - 0.5) * (2 / h**0.5)).to(torch.bfloat16)
    w_down = ((torch.rand(e, h, i, generator=g) - 0.5) * (2 / i**0.5)).to(torch.bfloat16)
    expert_bytes = (w_gu[0].numel() + w_down[0].numel()) * 2

    def layer(x, ids, wts):
        out = torch.zeros_like(x, dtype=torch.float32)
        flat = ids.reshape(-1)
        tok_of = torch.arange(x.shape[0]).repeat_interleave(k)
        for ex in torch.unique(flat).tolist():
            sel = (flat == ex).nonzero(as_tuple=True)[0]
            toks = tok_of[sel]
            gu = F.linear(x[toks], w_gu[ex])
            act = F.silu(gu[:, :i]) * gu[:, i:]
            y = F.linear(act, w_down[ex])
            out.index_add_(0, toks, y.float() * wts.reshape(-1)[sel, None])
        return out

    results = []
    for t in [int(s) for s in a.tokens.split(",")]:
        x = ((torch.rand(t, h, generator=g) - 0.5) * 2).to(torch.bfloat16)
        wts = torch.full((t, k), 1.0 / k)

        def call(c):
            off = (c * t * k) % e
            ids = (torch.arange(t * k) + off).remainder(e).reshape(t, k)
            layer(x, ids, wts)

        with torch.inference_mode():
            call(0)
            times, start, c = [], time.perf_counter(), 1
            while len(times) < 3 or (time.perf_counter() - start < a.min_seconds and len(times) < 2000):
                t0 = time.perf_counter()
                call(c)
                times.append(time.perf_counter() - t0)
                c += 1
        s = statistics.median(times)
        flops = 6.0 * t * k * h * i
        results.append({
            "format": "bf16",
            "tokens": t,
            "seconds": s,
            "tflops": flops / s / 1e12,
            "weight_gbs": min(t * k, e) * expert_bytes / s / 1e9,
        })
        if not a.json:
            r = results[-1]
            print(f"torch bf16 T={t:5d}: {s * 1e3:10.3f} ms  {r['tflops']:.3f} TFLOPS  {r['weight_gbs']:.1f} GB/s")
    if a.json:
        print(json.dumps({
            "shape": {"hidden": h, "inter": i, "experts": e, "topk": k},
            "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": a.threads,
            "results": results,
        }, indent=2))


if __name__ == "__main__":
    main()
