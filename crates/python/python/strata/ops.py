"""The fused MoE operator on Strata's CPU kernels.

    w = strata.ops.MoeWeights(w2, w13=w13, format="int8")   # packed once
    out = strata.ops.fused_moe(x, w, topk_weights, topk_ids)  # [T, H]

`x` and `out` are float32, or both torch bfloat16 (converted in Rust, without Python-side
copies); `topk_weights` float32; all C-contiguous; `topk_ids` int32 or int64. numpy arrays
and torch CPU tensors are read and written in place (a torch tensor through
`tensor.numpy()`, which shares its memory; a bfloat16 one through an int16 view of it). Weights are float32 at
packing time (torch bfloat16 weights are converted once, here).
"""

from strata._strata import MoeWeights as _MoeWeights
from strata._strata import build_profile, fused_moe_into

__all__ = ["MoeWeights", "build_profile", "fused_moe", "fused_moe_into"]


def _as_buffer(a, name):
    """numpy arrays and other buffers as they are; a torch tensor as its numpy view (same
    memory). Raises TypeError for tensors numpy cannot view (bfloat16, not on the CPU)."""
    if type(a).__module__.startswith("torch"):
        try:
            return a.detach().numpy()
        except (TypeError, RuntimeError) as e:
            raise TypeError(
                f"{name}: a torch tensor of dtype {a.dtype} on {a.device} cannot be used in "
                f"place; pass float32 on the CPU ({e})"
            ) from None
    return a


def _weights_f32(a, name):
    """Expert weights as a float32 buffer: packing reads them once, so converting torch's
    bfloat16/float16 here costs one copy at load, not per call."""
    if a is None:
        return None
    if type(a).__module__.startswith("torch"):
        import torch

        a = a.detach()
        if a.dtype != torch.float32:
            a = a.float()
        return _as_buffer(a.contiguous(), name)
    return a


def MoeWeights(w2, *, w13=None, w1=None, w3=None, format="bf16"):  # noqa: N802 (a class to callers)
    """Packs one layer's routed experts: `w2 [E, H, I]` with `w13 [E, 2I, H]` (gate rows
    then up rows, vLLM's layout) or `w1`/`w3 [E, I, H]`. `format`: bf16, int8 (a scale per
    row), int4 (a scale per 32 values), or int8g64, int4g128...."""
    return _MoeWeights(
        _weights_f32(w2, "w2"),
        w13=_weights_f32(w13, "w13"),
        w1=_weights_f32(w1, "w1"),
        w3=_weights_f32(w3, "w3"),
        format=format,
    )


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
    dtype = "float32"
    if _is_torch_bf16(hidden_states) or _is_torch_bf16(out):
        # numpy has no bfloat16: both pass as int16 views of their memory.
        dtype = "bfloat16"
        hidden_states = _bf16_bits(hidden_states, "hidden_states")
        out_buf = _bf16_bits(out, "out")
    else:
        out_buf = out
    fused_moe_into(
        _as_buffer(hidden_states, "hidden_states"),
        weights,
        _as_buffer(topk_weights, "topk_weights"),
        _as_buffer(topk_ids, "topk_ids"),
        _as_buffer(out_buf, "out"),
        accumulate=accumulate,
        dtype=dtype,
    )
    return out


def _is_torch_bf16(a):
    return type(a).__module__.startswith("torch") and str(a.dtype) == "torch.bfloat16"


def _bf16_bits(a, name):
    """A torch bfloat16 tensor as an int16 view of the same memory."""
    if not _is_torch_bf16(a):
        raise TypeError(
            f"{name}: expected a torch bfloat16 tensor like the other activations, got "
            f"{getattr(a, 'dtype', type(a).__name__)}"
        )
    import torch

    return a.detach().view(torch.int16)
