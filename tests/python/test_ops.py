"""strata.ops.fused_moe against a plain reference, per packed format; no copy of the
activations; clear errors for bad inputs.

The reference is torch's when torch is installed (the vLLM venv has it), else numpy's: the
suite's own venv installs numpy only (PyPI's torch is the CUDA build, GBs; the CPU wheel
index is not reachable from CI). The test prints which one it used."""

import ctypes
import sys

import numpy as np
import pytest

import strata
import strata.ops

try:
    import torch
except ImportError:
    torch = None

# Relative error (norm of the difference over the reference's) allowed per format. The
# reference computes in f64 with the weights rounded as the format stores them
# (`stored_weights`), so what is left is the rounding of activations (BF16: 8 bits of
# mantissa; INT8/INT4: int8 per token) and of the intermediate. Measured: about 0.4% (BF16)
# and 1-2% (INT8, INT4); a misplaced scale or row gives 10% and more. `raw_err` in the
# printout is the error against the unrounded f32 weights (INT4: about 18%).
TOLERANCE = {"bf16": 0.01, "int8": 0.04, "int4": 0.04, "int4g128": 0.04, "int8g64": 0.04}
# (qmax, group along k; None: the whole row) of the integer formats.
INT_FORMATS = {"int8": (127, None), "int8g64": (127, 64), "int4": (7, 32), "int4g128": (7, 128)}


