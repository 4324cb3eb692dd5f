"""Known-answer vectors for strata-kernels' ggml dequantizers.

For every block type: random block bytes (scale fields replaced by finite random values) and
what the `gguf` PyPI package's numpy dequantizer (gguf/quants.py, an independent
implementation of ggml's dequantize_row_*) makes of them. Q8_K, which gguf-py does not
dequantize, is computed here from its layout (f32 d, then 256 int8). The low-bit i-quants,
ternary and MXFP4 types come last from their own generator, so adding them left the earlier
files unchanged.

    /work/venv-gguf/bin/python crates/kernels/tests/data/ggml/make_kat.py

Writes <TYPE>.bin (blocks) and <TYPE>.f32 (little-endian f32) next to this file.
"""
import os
import numpy as np
from gguf import GGMLQuantizationType as T, GGML_QUANT_SIZES
from gguf.quants import dequantize

HERE = os.path.dirname(os.path.abspath(__file__))
# (type, number of blocks, byte offsets of f16 scale fields within a block)
CASES = [
    (T.Q4_0, 8, [0]), (T.Q4_1, 8, [0, 2]), (T.Q5_0, 8, [0]), (T.Q5_1, 8, [0, 2]),
    (T.Q8_0, 8, [0]), (T.IQ4_NL, 8, [0]),
    (T.Q2_K, 2, [80, 82]), (T.Q3_K, 2, [108]), (T.Q4_K, 2, [0, 2]), (T.Q5_K, 2, [0, 2]),
    (T.Q6_K, 2, [208]), (T.IQ4_XS, 2, [0]),
    (T.F32, 256, []), (T.F16, 256, []), (T.BF16, 256, []),
]
rng = np.random.default_rng(20261122)


def f16_bytes(n):
    return (rng.uniform(-2.0, 2.0, n).astype(np.float16)).view(np.uint8).reshape(n, 2)


for ty, nblocks, scale_offsets in CASES:
    block_elems, block_bytes = GGML_QUANT_SIZES[ty]
    if ty == T.F32:
        blocks = rng.standard_normal(nblocks).astype(np.float32).view(np.uint8).reshape(nblocks, 4)
    elif ty == T.F16:
        blocks = f16_bytes(nblocks)
    elif ty == T.BF16:
        f = rng.standard_normal(nblocks).astype(np.float32)
        blocks = (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(nblocks, 2)
    else:
        blocks = rng.integers(0, 256, (nblocks, block_bytes), dtype=np.uint8)
        for off in scale_offsets:
            blocks[:, off:off + 2] = f16_bytes(nblocks)
    out = dequantize(blocks.reshape(-1), ty).astype(np.float32).reshape(-1)
    assert out.size == nblocks * block_elems and np.all(np.isfinite(out)), ty.name
    blocks.tofile(os.path.join(HERE, f"{ty.name}.bin"))
    out.astype("<f4").tofile(os.path.join(HERE, f"{ty.name}.f32"))

# Q8_K: { f32 d; int8 qs[256]; int16 bsums[16] }.
nblocks = 2
d = rng.uniform(-0.1, 0.1, nblocks).astype("<f4")
qs = rng.integers(-128, 128, (nblocks, 256), dtype=np.int8)
bsums = qs.reshape(nblocks, 16, 16).astype(np.int16).sum(axis=2).astype("<i2")
blocks = np.concatenate(
    [d.view(np.uint8).reshape(nblocks, 4), qs.view(np.uint8), bsums.view(np.uint8).reshape(nblocks, 32)],
    axis=1)
blocks.tofile(os.path.join(HERE, "Q8_K.bin"))
(d[:, None] * qs.astype(np.float32)).astype("<f4").tofile(os.path.join(HERE, "Q8_K.f32"))

# Low-bit i-quants, ternary types, MXFP4: (type, number of blocks, f16 scale offsets).
rng2 = np.random.default_rng(20270105)
IQ_CASES = [
    (T.IQ2_XXS, 8, [0]), (T.IQ2_XS, 8, [0]), (T.IQ2_S, 8, [0]), (T.IQ3_XXS, 8, [0]),
    (T.IQ3_S, 8, [0]), (T.IQ1_S, 8, [0]), (T.IQ1_M, 8, []), (T.TQ1_0, 8, [52]),
    (T.TQ2_0, 8, [64]), (T.MXFP4, 64, []),
]
for ty, nblocks, scale_offsets in IQ_CASES:
    block_elems, block_bytes = GGML_QUANT_SIZES[ty]
    blocks = rng2.integers(0, 256, (nblocks, block_bytes), dtype=np.uint8)
    f16 = (rng2.uniform(-2.0, 2.0, nblocks).astype(np.float16)).view(np.uint16)
    for off in scale_offsets:
        blocks[:, off:off + 2] = f16.view(np.uint8).reshape(nblocks, 2)
    if ty == T.IQ1_M:
        # The f16 scale is spread over the top nibbles of the four u16 `scales` words.
        sc = blocks[:, 48:56].copy().view("<u2")
        for k in range(4):
            sc[:, k] = (sc[:, k] & 0x0FFF) | (((f16 >> (4 * k)) & 0xF) << 12)
        blocks[:, 48:56] = sc.view(np.uint8)
    if ty == T.MXFP4:
        # E8M0 exponents that keep 12 * 2^(e - 128) finite, including the denormal e = 0, 1.
        blocks[:, 0] = rng2.integers(0, 253, nblocks)
        blocks[:4, 0] = [0, 1, 2, 252]
    out = dequantize(blocks.reshape(-1), ty).astype(np.float32).reshape(-1)
    assert out.size == nblocks * block_elems and np.all(np.isfinite(out)), ty.name
    blocks.tofile(os.path.join(HERE, f"{ty.name}.bin"))
    out.astype("<f4").tofile(os.path.join(HERE, f"{ty.name}.f32"))
print("ok")
