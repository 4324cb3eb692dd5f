"""The fused MoE operator on Strata's CPU kernels.

    w = strata.ops.MoeWeights(w2, w13=w13, format="int8")   # packed once
    out = strata.ops.fused_moe(x, w, topk_weights, topk_ids)  # [T, H]

Arrays are numpy arrays (or anything with the buffer protocol) or tensors exporting DLPack
(torch, JAX, numpy...), on the CPU, C-contiguous; they are read and written in place,
never copied. `x` and `out` are float32, or both bfloat16 (a torch tensor; converted in
Rust); `topk_weights` float32; `topk_ids` int32 or int64. Weights are float32 or bfloat16,
read one expert at a time while packing (torch float16 weights are converted to float32
here, once), or a GGUF's quantized blocks as they are (`MoeWeights.from_ggml`).
"""

from strata._strata import MoeWeights as _MoeWeights
from strata._strata import build_profile, fused_moe_into, num_threads

__all__ = ["MoeWeights", "build_profile", "fused_moe", "fused_moe_into", "num_threads"]


def _weights(a):
    """A torch weight tensor as the kernels pack it: detached, float32 or bfloat16 (float16
    and others converted once), contiguous; other arrays as they are."""
    if a is None or not type(a).__module__.startswith("torch"):
        return a
    import torch

    a = a.detach()
    if a.dtype not in (torch.float32, torch.bfloat16):
        a = a.float()
    return a.contiguous()


def MoeWeights(w2, *, w13=None, w1=None, w3=None, format="bf16"):  # noqa: N802 (a class to callers)
    """Packs one layer's routed experts: `w2 [E, H, I]` with `w13 [E, 2I, H]` (gate rows
    then up rows, vLLM's layout) or `w1`/`w3 [E, I, H]`. `format`: bf16, int8 (a scale per
    row), int4 (a scale per 32 values), or int8g64, int4g128...."""
    return _MoeWeights(
        _weights(w2), w13=_weights(w13), w1=_weights(w1), w3=_weights(w3), format=format
    )


# GGUF experts: `MoeWeights.from_ggml(ggml_type, w2, w13=... | w1=..., w3=..., hidden=H,
# intermediate=I)` takes a GGUF's `*_exps` tensors (uint8 blocks, as the `gguf` package reads
# them) and computes in their own format (see the native class).
MoeWeights.from_ggml = _MoeWeights.from_ggml


def fused_moe(hidden_states, weights, topk_weights, topk_ids, *, out=None, accumulate=False):
    """`out[t] = sum_j topk_weights[t, j] * expert[topk_ids[t, j]](hidden_states[t])` with
    each expert `down(silu(gate(x)) * up(x))`. Writes into `out` when given (added to it
    with `accumulate=True`), else into a new array of `hidden_states`' kind; returns it."""
    if out is None:
        if type(hidden_states).__module__.startswith("torch"):
            import torch

            out = torch.empty_like(hidden_states)
        else:
            import numpy as np

            out = np.empty_like(hidden_states)
    fused_moe_into(hidden_states, weights, topk_weights, topk_ids, out, accumulate=accumulate)
    return out