def stored_weights(w, fmt):
    """`w [..., n, k]` rounded as Strata stores it: BF16 (round to nearest even), or
    symmetric integers with a scale `amax / qmax` per row or per group of k."""
    if fmt == "bf16":
        bits = w.astype(np.float32).view(np.uint32).astype(np.uint64)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.astype(np.uint32).view(np.float32)
    qmax, group = INT_FORMATS[fmt]
    k = w.shape[-1]
    group = group or k
    # k is padded with zeros to whole groups, as the kernels pad it.
    pad = -k % group
    wp = np.concatenate([w, np.zeros((*w.shape[:-1], pad), w.dtype)], axis=-1)
    g = wp.reshape(*w.shape[:-1], (k + pad) // group, group).astype(np.float64)
    scale = np.abs(g).max(axis=-1, keepdims=True) / qmax
    scale[scale == 0] = 1.0
    q = np.clip(np.round(g / scale), -qmax - 1, qmax)
    return (q * scale).reshape(wp.shape)[..., :k]


def reference(x, w13, w2, topk_w, topk_ids):
    """out[t] = sum_j w[t, j] * down_e(silu(gate_e(x)) * up_e(x)), e = ids[t, j]."""
    i = w2.shape[2]
    if torch is not None:
        x, w13, w2 = (torch.from_numpy(a).double() for a in (x, w13, w2))
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for j in range(topk_ids.shape[1]):
                e = int(topk_ids[t, j])
                gu = w13[e] @ x[t]
                act = torch.nn.functional.silu(gu[:i]) * gu[i:]
                out[t] += float(topk_w[t, j]) * (w2[e] @ act)
        return out.numpy()
    x, w13, w2 = (a.astype(np.float64) for a in (x, w13, w2))
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            gu = w13[e] @ x[t]
            g = gu[:i]
            act = g / (1.0 + np.exp(-g)) * gu[i:]
            out[t] += float(topk_w[t, j]) * (w2[e] @ act)
    return out


def routing(rng, tokens, experts, k, skip):
    """Top-k ids avoiding expert `skip` (so it gets zero tokens), with one expert given
    exactly one token, and normalized weights."""
    ids = np.empty((tokens, k), dtype=np.int32)
    allowed = [e for e in range(experts) if e not in (skip, 1)]
    for t in range(tokens):
        ids[t] = rng.choice(allowed, size=k, replace=False)
    if tokens:
        ids[tokens // 2, 0] = 1  # expert 1: exactly one token
    w = rng.random((tokens, k)).astype(np.float32) + 0.1
    return ids, w / w.sum(axis=1, keepdims=True)


def random_layer(rng, experts, hidden, inter):
    w13 = (rng.standard_normal((experts, 2 * inter, hidden)) / np.sqrt(hidden)).astype(np.float32)
    w2 = (rng.standard_normal((experts, hidden, inter)) / np.sqrt(inter)).astype(np.float32)
    return w13, w2


def rel_err(got, want):
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


@pytest.mark.parametrize("fmt", sorted(TOLERANCE))
@pytest.mark.parametrize(
    "tokens,experts,hidden,inter,k",
    [(1, 4, 128, 64, 2), (7, 8, 80, 40, 2), (37, 16, 128, 256, 4), (200, 8, 384, 96, 3)],
)
def test_fused_moe_matches_reference(fmt, tokens, experts, hidden, inter, k):
    rng = np.random.default_rng(tokens * 1000 + hidden)
    w13, w2 = random_layer(rng, experts, hidden, inter)
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    ids, w = routing(rng, tokens, experts, k, skip=experts - 1)
    weights = strata.ops.MoeWeights(w2, w13=w13, format=fmt)
    got = strata.ops.fused_moe(x, weights, w, ids)
    want = reference(x, stored_weights(w13, fmt), stored_weights(w2, fmt), w, ids)
    err = rel_err(got, want)
    raw_err = rel_err(got, reference(x, w13, w2, w, ids))
    print(f"{fmt} T={tokens} E={experts} H={hidden} I={inter} k={k}: rel err {err:.2e}, "
          f"raw_err {raw_err:.2e} (reference: {'torch' if torch is not None else 'numpy'})")
    assert got.shape == (tokens, hidden) and got.dtype == np.float32
    assert err < TOLERANCE[fmt], f"{fmt}: relative error {err:.3e}"


def test_separate_gate_and_up_equal_stacked():
    rng = np.random.default_rng(1)
    w13, w2 = random_layer(rng, 4, 64, 32)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    ids, w = routing(rng, 5, 4, 2, skip=3)
    a = strata.ops.fused_moe(x, strata.ops.MoeWeights(w2, w13=w13), w, ids)
    w1, w3 = np.ascontiguousarray(w13[:, :32]), np.ascontiguousarray(w13[:, 32:])
    b = strata.ops.fused_moe(x, strata.ops.MoeWeights(w2, w1=w1, w3=w3), w, ids)
    np.testing.assert_array_equal(a, b)


def test_zero_tokens_and_int64_ids_and_accumulate():
    rng = np.random.default_rng(2)
    w13, w2 = random_layer(rng, 4, 64, 32)
    weights = strata.ops.MoeWeights(w2, w13=w13, format="int8")
    empty = strata.ops.fused_moe(
        np.zeros((0, 64), np.float32), weights, np.zeros((0, 2), np.float32),
        np.zeros((0, 2), np.int64))
    assert empty.shape == (0, 64)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    ids, w = routing(rng, 3, 4, 2, skip=3)
    once = strata.ops.fused_moe(x, weights, w, ids.astype(np.int64))
    out = once.copy()
    strata.ops.fused_moe(x, weights, w, ids, out=out, accumulate=True)
    np.testing.assert_allclose(out, 2 * once, rtol=1e-6)


def test_weights_properties():
    rng = np.random.default_rng(3)
    w13, w2 = random_layer(rng, 4, 64, 32)
    w = strata.ops.MoeWeights(w2, w13=w13, format="int4")
    assert (w.num_experts, w.hidden_size, w.intermediate_size, w.format) == (4, 64, 32, "int4g32")
    assert w.nbytes > 0 and "int4g32" in repr(w)


def test_no_copy_of_activations():
    rng = np.random.default_rng(4)
    w13, w2 = random_layer(rng, 4, 64, 32)
    weights = strata.ops.MoeWeights(w2, w13=w13)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    ids, w = routing(rng, 8, 4, 2, skip=3)
    out = np.zeros((8, 64), np.float32)
    ret = strata.ops.fused_moe(x, weights, w, ids, out=out)
    # The result is written into the caller's array, not into a copy.
    assert ret is out and np.abs(out).sum() > 0
    # The input is read in place: a view of a larger array (a window of rows, contiguous)
    # gives the same result as a fresh copy, and the output lands in a view of another.
    big = np.zeros((20, 64), np.float32)
    big[5:13] = x
    window = np.zeros((30, 64), np.float32)
    strata.ops.fused_moe(big[5:13], weights, w, ids, out=window[10:18])
    np.testing.assert_array_equal(window[10:18], out)
    assert window[10:18].__array_interface__["data"][0] == window.ctypes.data + 10 * 64 * 4
    assert not window[:10].any() and not window[18:].any()


@pytest.mark.skipif(torch is None, reason="torch is not installed in this venv")
def test_torch_tensors_in_place():
    """torch tensors pass as they are (DLPack): read and written in place, bfloat16 too."""
    rng = np.random.default_rng(5)
    w13, w2 = random_layer(rng, 4, 64, 32)
    weights = strata.ops.MoeWeights(torch.from_numpy(w2).bfloat16(),
                                    w13=torch.from_numpy(w13).bfloat16())
    # bfloat16 weights are packed as their float32 values are.
    as_f32 = strata.ops.MoeWeights(torch.from_numpy(w2).bfloat16().float(),
                                   w13=torch.from_numpy(w13).bfloat16().float())
    x = torch.randn(6, 64)
    ids, w = (torch.from_numpy(a) for a in routing(rng, 6, 4, 2, skip=3))
    out = torch.zeros(6, 64)
    ptr, refs = out.data_ptr(), [sys.getrefcount(a) for a in (x, w, ids, out)]
    ret = strata.ops.fused_moe(x, weights, w, ids, out=out)
    assert ret is out and out.data_ptr() == ptr and out.abs().sum() > 0
    assert torch.equal(out, strata.ops.fused_moe(x, as_f32, w, ids))
    window = torch.zeros(6, 64)  # rows 2..4 of the inputs into rows 1..3, in place
    strata.ops.fused_moe(x[2:4], weights, w[2:4], ids[2:4].long(), out=window[1:3])
    assert torch.equal(window[1:3], out[2:4]) and not window[3:].any() and not window[0].any()
    del ret
    assert [sys.getrefcount(a) for a in (x, w, ids, out)] == refs  # every export released
    # bfloat16 activations are read and written in place too (converted in Rust): the
    # result is the float32 path's on the same values, rounded to nearest even as torch does.
    xb, outb = x.bfloat16(), torch.zeros(6, 64, dtype=torch.bfloat16)
    ptr = outb.data_ptr()
    for _ in range(2):  # the same tensors again: each call exports them anew
        ret = strata.ops.fused_moe(xb, weights, w, ids, out=outb)
        want = strata.ops.fused_moe(xb.float(), weights, w, ids)
        assert ret is outb and outb.data_ptr() == ptr
        assert torch.equal(outb, want.bfloat16())
    assert strata.ops.fused_moe(xb, weights, w, ids).dtype == torch.bfloat16
    with pytest.raises(TypeError, match=r"out: expected dtype bfloat16 .*, got float32"):
        strata.ops.fused_moe(xb, weights, w, ids, out=out)
    with pytest.raises(TypeError, match="hidden_states: expected dtype float32 or bfloat16, got float16"):
        strata.ops.fused_moe(x.half(), weights, w, ids)
    with pytest.raises(ValueError, match="hidden_states: not C-contiguous"):
        strata.ops.fused_moe(torch.randn(64, 6).t(), weights, w, ids)
    with pytest.raises(ValueError, match="overlaps hidden_states"):
        strata.ops.fused_moe(x, weights, w, ids, out=x)
    with pytest.raises(ValueError, match="hidden_states: cannot be exported through DLPack .*require"):
        strata.ops.fused_moe(x.clone().requires_grad_(), weights, w, ids, out=out)


def _bf16_bits(a):
    """float32 values as bfloat16 bit patterns (int16), rounded to nearest even."""
    bits = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16).view(np.int16)


def _bf16_values(bits):
    return (bits.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def test_bfloat16_activations_equal_float32_rounded():
    rng = np.random.default_rng(8)
    w13, w2 = random_layer(rng, 8, 80, 40)
    weights = strata.ops.MoeWeights(w2, w13=w13)
    xb = _bf16_bits(rng.standard_normal((9, 80)))
    ids, w = routing(rng, 9, 8, 2, skip=7)
    out = np.zeros_like(xb)
    strata.ops.fused_moe_into(xb, weights, w, ids, out, dtype="bfloat16")
    want = strata.ops.fused_moe(_bf16_values(xb), weights, w, ids)
    np.testing.assert_array_equal(out, _bf16_bits(want))
    # Accumulating adds to the bfloat16 output (in f32, one rounding at the end).
    acc = out.copy()
    strata.ops.fused_moe_into(xb, weights, w, ids, acc, accumulate=True, dtype="bfloat16")
    np.testing.assert_allclose(_bf16_values(acc), 2 * _bf16_values(out), rtol=1e-2, atol=1e-6)
    with pytest.raises(ValueError, match="dtype: expected float32 or bfloat16, got 'float16'"):
        strata.ops.fused_moe_into(xb, weights, w, ids, out, dtype="float16")
    with pytest.raises(TypeError, match=r"hidden_states: expected dtype bfloat16 \(a tensor, or a numpy int16 view of one\)"):
        strata.ops.fused_moe_into(_bf16_values(xb), weights, w, ids, out, dtype="bfloat16")


def _layer():
    rng = np.random.default_rng(6)
    w13, w2 = random_layer(rng, 4, 64, 32)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    ids, w = routing(rng, 4, 4, 2, skip=3)
    return strata.ops.MoeWeights(w2, w13=w13), x, w, ids


def test_bad_inputs_raise_clear_errors():
    weights, x, w, ids = _layer()
    with pytest.raises(TypeError, match="hidden_states: expected dtype float32 or bfloat16, got float64"):
        strata.ops.fused_moe(x.astype(np.float64), weights, w, ids)
    with pytest.raises(ValueError, match="hidden_states: not C-contiguous"):
        strata.ops.fused_moe(np.tile(x, (1, 2))[:, ::2], weights, w, ids)
    with pytest.raises(ValueError, match="hidden_states: hidden size 32, the experts' is 64"):
        strata.ops.fused_moe(np.ascontiguousarray(x[:, :32]), weights, w, ids)
    with pytest.raises(ValueError, match=r"topk_weights: expected shape \[tokens=4, topk=2\]"):
        strata.ops.fused_moe(x, weights, np.ascontiguousarray(w[:3]), ids)
    with pytest.raises(TypeError, match="topk_ids: expected dtype int32 or int64, got float32"):
        strata.ops.fused_moe(x, weights, w, ids.astype(np.float32))
    bad = ids.copy()
    bad[2, 1] = 9
    with pytest.raises(ValueError, match=r"topk_ids: id 9 at token 2, slot 1 is not an expert \(0..4\)"):
        strata.ops.fused_moe(x, weights, w, bad)
    bad[2, 1] = -1
    with pytest.raises(ValueError, match="id -1"):
        strata.ops.fused_moe(x, weights, w, bad)
    ro = np.zeros_like(x)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out: the array is read-only"):
        strata.ops.fused_moe(x, weights, w, ids, out=ro)
    with pytest.raises(ValueError, match="out: overlaps hidden_states"):
        strata.ops.fused_moe(x, weights, w, ids, out=x)
    with pytest.raises(TypeError, match=r"hidden_states: expected a float32 or bfloat16 array \(the buffer protocol or DLPack"):
        strata.ops.fused_moe([[1.0] * 64], weights, w, ids, out=np.zeros((1, 64), np.float32))


def test_bad_weights_raise_clear_errors():
    rng = np.random.default_rng(7)
    w13, w2 = random_layer(rng, 4, 64, 32)
    with pytest.raises(ValueError, match="format: expected bf16, int8, int4"):
        strata.ops.MoeWeights(w2, w13=w13, format="fp8")
    with pytest.raises(ValueError, match=r"w13: expected shape \[experts=4, 2\*intermediate=64, hidden=64\]"):
        strata.ops.MoeWeights(w2, w13=np.ascontiguousarray(w13[:, :48]))
    with pytest.raises(TypeError, match="give w13"):
        strata.ops.MoeWeights(w2)
    with pytest.raises(TypeError, match="w2: expected dtype float32 or bfloat16, got float16"):
        strata.ops.MoeWeights(w2.astype(np.float16), w13=w13)
    with pytest.raises(ValueError, match=r"w2: expected shape \[experts, hidden, intermediate\]"):
        strata.ops.MoeWeights(w2[0], w13=w13)


class DlpackOnly:
    """`a` through DLPack only (no buffer protocol): numpy's own producer, the versioned
    form (DLPack 1.0), or with `legacy` the unversioned one (`max_version` refused as a
    producer from before 1.0 refuses it)."""

    def __init__(self, a, legacy=False):
        self.a, self.legacy = a, legacy

    def __dlpack__(self, **kwargs):
        if self.legacy and kwargs:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        return self.a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _Versioned(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Versioned))
_Versioned._fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                       ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER),
                       ("flags", ctypes.c_uint64), ("dl_tensor", _Tensor)]
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
BF16 = (4, 16)
READ_ONLY = 1


