"""Writes iq_grids.bin, the lookup grids of ggml's i-quants, for strata-kernels' ggml/iq.rs.

The grids are data, not code: this script takes them from the `gguf` PyPI package (gguf-py's
gguf/quants.py builds them as numpy arrays from packed hex strings) and stores every grid
entry as its bytes, one byte per weight, in the order ggml's little-endian u64/u32 tables
hold them (byte j of entry i is weight j of that group):

    iq2xxs_grid   256 x 8  u8   values 0x08, 0x19, 0x2b
    iq2xs_grid    512 x 8  u8   same values
    iq2s_grid    1024 x 8  u8   same values
    iq3xxs_grid   256 x 4  u8   values 0x04 .. 0x3e
    iq3s_grid     512 x 4  u8   values 0x01 .. 0x0f
    iq1s_grid    2048 x 8  i8   values -1, 0, 1

33,792 bytes in all, concatenated in that order. Regenerate (the output must not change):

    python3 -m venv /work/venv-gguf && /work/venv-gguf/bin/pip install gguf numpy
    /work/venv-gguf/bin/python crates/kernels/src/ggml/make_iq_grids.py
"""
import os

import numpy as np
from gguf import quants

HERE = os.path.dirname(os.path.abspath(__file__))

# (gguf-py class, entries, weights per entry); the order is the file's.
GRIDS = [
    (quants.IQ2_XXS, 256, 8),
    (quants.IQ2_XS, 512, 8),
    (quants.IQ2_S, 1024, 8),
    (quants.IQ3_XXS, 256, 4),
    (quants.IQ3_S, 512, 4),
    (quants.IQ1_S, 2048, 8),
]

parts = []
for cls, entries, width in GRIDS:
    cls.init_grid()
    grid = np.asarray(cls.grid, dtype=np.float32).reshape(entries, width)
    as_int = grid.astype(np.int64)
    assert np.array_equal(as_int, grid), cls.__name__
    assert as_int.min() >= -128 and as_int.max() <= 255, cls.__name__
    parts.append((as_int & 0xFF).astype(np.uint8).reshape(-1))

out = np.concatenate(parts)
assert out.size == 33792, out.size
out.tofile(os.path.join(HERE, "iq_grids.bin"))
print(f"wrote {out.size} bytes")
