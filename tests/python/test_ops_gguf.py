"""strata.ops on a GGUF's expert tensors as they are (`MoeWeights.from_ggml`): the blocks of
tests/fixtures-gguf/qwen3_moe_k.<type>.gguf (8 experts, hidden 256, intermediate 256), read
with the `gguf` package, against a reference on the weights `gguf.quants.dequantize` gives.

The kernels round the activations to int8 per row (block types with a fast kernel), so the
tolerance is the INT8 format's in test_ops.py; the weights themselves are exact on both
sides."""

from pathlib import Path

import numpy as np
import pytest

import strata.ops
from test_ops import TOLERANCE, reference, rel_err, routing

gguf = pytest.importorskip("gguf")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures-gguf"
E, H, I = 8, 256, 256


def experts_of(kind, layer=0):
    """Layer `layer`'s gate, up and down `*_exps` tensors of the fixture of type `kind`."""
    reader = gguf.GGUFReader(FIXTURES / f"qwen3_moe_k.{kind}.gguf")
    t = {x.name: x for x in reader.tensors}
    return [t[f"blk.{layer}.ffn_{part}_exps.weight"] for part in ("gate", "up", "down")]


@pytest.mark.parametrize("kind", ["q4_k", "q8_0", "q2_k", "iq4_xs", "q5_1"])
def test_fused_moe_on_gguf_blocks(kind):
    gate, up, down = experts_of(kind)
    assert gate.data.dtype == np.uint8 and gate.data.shape[:2] == (E, I)
    weights = strata.ops.MoeWeights.from_ggml(
        gate.tensor_type, down.data, w1=gate.data, w3=up.data, hidden=H, intermediate=I)
    assert (weights.num_experts, weights.hidden_size, weights.intermediate_size) == (E, H, I)
    assert weights.format == gate.tensor_type.name
    assert weights.nbytes == sum(t.data.nbytes for t in (gate, up, down))
    rng = np.random.default_rng(11)
    x = rng.standard_normal((13, H)).astype(np.float32)
    ids, w = routing(rng, 13, E, 2, skip=E - 1)
    got = strata.ops.fused_moe(x, weights, w, ids)
    deq = [gguf.quants.dequantize(t.data, t.tensor_type) for t in (gate, up, down)]
    want = reference(x, np.concatenate(deq[:2], axis=1), deq[2], w, ids)
    err = rel_err(got, want)
    print(f"{kind}: rel err {err:.2e} against gguf's dequantized weights")
    assert err < TOLERANCE["int8"], f"{kind}: relative error {err:.3e}"
    # gate and up stacked (a `ffn_gate_up_exps` tensor), by name: the same experts.
    w13 = np.concatenate([gate.data, up.data], axis=1)
    stacked = strata.ops.MoeWeights.from_ggml(
        gate.tensor_type.name.lower(), down.data, w13=w13, hidden=H, intermediate=I)
    np.testing.assert_array_equal(strata.ops.fused_moe(x, stacked, w, ids), got)


def test_bad_ggml_inputs_raise_clear_errors():
    gate, up, down = experts_of("q4_k")
    g, u, d = gate.data, up.data, down.data

    def make(ty="Q4_K", w2=d, hidden=H, intermediate=I, **kw):
        kw = kw or {"w1": g, "w3": u}
        return strata.ops.MoeWeights.from_ggml(ty, w2, hidden=hidden, intermediate=intermediate, **kw)

    with pytest.raises(ValueError, match="ggml_type: unknown ggml type 'Q9_K'"):
        make("Q9_K")
    with pytest.raises(ValueError, match="ggml_type: unknown ggml type 1000"):
        make(1000)
    with pytest.raises(ValueError, match="ggml_type: Q8_1 has no kernel in Strata"):
        make("Q8_1")
    with pytest.raises(ValueError, match="hidden=100 is not a multiple of Q4_K's block of 256 values"):
        make(hidden=100)
    with pytest.raises(ValueError, match=r"w2: 8 experts of \[256, 256\] Q4_K take 294912 bytes, got 292864"):
        make(w2=np.ascontiguousarray(d[:, :, :-1]))
    with pytest.raises(ValueError, match=r"w1: 8 experts of \[256, 256\] Q4_K take 294912 bytes, got 147456"):
        make(w1=np.ascontiguousarray(g[:, :128]), w3=u)
    with pytest.raises(ValueError, match=r"w2: 8 experts of \[256, 512\] Q4_K take 589824 bytes"):
        make(intermediate=512)
    with pytest.raises(ValueError, match=r"w13: expected shape \[experts=8, rows=512, bytes per row=144\]"):
        make(w13=np.concatenate([g, u], axis=1).reshape(8, 256, 288))
    with pytest.raises(TypeError, match="w2: expected dtype uint8, got float32"):
        make(w2=d.view(np.float32))
    with pytest.raises(TypeError, match="give w13"):
        make(w1=g)