class Producer:
    """A DLPack 1.0 producer over numpy array `a`'s memory, written with ctypes, for what
    numpy cannot export: bfloat16 (`dtype=BF16` over int16 bits), other devices, flags,
    versions. Counts the calls of its deleter (the consumer must make exactly one per
    export)."""

    def __init__(self, a, dtype=None, device=1, flags=0, major=1):
        self.a, self.device, self.flags, self.major = a, device, flags, major
        kind = {"f": 2, "i": 0, "u": 1}[a.dtype.kind]
        self.dtype = dtype or (kind, a.dtype.itemsize * 8)
        self.exported = self.deleted = 0
        self._keep = []

    def __dlpack_device__(self):
        return (1, 0)  # claims the CPU; the tensor itself says `device`

    def __dlpack__(self, max_version=None, **_):
        assert max_version is not None and max_version[0] >= 1
        shape = (ctypes.c_int64 * self.a.ndim)(*self.a.shape)
        m = _Versioned(major=self.major, minor=0, flags=self.flags, deleter=self._deleter)
        m.dl_tensor = _Tensor(data=self.a.ctypes.data, device=_Device(self.device, 0),
                              ndim=self.a.ndim, dtype=_DataType(*self.dtype, 1), shape=shape)
        self._keep += [m, shape]
        self.exported += 1
        return _capsule_new(ctypes.addressof(m), b"dltensor_versioned", None)

    @property
    def _deleter(self):
        def deleter(_):
            self.deleted += 1

        self._keep.append(_DELETER(deleter))
        return self._keep[-1]


