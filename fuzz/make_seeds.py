"""Writes small valid seed inputs for the fuzz targets into seeds/ (needs numpy and gguf)."""
import json
import os
import struct

import numpy as np
import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(7)


def write_gguf(name, tensors, extra):
    path = os.path.join(HERE, "seeds", "gguf_header", name)
    w = gguf.GGUFWriter(path, "llama")
    for k, v in extra.items():
        if isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        elif isinstance(v, str):
            w.add_string(k, v)
        else:
            w.add_array(k, v)
    for tname, (arr, raw_dtype) in tensors.items():
        if raw_dtype is None:
            w.add_tensor(tname, arr)
        else:
            w.add_tensor(tname, arr, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def blocks(qtype, rows):
    n, b = gguf.GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, (rows, b), dtype=np.uint8)
    data[:, :2] = np.array([0.5], np.float16).view(np.uint8)
    return data, qtype


write_gguf("tiny.gguf", {
    "a.weight": (rng.standard_normal((2, 4)).astype(np.float32), None),
    "b.weight": (rng.standard_normal((3, 8)).astype(np.float16), None),
}, {"llama.block_count": 1, "llama.rope.freq_base": 10000.0, "general.name": "tiny",
    "tokenizer.ggml.tokens": ["a", "b", "ab"], "flag": True})
for i, q in enumerate([gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_K,
                       gguf.GGMLQuantizationType.IQ4_NL]):
    write_gguf(f"quant{i}.gguf", {"q.weight": blocks(q, 2)}, {"general.alignment": 32})


def write_st(name, tensors, meta=None):
    header, blobs, off = {}, [], 0
    for tname, arr in tensors.items():
        b = arr.tobytes()
        header[tname] = {"dtype": {"float32": "F32", "float16": "F16"}[str(arr.dtype)],
                         "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if meta:
        header["__metadata__"] = meta
    h = json.dumps(header).encode()
    with open(os.path.join(HERE, "seeds", "safetensors_header", name), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


write_st("tiny.safetensors", {"w": rng.standard_normal((2, 3)).astype(np.float32),
                              "b": np.zeros(4, np.float16)}, {"format": "pt"})
write_st("empty.safetensors", {})
print("ok")
