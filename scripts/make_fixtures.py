#!/usr/bin/env python3
"""Build tiny random checkpoints of every supported architecture plus Hugging Face reference logits.

Each fixture lands in ``tests/fixtures/<name>/`` with ``config.json``, safetensors weights,
``reference.json`` (architecture, versions, the two token sequences, notes) and
``logits_{0,1}.npy`` (float32 ``[len_i, vocab]``, one batch-1 eager float32 forward per sequence).

Design decision: every reference is computed from the model *reloaded from the fixture directory*
(after any config.json rewrite), never from the in-memory model, so the fixture is exactly what the
Rust engine will read. The in-memory model is only used to check that the round trip is lossless.

Sanity checks run for every fixture (the script aborts if one fails):
  * reloaded logits == in-memory logits within 1e-5 (for bf16: in-memory params rounded to bf16 first);
  * prefill of the first half + token-by-token decode with ``past_key_values`` matches the full forward
    within 1e-4;
  * an independent plain-torch re-implementation (``independent_forward``, no transformers modules)
    reproduces the logits within 1e-4;
  * the max-min spread of the logits is > 1 at every position (logits are not near-uniform);
  * for routers with ``e_score_correction_bias`` / expert groups: zeroing the bias, or disabling group
    limiting, changes the logits (so those code paths are actually exercised).

Usage: ``.venv/bin/python scripts/make_fixtures.py [--out tests/fixtures] [--only NAME ...]``
"""

from __future__ import annotations

import argparse
import copy
import glob
import json
import math
import shutil
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModelForCausalLM,
    DeepseekV2Config,
    DeepseekV3Config,
    Glm4MoeConfig,
    LlamaConfig,
    MixtralConfig,
    Qwen2Config,
    Qwen2MoeConfig,
    Qwen3MoeConfig,
)

SEQ_LENS = (23, 9)
KV_TOL = 1e-4
RELOAD_TOL = 1e-5
MIN_SPREAD = 1.0

# Shared tiny dimensions: deliberately no powers of two, so SIMD tails and shape bugs show up.
COMMON = dict(
    vocab_size=211,
    hidden_size=40,
    max_position_embeddings=128,
    initializer_range=0.1,
    tie_word_embeddings=False,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Give RMSNorm weights, biases and router correction biases non-trivial values.

    Default init leaves norms at 1 and biases / e_score_correction_bias at 0, which would hide
    bugs such as a forgotten norm weight or bias in the engine.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            parts = name.split(".")
            if parts[-1] == "weight" and p.dim() == 1 and "norm" in parts[-2]:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif parts[-1] == "bias":
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.5 * torch.randn(b.shape, generator=gen))


def forward_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        out = model(torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0].float()


def incremental_logits(model, ids: list[int]) -> torch.Tensor:
    """Prefill the first half, then decode the rest one token at a time through the KV cache."""
    half = len(ids) // 2
    with torch.no_grad():
        out = model(torch.tensor([ids[:half]], dtype=torch.long), use_cache=True)
        rows = [out.logits[0]]
        cache = out.past_key_values
        for t in range(half, len(ids)):
            out = model(torch.tensor([ids[t : t + 1]], dtype=torch.long), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            rows.append(out.logits[0])
    return torch.cat(rows, dim=0).float()


def load(path: Path, dtype: torch.dtype):
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, attn_implementation="eager", experts_implementation="eager"
    )
    model = model.float().eval()
    assert model.config._attn_implementation == "eager"
    assert model.config._experts_implementation in ("eager", None)
    return model


def rewrite_hub_rope(path: Path, rope_scaling: dict | None, renames: dict[str, str]) -> None:
    """Rewrite config.json the way hub checkpoints spell it: top-level rope_theta (+ rope_scaling)."""
    cfg_path = path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    rp = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rp["rope_theta"]
    if rope_scaling is not None:
        cfg["rope_scaling"] = rope_scaling
    for old, new in renames.items():
        if old in cfg:
            cfg[new] = cfg.pop(old)
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def save_stacked_sharded(model, path: Path) -> None:
    """Write the model's own (transformers-5 internal, stacked-expert) state_dict in two shards."""
    model.config.save_pretrained(path)
    sd = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    names = list(sd.keys())
    split = len(names) // 2
    shards = {
        "model-00001-of-00002.safetensors": names[:split],
        "model-00002-of-00002.safetensors": names[split:],
    }
    weight_map = {}
    total = 0
    for fname, keys in shards.items():
        save_file({k: sd[k] for k in keys}, str(path / fname), metadata={"format": "pt"})
        for k in keys:
            weight_map[k] = fname
            total += sd[k].numel() * sd[k].element_size()
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