@pytest.mark.parametrize("legacy", [False, True])
def test_dlpack_numpy_in_place(legacy):
    weights, x, w, ids = _layer()
    want = strata.ops.fused_moe(x, weights, w, ids)
    out = np.zeros_like(x)
    refs = [sys.getrefcount(a) for a in (x, w, ids, out)]
    for _ in range(2):  # each call exports anew: the first one's capsules were consumed
        dl = [DlpackOnly(a, legacy) for a in (x, w, ids, out)]
        ret = strata.ops.fused_moe(dl[0], weights, dl[1], dl[2], out=dl[3])
        assert ret is dl[3]
        np.testing.assert_array_equal(out, want)  # written in place, into `out`'s memory
        out[:] = 0
    del dl, ret
    # Every export was released (numpy's deleter drops the reference it took).
    assert [sys.getrefcount(a) for a in (x, w, ids, out)] == refs
    window = np.zeros((10, 64), np.float32)
    strata.ops.fused_moe(DlpackOnly(x, legacy), weights, w, ids, out=DlpackOnly(window[3:7]))
    np.testing.assert_array_equal(window[3:7], want)
    assert not window[:3].any() and not window[7:].any()


def test_dlpack_bfloat16_activations_and_deleter():
    rng = np.random.default_rng(9)
    w13, w2 = random_layer(rng, 8, 80, 40)
    weights = strata.ops.MoeWeights(w2, w13=w13)
    xb = _bf16_bits(rng.standard_normal((9, 80)))
    ids, w = routing(rng, 9, 8, 2, skip=7)
    out = np.zeros_like(xb)
    x_dl, out_dl = Producer(xb, BF16), Producer(out, BF16)
    strata.ops.fused_moe(x_dl, weights, w, ids, out=out_dl)  # bfloat16: from the tensor
    want = strata.ops.fused_moe(_bf16_values(xb), weights, w, ids)
    np.testing.assert_array_equal(out, _bf16_bits(want))
    strata.ops.fused_moe(x_dl, weights, w, ids, out=out_dl)
    assert (x_dl.exported, x_dl.deleted, out_dl.exported, out_dl.deleted) == (2, 2, 2, 2)
    with pytest.raises(TypeError, match=r"out: expected dtype bfloat16 .*, got float32"):
        strata.ops.fused_moe(x_dl, weights, w, ids, out=np.zeros((9, 80), np.float32))
    assert x_dl.deleted == x_dl.exported


