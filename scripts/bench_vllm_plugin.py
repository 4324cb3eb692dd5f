#!/usr/bin/env python3
"""vLLM (CPU) generation throughput with and without Strata's expert plugin.

Runs in the vLLM venv (scripts/setup_vllm_venv.sh; the strata wheel and python/strata_vllm
installed, as scripts/test_python.sh does):

    .cache/venv-vllm/bin/python scripts/bench_vllm_plugin.py [--models tiny,big]
        [--batches 1,16,64] [--tokens 32] [--dtype bfloat16] [--rounds 1]

`tiny` is the shipped strata-tiny-moe; `big` a random Qwen3-MoE checkpoint of a realistic
layer shape (hidden 2048, 128 experts of 768, top-8; --big-layers layers, 2 by default:
1.2 GB each in BF16), written once into --big-dir (.cache/bench-qwen3moe-random; a tmpfs
such as /dev/shm where disk is short). Each (model, plugin) pair runs in its own process
(vLLM loads plugins once per process), plugin off and on alternating per round, so a
loaded machine slows both alike; the table gives generated tokens per second (prompt
processing included: short prompts) and the ratio on/off."""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "models" / "strata-tiny-moe"


def write_big(big, layers):
    """A random Qwen3-MoE in `big`: the tiny model's tokenizer and vocabulary, realistic MoE
    layers."""
    import torch
    from safetensors.torch import save_file

    cfg = json.loads((TINY / "config.json").read_text())
    cfg.update(hidden_size=2048, moe_intermediate_size=768, intermediate_size=6144,
               num_local_experts=128, num_experts=128, num_experts_per_tok=8,
               num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=4,
               head_dim=128)
    if (big / "config.json").exists() and json.loads((big / "config.json").read_text()) == cfg:
        return
    big.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    h, i, e, v = 2048, 768, 128, cfg["vocab_size"]
    hd, nq, nkv = 128, 32, 4

    def w(*shape):
        return (torch.randn(*shape, generator=g) / shape[-1] ** 0.5).bfloat16()

    t = {"model.embed_tokens.weight": w(v, h), "lm_head.weight": w(v, h),
         "model.norm.weight": torch.ones(h, dtype=torch.bfloat16)}
    for layer in range(layers):
        p = f"model.layers.{layer}."
        t[p + "input_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
        t[p + "post_attention_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
        t[p + "self_attn.q_proj.weight"] = w(nq * hd, h)
        t[p + "self_attn.k_proj.weight"] = w(nkv * hd, h)
        t[p + "self_attn.v_proj.weight"] = w(nkv * hd, h)
        t[p + "self_attn.o_proj.weight"] = w(h, nq * hd)
        t[p + "self_attn.q_norm.weight"] = torch.ones(hd, dtype=torch.bfloat16)
        t[p + "self_attn.k_norm.weight"] = torch.ones(hd, dtype=torch.bfloat16)
        t[p + "mlp.gate.weight"] = w(e, h)
        for x in range(e):
            q = f"{p}mlp.experts.{x}."
            t[q + "gate_proj.weight"] = w(i, h)
            t[q + "up_proj.weight"] = w(i, h)
            t[q + "down_proj.weight"] = w(h, i)
    save_file(t, str(big / "model.safetensors"))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        (big / name).write_bytes((TINY / name).read_bytes())
    (big / "config.json").write_text(json.dumps(cfg, indent=2))


def worker(a):
    """One process: a model, one plugin setting, every batch size."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=a.model, dtype=a.dtype, enforce_eager=True, max_model_len=256,
              max_num_seqs=max(a.batches), seed=0)
    params = SamplingParams(temperature=0, max_tokens=a.tokens, ignore_eos=True)
    llm.generate(["warm up"], SamplingParams(max_tokens=4), use_tqdm=False)
    result = {}
    for b in a.batches:
        prompts = [f"Request {k}: tell me a story about the number {k}." for k in range(b)]
        started = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        took = time.perf_counter() - started
        result[b] = sum(len(o.outputs[0].token_ids) for o in outs) / took
    print("RESULT " + json.dumps(result), flush=True)


def run(model, plugin, a):
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="2", VLLM_PLUGINS="strata" if plugin else "",
               STRATA_VLLM_FORMAT=a.format)
    cmd = [sys.executable, __file__, "--worker", "--model", str(model), "--dtype", a.dtype,
           "--tokens", str(a.tokens), "--batches", ",".join(map(str, a.batches))]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    if r.returncode != 0 or not lines:
        sys.exit(f"vLLM failed ({model.name}, plugin={plugin}):\n{r.stderr[-3000:]}")
    # vLLM logs to stdout and stderr.
    if plugin and "Strata computes vLLM's MoE" not in r.stdout + r.stderr:
        sys.exit(f"the plugin did not take over ({model.name}):\n{r.stdout[-3000:]}")
    return {int(k): v for k, v in json.loads(lines[-1][7:]).items()}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="tiny,big")
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--format", default="bf16", help="Strata's expert format (STRATA_VLLM_FORMAT)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--big-layers", type=int, default=2)
    p.add_argument("--big-dir", type=Path, default=ROOT / ".cache" / "bench-qwen3moe-random")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    a = p.parse_args()
    a.batches = [int(b) for b in a.batches.split(",")]
    if a.worker:
        return worker(a)
    import strata.ops

    if getattr(strata.ops, "build_profile", None) == "dev":
        # scripts/test_python.sh installs a dev build (kernels at opt-level 1): measuring it
        # is what made the plugin look 2-5x slower than vLLM.
        sys.exit("bench_vllm_plugin: the installed strata wheel is a dev build; install a "
                 "release one (maturin build --release -m crates/python/Cargo.toml)")
    models = {"tiny": TINY, "big": a.big_dir}
    print(f"# load average before: {os.getloadavg()}")
    print(f"| model | batch | vLLM tok/s | vLLM + Strata tok/s | ratio |  (dtype {a.dtype}, "
          f"Strata format {a.format}, {a.tokens} tokens, {a.rounds} round(s), best of rounds)")
    print("| --- | --- | --- | --- | --- |")
    for name in a.models.split(","):
        if name == "big":
            write_big(a.big_dir, a.big_layers)
        best = {False: {}, True: {}}
        for _ in range(a.rounds):
            for plugin in (False, True):
                for b, tps in run(models[name], plugin, a).items():
                    best[plugin][b] = max(best[plugin].get(b, 0.0), tps)
        for b in a.batches:
            off, on = best[False][b], best[True][b]
            print(f"| {name} | {b} | {off:.1f} | {on:.1f} | {on / off:.2f} |", flush=True)
    print(f"# load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
