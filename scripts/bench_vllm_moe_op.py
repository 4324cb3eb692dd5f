#!/usr/bin/env python3
"""One fused-MoE layer: Strata's `strata.ops` against vLLM's own CPU kernel
(`torch.ops._C.cpu_fused_moe` on weights prepacked by `cpu_prepack_moe_weight`, what vLLM's
`CPUUnquantizedExperts` runs), at a Qwen3-30B-A3B layer's shape by default (hidden 2048, 128
experts of 768, top-8) and random routing.

Runs in the vLLM venv (scripts/setup_vllm_venv.sh, with the strata wheel installed):

    .cache/venv-vllm/bin/python scripts/bench_vllm_moe_op.py [--tokens 1,16,128]
        [--dtype bfloat16] [--rounds 5] [--iters 20]

Both run in this one process on torch's threads (vLLM) and Strata's pool, alternating
within each round; the table gives the median time per call over rounds and vLLM's time
divided by Strata's (above 1: Strata faster). Strata's column goes through the vLLM
plugin's `apply` (bf16 activations included), so it is what vLLM pays per MoE layer."""

import argparse
import statistics
import time

import torch


def timed(fn, iters):
    fn()
    started = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - started) / iters


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", default="1,16,128")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--inter", type=int, default=768)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--dtype", default="bfloat16", help="weights' and activations' dtype")
    p.add_argument("--format", default="bf16", help="Strata's packed format")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    a = p.parse_args()

    import strata.ops
    from strata_vllm import experts as plugin
    from vllm._custom_ops import cpu_fused_moe, cpu_prepack_moe_weight

    dtype = getattr(torch, a.dtype)
    g = torch.Generator().manual_seed(0)
    e, h, i, k = a.experts, a.hidden, a.inter, a.topk
    w13 = (torch.randn(e, 2 * i, h, generator=g) / h**0.5).to(dtype)
    w2 = (torch.randn(e, h, i, generator=g) / i**0.5).to(dtype)
    isa = "vec"
    vllm_w13, vllm_w2 = cpu_prepack_moe_weight(w13, isa), cpu_prepack_moe_weight(w2, isa)
    strata_w = plugin.pack(w13, w2, a.format)
    print(f"# {torch.get_num_threads()} torch threads; Strata {strata_w!r}; dtype {a.dtype}; "
          f"median of {a.rounds} rounds of {a.iters} calls")
    print("| tokens | vLLM ms | Strata ms | vLLM / Strata | max abs diff |")
    print("| --- | --- | --- | --- | --- |")
    for t in [int(x) for x in a.tokens.split(",")]:
        x = torch.randn(t, h, generator=g).to(dtype)
        logits = torch.randn(t, e, generator=g)
        tw, ids = torch.topk(logits.softmax(-1), k)
        tw = tw / tw.sum(-1, keepdim=True)
        ids = ids.to(torch.int32)
        out_v = torch.empty(t, h, dtype=dtype)
        out_s = torch.empty(t, h, dtype=dtype)

        def run_vllm():
            cpu_fused_moe(out_v, x, vllm_w13, vllm_w2, None, None, tw, ids, "silu", isa)

        def run_strata():
            plugin.forward(strata_w, out_s, x, tw, ids, None)

        times = {"v": [], "s": []}
        for _ in range(a.rounds):
            times["v"].append(timed(run_vllm, a.iters))
            times["s"].append(timed(run_strata, a.iters))
        v, s = statistics.median(times["v"]), statistics.median(times["s"])
        diff = (out_v.float() - out_s.float()).abs().max().item()
        print(f"| {t} | {v * 1e3:.2f} | {s * 1e3:.2f} | {v / s:.2f} | {diff:.2g} |", flush=True)


if __name__ == "__main__":
    main()