def test_dlpack_bfloat16_weights_pack_as_float32():
    rng = np.random.default_rng(10)
    w13, w2 = random_layer(rng, 4, 96, 40)
    x = rng.standard_normal((6, 96)).astype(np.float32)
    ids, w = routing(rng, 6, 4, 2, skip=3)
    b13, b2 = _bf16_bits(w13), _bf16_bits(w2)
    for fmt in ("bf16", "int8", "int4"):
        from_f32 = strata.ops.MoeWeights(_bf16_values(b2), w13=_bf16_values(b13), format=fmt)
        p2, p13 = Producer(b2, BF16), Producer(b13, BF16)
        from_bf16 = strata.ops.MoeWeights(p2, w13=p13, format=fmt)
        assert p2.deleted == 1 and p13.deleted == 1 and from_bf16.nbytes == from_f32.nbytes
        np.testing.assert_array_equal(strata.ops.fused_moe(x, from_bf16, w, ids),
                                      strata.ops.fused_moe(x, from_f32, w, ids))
    g, u = (Producer(np.ascontiguousarray(b13[:, s]), BF16) for s in (slice(0, 40), slice(40, 80)))
    sep = strata.ops.MoeWeights(Producer(b2, BF16), w1=g, w3=u)
    stacked = strata.ops.MoeWeights(_bf16_values(b2), w13=_bf16_values(b13))
    np.testing.assert_array_equal(strata.ops.fused_moe(x, sep, w, ids),
                                  strata.ops.fused_moe(x, stacked, w, ids))
    with pytest.raises(TypeError, match=r"w13: expected dtype bfloat16 \(as w2\), got float32"):
        strata.ops.MoeWeights(Producer(b2, BF16), w13=w13)


