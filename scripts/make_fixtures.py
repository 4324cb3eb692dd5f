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
  * the max-min spread of the logits is > 1 at every position (logits are not near-uniform);
  * for routers with ``e_score_correction_bias`` / expert groups: zeroing the bias, or disabling group
    limiting, changes the logits (so those code paths are actually exercised).

Usage: ``.venv/bin/python scripts/make_fixtures.py [--out tests/fixtures] [--only NAME ...]``
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import save_file
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
        np.save(path / f"logits_{i}.npy", ref.numpy().astype(np.float32))
        stats[f"seq{i}"] = {"reload_max_abs_diff": diff_reload, "kv_cache_max_abs_diff": diff_kv, "min_logit_spread": spread}

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