# --------------------------------------------------------------------------------------------
# Fixture definitions. Each returns (config, options).
# options: dtype (save dtype), hub_rope (rope_scaling or None; key present => hub-style rewrite),
# renames (config.json key renames for hub style), stacked (write internal layout, sharded), notes.
# --------------------------------------------------------------------------------------------


def fx_qwen3_moe():
    cfg = Qwen3MoeConfig(
        **COMMON,
        num_hidden_layers=6,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=12,
        intermediate_size=52,
        moe_intermediate_size=20,
        num_experts=8,
        num_experts_per_tok=3,
        norm_topk_prob=True,
        decoder_sparse_step=2,
        mlp_only_layers=[3],
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    notes = (
        "Qwen3-MoE, 6 layers; decoder_sparse_step=2 and mlp_only_layers=[3] => MoE layers are 1 and 5, "
        "layers 0,2,3,4 are dense MLPs with intermediate_size=52 (moe_intermediate_size=20). "
        "GQA 6 q heads / 2 kv heads, explicit head_dim=12 (hidden/heads would be 6.67). q_norm/k_norm per head "
        "before RoPE. 8 experts, top-3, norm_topk_prob=true. Experts saved per-expert "
        "(mlp.experts.N.{gate,up,down}_proj.weight). config.json from save_pretrained: note it spells the "
        "expert count 'num_local_experts' (attribute_map of Qwen3MoeConfig), hub checkpoints spell it 'num_experts'."
    )
    return cfg, dict(notes=notes)


def fx_qwen3_moe_bf16():
    cfg = Qwen3MoeConfig(
        **COMMON,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=14,
        intermediate_size=52,
        moe_intermediate_size=18,
        num_experts=10,
        num_experts_per_tok=2,
        norm_topk_prob=False,
        decoder_sparse_step=1,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )
    notes = (
        "Qwen3-MoE, weights stored in BF16. Reference logits computed in float32 from the bf16-rounded "
        "weights (checkpoint loaded as bf16 then .float()). All 3 layers MoE, 10 experts top-2, "
        "norm_topk_prob=false (weights are the raw full-softmax probabilities). head_dim=14, 4 q / 2 kv heads, "
        "rope_theta=1e6. Engine computing in f32 from these bf16 weights should match closely (~1e-4)."
    )
    return cfg, dict(dtype=torch.bfloat16, notes=notes)


def fx_qwen3_moe_stacked():
    cfg = Qwen3MoeConfig(
        **COMMON,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=52,
        moe_intermediate_size=22,
        num_experts=6,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[0],
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    notes = (
        "Qwen3-MoE with experts in the STACKED layout transformers 5 uses internally, written directly with "
        "safetensors (no conversion), sharded into 2 files + model.safetensors.index.json. Per MoE layer N: "
        "'model.layers.N.mlp.experts.gate_up_proj' shape [E, 2*I, H] = [6, 44, 40] and "
        "'model.layers.N.mlp.experts.down_proj' shape [E, H, I] = [6, 40, 22]; router 'model.layers.N.mlp.gate.weight' "
        "[E, H]. gate_up_proj[e] is an nn.Linear weight [out, in]: rows 0..I-1 are the GATE projection "
        "(goes through SiLU), rows I..2I-1 are the UP projection: h = down_proj[e] @ (silu(W[:I] x) * (W[I:] x)). "
        "This equals torch.cat([gate_proj.weight, up_proj.weight], dim=0) of the per-expert layout. "
        "Layer 0 is dense (mlp_only_layers=[0]); head_dim defaults to hidden/heads=10 (no head_dim key)."
    )
    return cfg, dict(stacked=True, notes=notes)


def fx_qwen2_moe():
    cfg = Qwen2MoeConfig(
        **COMMON,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=52,
        moe_intermediate_size=18,
        shared_expert_intermediate_size=44,
        num_experts=7,
        num_experts_per_tok=2,
        norm_topk_prob=False,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        qkv_bias=True,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    notes = (
        "Qwen2-MoE with QKV bias (o_proj no bias), shared expert (intermediate 44) gated by "
        "sigmoid(shared_expert_gate(x)) ([1, H] weight, no bias), 7 routed experts top-2, norm_topk_prob=false. "
        "mlp_only_layers=[1] => layer 1 is a dense MLP (intermediate_size=52), layers 0 and 2 MoE. "
        "HUB-STYLE config.json: top-level rope_theta, no rope_parameters. head_dim = hidden/heads = 10."
    )
    return cfg, dict(hub_rope=None, notes=notes)


def fx_mixtral():
    cfg = MixtralConfig(
        **COMMON,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=26,
        num_local_experts=6,
        num_experts_per_tok=2,
        sliding_window=None,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )
    notes = (
        "Mixtral: 6 experts top-2 (softmax over all experts, top-2, renormalized), experts intermediate 26, "
        "no shared expert, sliding_window null, rope_theta 1e6, rms_norm_eps 1e-5. head_dim 10."
    )
    return cfg, dict(notes=notes)


def fx_deepseek_v2():
    yarn = {
        "type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 32,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
        "beta_fast": 32,
        "beta_slow": 1,
    }
    cfg = DeepseekV2Config(
        **COMMON,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=52,
        moe_intermediate_size=18,
        n_routed_experts=8,
        num_experts_per_tok=3,
        n_shared_experts=2,
        n_group=4,
        topk_group=2,
        topk_method="group_limited_greedy",
        routed_scaling_factor=1.7,
        first_k_dense_replace=1,
        q_lora_rank=None,
        kv_lora_rank=18,
        qk_nope_head_dim=10,
        qk_rope_head_dim=6,
        v_head_dim=14,
        rms_norm_eps=1e-6,
        rope_parameters=dict(yarn, rope_type="yarn", rope_theta=10000.0),
    )
    notes = (
        "DeepSeek-V2 MLA without q_lora_rank (q_proj), kv_lora_rank 18, qk_nope 10, qk_rope 6, v_head_dim 14, "
        "4 heads. Layer 0 dense (first_k_dense_replace=1), layers 1-2 MoE: 8 experts, softmax scores, "
        "group_limited_greedy with n_group 4 / topk_group 2 (group score = max), top-3, NO renormalization, "
        "weights * routed_scaling_factor 1.7; 2 shared experts (one MLP of intermediate 2*18). "
        "HUB-STYLE config.json: rope_theta top-level, rope_scaling {'type': 'yarn', factor 4, "
        "original_max_position_embeddings 32, mscale = mscale_all_dim = 0.707, beta_fast 32, beta_slow 1} "
        "(the old 'type' key, as DeepSeek-V2 hub configs). RoPE is interleaved-pairs (complex) on the 6 rope dims."
    )
    return cfg, dict(hub_rope=yarn, notes=notes)


def fx_deepseek_v3():
    cfg = DeepseekV3Config(
        **COMMON,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=52,
        moe_intermediate_size=18,
        n_routed_experts=8,
        num_experts_per_tok=3,
        n_shared_experts=1,
        n_group=4,
        topk_group=2,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        first_k_dense_replace=1,
        q_lora_rank=26,
        kv_lora_rank=22,
        qk_nope_head_dim=12,
        qk_rope_head_dim=10,
        v_head_dim=14,
        rms_norm_eps=1e-6,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 1000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 32,
            "mscale": 0.9,
            "mscale_all_dim": 0.7,
            "beta_fast": 32,
            "beta_slow": 1,
        },
    )
    notes = (
        "DeepSeek-V3 MLA with q_lora_rank 26, kv_lora_rank 22, qk_nope 12, qk_rope 10, v_head_dim 14, 4 heads, "
        "rope_interleave true (default). Layer 0 dense, layers 1-2 MoE: 8 experts, sigmoid scores, random "
        "e_score_correction_bias (std 0.5, saved as model.layers.N.mlp.gate.e_score_correction_bias, f32) used "
        "for selection only; noaux_tc group top-k n_group 4 / topk_group 2 (group score = sum of top-2), top-3, "
        "norm_topk_prob true (eps 1e-20), routed_scaling_factor 2.5; 1 shared expert. YaRN rope_parameters: "
        "rope_theta 1000, factor 4, original_max_position_embeddings 32 (YaRN ramp over rope-pair index: 0 -> 0, 1 -> 0.5, >=2 -> 1), mscale 0.9, mscale_all_dim 0.7 (deliberately different so "
        "both the cos/sin attention_factor and the softmax-scale mscale^2 matter), beta_fast 32, beta_slow 1."
    )
    return cfg, dict(notes=notes)


def fx_deepseek_v3_greedy():
    cfg = DeepseekV3Config(
        **COMMON,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=52,
        moe_intermediate_size=18,
        n_routed_experts=6,
        num_experts_per_tok=2,
        n_shared_experts=1,
        n_group=1,
        topk_group=1,
        routed_scaling_factor=1.5,
        norm_topk_prob=False,
        first_k_dense_replace=0,
        q_lora_rank=None,
        kv_lora_rank=22,
        qk_nope_head_dim=12,
        qk_rope_head_dim=10,
        v_head_dim=14,
        rope_interleave=False,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    notes = (
        "DeepSeek-V3-style, simplest routing: n_group 1 / topk_group 1 (no group limiting), sigmoid + random "
        "e_score_correction_bias for selection, top-2 of 6, norm_topk_prob FALSE, routed_scaling_factor 1.5, "
        "1 shared expert. Both layers MoE (first_k_dense_replace 0). q_lora_rank null (q_proj). "
        "rope_interleave FALSE => NEOX half-split rotate_half on the 10 rope dims; default rope (no YaRN)."
    )
    return cfg, dict(notes=notes)


def fx_glm4_moe():
    cfg = Glm4MoeConfig(
        **COMMON,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=12,
        intermediate_size=52,
        moe_intermediate_size=18,
        n_routed_experts=8,
        num_experts_per_tok=3,
        n_shared_experts=1,
        n_group=2,
        topk_group=1,
        routed_scaling_factor=1.8,
        norm_topk_prob=True,
        first_k_dense_replace=1,
        attention_bias=True,
        use_qk_norm=True,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    )
    notes = (
        "GLM-4.5-style MoE: head_dim 12 explicit (hidden/heads would be 10), 4 q / 2 kv heads, attention_bias true "
        "(q/k/v bias, o_proj NO bias), use_qk_norm true (per-head RMSNorm on q and k before RoPE, eps 1e-5), "
        "partial_rotary_factor 0.5 => RoPE on the first 6 dims of each head (NEOX half-split inside those 6), "
        "dims 6..11 pass through. Layer 0 dense; layers 1-2 MoE: 8 experts, sigmoid + random "
        "e_score_correction_bias, n_group 2 / topk_group 1, top-3, norm_topk_prob true, routed_scaling_factor 1.8, "
        "1 shared expert. partial_rotary_factor lives inside rope_parameters in this config.json."
    )
    return cfg, dict(notes=notes)


def fx_llama():
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 40,
    }
    cfg = LlamaConfig(
        **COMMON,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=52,
        rms_norm_eps=1e-5,
        rope_parameters=dict(scaling, rope_theta=10000.0),
    )
    notes = (
        "Llama dense, 4 q / 2 kv heads, head_dim 10, no biases. HUB-STYLE config.json: rope_theta 10000 top-level + "
        "rope_scaling {rope_type llama3, factor 8, low_freq_factor 1, high_freq_factor 4, "
        "original_max_position_embeddings 40}; with head_dim 10 the 5 wavelengths (6.3, 39.7, 251, 1579, 9952) hit "
        "all three llama3 regimes (kept / smoothed / divided by factor)."
    )
    return cfg, dict(hub_rope=scaling, notes=notes)


def fx_qwen2():
    cfg = Qwen2Config(
        **{**COMMON, "tie_word_embeddings": True},
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=52,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    notes = (
        "Qwen2 dense with q/k/v bias (o_proj no bias), tie_word_embeddings TRUE (no lm_head.weight in the "
        "checkpoint: logits = h @ embed_tokens.weight^T). HUB-STYLE config.json: top-level rope_theta."
    )
    return cfg, dict(hub_rope=None, notes=notes)


FIXTURES = {
    "qwen3_moe": fx_qwen3_moe,
    "qwen3_moe_bf16": fx_qwen3_moe_bf16,
    "qwen3_moe_stacked": fx_qwen3_moe_stacked,
    "qwen2_moe": fx_qwen2_moe,
    "mixtral": fx_mixtral,
    "deepseek_v2": fx_deepseek_v2,
    "deepseek_v3": fx_deepseek_v3,
    "deepseek_v3_greedy": fx_deepseek_v3_greedy,
    "glm4_moe": fx_glm4_moe,
    "llama": fx_llama,
    "qwen2": fx_qwen2,
}


# --------------------------------------------------------------------------------------------
# Independent re-implementation: plain torch on the raw config.json + safetensors, no transformers
# modules. Every fixture's logits must match it (< 1e-4), which pins down the exact math the Rust
# engine must reproduce (rope layouts, routing, MLA, YaRN) and doubles as a readable spec.
# --------------------------------------------------------------------------------------------


def ind_load_weights(d):
    w = {}
    for f in sorted(glob.glob(str(d / "*.safetensors"))):
        w.update({k: v.float() for k, v in load_file(f).items()})
    return w


def rope_params(cfg):
    if "rope_parameters" in cfg:
        rp = dict(cfg["rope_parameters"])
    else:
        rp = dict(cfg.get("rope_scaling") or {})
        rp["rope_theta"] = cfg.get("rope_theta", 10000.0)
        if "partial_rotary_factor" in cfg:
            rp["partial_rotary_factor"] = cfg["partial_rotary_factor"]
    rp["rope_type"] = rp.get("rope_type", rp.get("type", "default"))
    return rp


def inv_freq_and_attn(rp, dim):
    base = rp["rope_theta"]
    pos = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    inv = 1.0 / pos
    t = rp["rope_type"]
    if t == "default":
        return inv, 1.0
    if t == "llama3":
        f, lo, hi, old = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"], rp["original_max_position_embeddings"]
        out = []
        for x in inv.tolist():
            wl = 2 * math.pi / x
            if wl < old / hi:
                out.append(x)
            elif wl > old / lo:
                out.append(x / f)
            else:
                s = (old / wl - lo) / (hi - lo)
                out.append((1 - s) * x / f + s * x)
        return torch.tensor(out, dtype=torch.float32), 1.0
    if t == "yarn":
        f = rp["factor"]
        orig = rp["original_max_position_embeddings"]
        ms, msa = rp.get("mscale"), rp.get("mscale_all_dim")
        gm = lambda s, m=1: 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0
        attn = gm(f, ms) / gm(f, msa) if (ms and msa) else gm(f)
        bf, bs = rp.get("beta_fast") or 32, rp.get("beta_slow") or 1
        cd = lambda r: dim * math.log(orig / (r * 2 * math.pi)) / (2 * math.log(base))
        low, high = max(math.floor(cd(bf)), 0), min(math.ceil(cd(bs)), dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        extrap = 1 - ramp
        inv = (1.0 / (f * pos)) * (1 - extrap) + (1.0 / pos) * extrap
        return inv, attn
    raise ValueError(t)


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope_neox(x, cos, sin):  # x [..., T, d], cos/sin [T, d/2]
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def rope_interleaved(x, cos, sin):  # pairs (2i, 2i+1), output keeps interleaved order
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x2 * cos + x1 * sin
    return out


def attend(q, k, v, scale):  # q [H,T,d] k [H,T,d] v [H,T,dv]
    s = q @ k.transpose(-1, -2) * scale
    T = q.shape[1]
    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    return s.softmax(-1) @ v


def lin(x, w, p, name):
    y = x @ w[p + name + ".weight"].T
    if p + name + ".bias" in w:
        y = y + w[p + name + ".bias"]
    return y


def mlp(x, w, p, names=("gate_proj", "up_proj", "down_proj")):
    g, u, d = names
    return lin(torch.nn.functional.silu(lin(x, w, p, g)) * lin(x, w, p, u), w, p, d)


def expert(x, w, p, e):
    if p + "experts.gate_up_proj" in w:
        gu = w[p + "experts.gate_up_proj"][e]
        I = gu.shape[0] // 2
        return (torch.nn.functional.silu(x @ gu[:I].T) * (x @ gu[I:].T)) @ w[p + "experts.down_proj"][e].T
    if p + f"experts.{e}.w1.weight" in w:
        return mlp(x, w, p + f"experts.{e}.", ("w1", "w3", "w2"))
    return mlp(x, w, p + f"experts.{e}.")


def route(x, w, p, cfg, mt):
    logits = x @ w[p + "gate.weight"].T
    k = cfg["num_experts_per_tok"]
    if mt in ("qwen3_moe", "qwen2_moe", "mixtral"):
        probs = logits.softmax(-1)
        tw, ti = probs.topk(k, -1)
        if mt == "mixtral" or cfg.get("norm_topk_prob"):
            tw = tw / tw.sum(-1, keepdim=True)
        return tw, ti
    E = logits.shape[-1]
    G, TG = cfg.get("n_group") or 1, cfg.get("topk_group") or 1
    if mt == "deepseek_v2":
        s = logits.softmax(-1)
        if cfg.get("topk_method") == "group_limited_greedy":
            gs = s.view(-1, G, E // G).max(-1).values
            gi = gs.topk(TG, -1).indices
            gmask = torch.zeros_like(gs).scatter_(1, gi, 1).repeat_interleave(E // G, -1)
            s = s.masked_fill(gmask == 0, 0.0)
        tw, ti = s.topk(k, -1)
        return tw * cfg["routed_scaling_factor"], ti
    # deepseek_v3 / glm4_moe
    s = logits.sigmoid()
    sc = s + w[p + "gate.e_score_correction_bias"]
    gs = sc.view(-1, G, E // G).topk(2, -1).values.sum(-1)
    gi = gs.topk(TG, -1).indices
    gmask = torch.zeros_like(gs).scatter_(1, gi, 1).repeat_interleave(E // G, -1)
    sc = sc.masked_fill(gmask == 0, float("-inf"))
    ti = sc.topk(k, -1).indices
    tw = s.gather(1, ti)
    if cfg.get("norm_topk_prob"):
        tw = tw / (tw.sum(-1, keepdim=True) + 1e-20)
    return tw * cfg["routed_scaling_factor"], ti


def moe(x, w, p, cfg, mt):
    tw, ti = route(x, w, p, cfg, mt)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ti.shape[1]):
            out[t] += tw[t, j] * expert(x[t : t + 1], w, p, int(ti[t, j]))[0]
    if mt == "qwen2_moe":
        out = out + torch.sigmoid(x @ w[p + "shared_expert_gate.weight"].T) * mlp(x, w, p + "shared_expert.")
    if mt in ("deepseek_v2", "deepseek_v3", "glm4_moe"):
        out = out + mlp(x, w, p + "shared_experts.")
    return out


def is_moe_layer(i, cfg, mt):
    if mt in ("llama", "qwen2"):
        return False
    if mt == "mixtral":
        return True
    if mt in ("qwen3_moe", "qwen2_moe"):
        ne = cfg.get("num_experts", cfg.get("num_local_experts"))
        return i not in (cfg.get("mlp_only_layers") or []) and ne > 0 and (i + 1) % cfg["decoder_sparse_step"] == 0
    return i >= cfg["first_k_dense_replace"]


def independent_forward(d: Path, ids: list[int]) -> torch.Tensor:
    cfg = json.loads((d / "config.json").read_text())
    mt = cfg["model_type"]
    w = ind_load_weights(d)
    eps = cfg["rms_norm_eps"]
    H, D = cfg["num_attention_heads"], cfg["hidden_size"]
    rp = rope_params(cfg)
    T = len(ids)
    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    mla = mt.startswith("deepseek")
    if mla:
        dn, dr, dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
        rot = dr
    else:
        hd = cfg.get("head_dim") or D // H
        KV = cfg["num_key_value_heads"]
        rot = int(hd * rp.get("partial_rotary_factor", 1.0))
    inv, attn_factor = inv_freq_and_attn(rp, rot)
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv[None]
    cos, sin = ang.cos() * attn_factor, ang.sin() * attn_factor
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"], eps)
        a = p + "self_attn."
        if mla:
            if cfg.get("q_lora_rank"):
                q = lin(rms(lin(h, w, a, "q_a_proj"), w[a + "q_a_layernorm.weight"], 1e-6), w, a, "q_b_proj")
            else:
                q = lin(h, w, a, "q_proj")
            q = q.view(T, H, dn + dr).transpose(0, 1)
            ckv = lin(h, w, a, "kv_a_proj_with_mqa")
            c, kpe = ckv[:, : cfg["kv_lora_rank"]], ckv[:, cfg["kv_lora_rank"] :]
            c = rms(c, w[a + "kv_a_layernorm.weight"], 1e-6)
            kv = lin(c, w, a, "kv_b_proj").view(T, H, dn + dv).transpose(0, 1)
            knope, v = kv[..., :dn], kv[..., dn:]
            interleave = mt == "deepseek_v2" or cfg.get("rope_interleave", True)
            rf = rope_interleaved if interleave else rope_neox
            qpe = rf(q[..., dn:], cos, sin)
            kpe = rf(kpe, cos, sin)
            qf = torch.cat([q[..., :dn], qpe], -1)
            kf = torch.cat([knope, kpe[None].expand(H, T, dr)], -1)
            scale = (dn + dr) ** -0.5
            if rp["rope_type"] != "default" and rp.get("mscale_all_dim"):
                m = 0.1 * rp["mscale_all_dim"] * math.log(rp["factor"]) + 1.0 if rp["factor"] > 1 else 1.0
                scale *= m * m
            o = attend(qf, kf, v, scale)
        else:
            q = lin(h, w, a, "q_proj").view(T, H, hd)
            k = lin(h, w, a, "k_proj").view(T, KV, hd)
            v = lin(h, w, a, "v_proj").view(T, KV, hd)
            if a + "q_norm.weight" in w:
                q = rms(q, w[a + "q_norm.weight"], eps)
                k = rms(k, w[a + "k_norm.weight"], eps)
            q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
            q = torch.cat([rope_neox(q[..., :rot], cos, sin), q[..., rot:]], -1)
            k = torch.cat([rope_neox(k[..., :rot], cos, sin), k[..., rot:]], -1)
            rep = H // KV
            k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
            o = attend(q, k, v, hd**-0.5)
        o = o.transpose(0, 1).reshape(T, -1)
        x = x + lin(o, w, a, "o_proj")
        h = rms(x, w[p + "post_attention_layernorm.weight"], eps)
        mp = p + ("block_sparse_moe." if mt == "mixtral" else "mlp.")
        x = x + (moe(h, w, mp, cfg, mt) if is_moe_layer(i, cfg, mt) else mlp(h, w, mp))
    x = rms(x, w["model.norm.weight"], eps)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return x @ head.T


def routing_sensitivity(model, seqs) -> dict[str, float]:
    """How much the logits move when the correction bias is zeroed / group limiting is disabled."""
    out = {}
    base = [forward_logits(model, s) for s in seqs]
    routers = [m for m in model.modules() if hasattr(m, "e_score_correction_bias")]
    if routers:
        m2 = copy.deepcopy(model)
        for r in m2.modules():
            if hasattr(r, "e_score_correction_bias"):
                r.e_score_correction_bias.zero_()
        out["max_abs_logit_change_if_bias_zeroed"] = max(
            float((forward_logits(m2, s) - b).abs().max()) for s, b in zip(seqs, base)
        )
    grouped = [m for m in model.modules() if getattr(m, "num_group", None) and m.topk_group < m.num_group]
    if grouped:
        m3 = copy.deepcopy(model)
        for r in m3.modules():
            if getattr(r, "num_group", None):
                r.topk_group = r.num_group
        out["max_abs_logit_change_if_groups_disabled"] = max(
            float((forward_logits(m3, s) - b).abs().max()) for s, b in zip(seqs, base)
        )
    return out


def build(name: str, seed: int, out_root: Path) -> dict:
    cfg, opt = FIXTURES[name]()
    dtype = opt.get("dtype", torch.float32)
    path = out_root / name
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(
        cfg, attn_implementation="eager", experts_implementation="eager", dtype=torch.float32
    )
    randomize(model, seed + 1)
    model.eval()

    if opt.get("stacked"):
        save_stacked_sharded(model, path)
    else:
        copy.deepcopy(model).to(dtype).save_pretrained(path)
        # Round only the parameters in memory: rotary inv_freq buffers stay f32, as after from_pretrained.
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(dtype).float())
    if "hub_rope" in opt:
        rewrite_hub_rope(path, opt["hub_rope"], opt.get("renames", {}))

    rng = np.random.default_rng(seed)
    seqs = [rng.integers(0, cfg.vocab_size, size=n).tolist() for n in SEQ_LENS]

    loaded = load(path, dtype)
    stats = {}
    for i, ids in enumerate(seqs):
        ref = forward_logits(loaded, ids)
        mem = forward_logits(model, ids)
        # Same weights: the round trip through disk must not change the math. Not required bit-exact:
        # mmap-backed tensors can take other (alignment-dependent) BLAS paths, ~1e-7 relative.
        diff_reload = float((ref - mem).abs().max())
        assert diff_reload < RELOAD_TOL, f"{name}: reload changed logits by {diff_reload}"
        inc = incremental_logits(loaded, ids)
        diff_kv = float((inc - ref).abs().max())
        assert diff_kv < KV_TOL, f"{name}: kv-cache decode differs by {diff_kv}"
        spread = float((ref.max(dim=-1).values - ref.min(dim=-1).values).min())
        assert spread > MIN_SPREAD, f"{name}: logits near-uniform (min spread {spread})"
        assert torch.isfinite(ref).all()
        diff_ind = float((independent_forward(path, ids) - ref).abs().max())
        assert diff_ind < KV_TOL, f"{name}: independent re-implementation differs by {diff_ind}"
        np.save(path / f"logits_{i}.npy", ref.numpy().astype(np.float32))
        stats[f"seq{i}"] = {"independent_impl_max_abs_diff": diff_ind, "reload_max_abs_diff": diff_reload, "kv_cache_max_abs_diff": diff_kv, "min_logit_spread": spread}

    stats.update(routing_sensitivity(loaded, seqs))
    for key, val in stats.items():
        if key.startswith("max_abs_logit_change"):
            assert val > 1e-3, f"{name}: {key} = {val}, the feature is not exercised"

    reference = {
        "architecture": cfg.architectures[0] if cfg.architectures else type(model).__name__,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "seed": seed,
        "weights_dtype": str(dtype).removeprefix("torch."),
        "compute_dtype": "float32",
        "attn_implementation": "eager",
        "sequences": seqs,
        "notes": opt["notes"],
        "checks": stats,
    }
    reference["architecture"] = type(loaded).__name__
    (path / "reference.json").write_text(json.dumps(reference, indent=2) + "\n")
    size = sum(f.stat().st_size for f in path.iterdir())
    print(f"{name:20s} {type(loaded).__name__:28s} {size / 1024:7.1f} KiB  {json.dumps(stats)}")
    return stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "tests" / "fixtures"))
    ap.add_argument("--only", nargs="*", default=None, help="fixture names (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # deterministic reductions regardless of the machine
    out_root = Path(args.out)
    out_root.mkdir(parents=True, exist_ok=True)
    names = args.only or list(FIXTURES)
    for idx, name in enumerate(FIXTURES):
        if name in names:
            build(name, seed=1000 + 17 * idx, out_root=out_root)


if __name__ == "__main__":
    main()