def test_dlpack_bad_inputs_raise_clear_errors():
    weights, x, w, ids = _layer()
    cuda = Producer(x, device=2)
    with pytest.raises(TypeError, match="hidden_states: a tensor on cuda:0"):
        strata.ops.fused_moe(cuda, weights, w, ids)

    class OnCuda(DlpackOnly):
        def __dlpack_device__(self):
            return (2, 1)

    with pytest.raises(TypeError, match="topk_weights: a tensor on cuda:1; strata.ops computes on the CPU"):
        strata.ops.fused_moe(x, weights, OnCuda(w), ids)
    with pytest.raises(ValueError, match="hidden_states: not C-contiguous"):
        strata.ops.fused_moe(DlpackOnly(np.tile(x, (1, 2))[:, ::2]), weights, w, ids)
    with pytest.raises(TypeError, match="hidden_states: expected dtype float32 or bfloat16, got float64"):
        strata.ops.fused_moe(DlpackOnly(x.astype(np.float64)), weights, w, ids)
    with pytest.raises(TypeError, match="topk_ids: expected dtype int32 or int64, got int16"):
        strata.ops.fused_moe(x, weights, w, DlpackOnly(ids.astype(np.int16)))
    with pytest.raises(ValueError, match=r"topk_weights: expected shape \[tokens=4, topk=2\], got \[3, 2\]"):
        strata.ops.fused_moe(x, weights, DlpackOnly(np.ascontiguousarray(w[:3])), ids)
    ro = np.zeros_like(x)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out: the array is read-only"):
        strata.ops.fused_moe(x, weights, w, ids, out=DlpackOnly(ro))
    with pytest.raises(ValueError, match="out: cannot be exported through DLPack"):
        strata.ops.fused_moe(x, weights, w, ids, out=DlpackOnly(ro, legacy=True))
    flagged = Producer(np.zeros_like(x), flags=READ_ONLY)
    with pytest.raises(ValueError, match="out: the array is read-only"):
        strata.ops.fused_moe(x, weights, w, ids, out=flagged)
    future = Producer(x, major=2)
    with pytest.raises(ValueError, match="hidden_states: DLPack version 2, this module reads version 1"):
        strata.ops.fused_moe(future, weights, w, ids)
    # Refused exports are released too.
    for p in (cuda, flagged, future):
        assert p.exported == p.deleted == 1
    with pytest.raises(ValueError, match="out: overlaps hidden_states"):
        strata.ops.fused_moe(DlpackOnly(x), weights, w, ids, out=DlpackOnly(x))
