"""Writes small valid `.strata` seed files into seeds/strata_header (standard library only).

The layout follows crates/formats/src/strata_file.rs; packed sizes follow
strata_kernels::packed::PackedLayout (rows padded to 32, columns to 32 for bf16 and to
64 for int8/int4, one f32 scale per 16-row strip and group). Values are arbitrary: the
parser checks sizes and placement, not contents.
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "seeds", "strata_header")
LAYOUT_VERSION = 1


def packed_sizes(fmt, n, k):
    if fmt == "bf16":
        k_align, group, elem = 32, None, 2.0
    elif fmt.startswith("int8"):
        g = int(fmt[5:]) if fmt.startswith("int8g") else None
        k_align, group, elem = max(g or 64, 64), g, 1.0
    else:
        g = int(fmt[5:])
        k_align, group, elem = max(g, 64), g, 0.5
    n_pad = -(-n // 32) * 32
    k_pad = max(-(-k // k_align), 1) * k_align
    groups = k_pad // (group or k_pad)
    strips = n_pad // 16
    return strips * int(k_pad * 16 * elem), strips * groups * 16 * 4


def write(name, tensors, blobs, config):
    body = bytearray(64)

    def region(data):
        body.extend(b"\0" * (-len(body) % 64))
        at = len(body)
        body.extend(data)
        return at

    entries = []
    for tname, kind, shape, fmt in tensors:
        if kind == "packed":
            data_len, scales_len = packed_sizes(fmt, *shape)
            off = region(bytes((i * 7) % 251 for i in range(data_len)))
            s_off = region(struct.pack("<f", 0.25) * (scales_len // 4))
            entries.append({"name": tname, "kind": kind, "shape": shape, "offset": off,
                            "length": data_len,
                            "packed": {"format": fmt, "n": shape[0], "k": shape[1],
                                       "scales_offset": s_off, "scales_length": scales_len}})
        else:
            count = 1
            for d in shape:
                count *= d
            size = 4 if kind == "f32" else 2
            off = region(bytes(count * size))
            entries.append({"name": tname, "kind": kind, "shape": shape, "offset": off,
                            "length": count * size})
    blob_entries = []
    for bname, data in blobs:
        blob_entries.append({"name": bname, "offset": region(data), "length": len(data)})
    directory = json.dumps({"config": config, "metadata": {"options": {"precision": "fast",
                                                                        "experts": "int8"}},
                            "blobs": blob_entries, "tensors": entries}).encode()
    d_off = region(directory)
    body[0:32] = (b"STRATA\0\0" + struct.pack("<II", 1, LAYOUT_VERSION)
                  + struct.pack("<QQ", d_off, len(directory)))
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(bytes(body))


os.makedirs(OUT, exist_ok=True)
write("mixed.strata", [("norm", "f32", [3], None), ("emb", "bf16", [2, 2], None),
                       ("proj", "packed", [1, 1], "int4g32")],
      [("tokenizer.json", b"{}")], {"hidden_size": 4})
write("bf16.strata", [("w", "packed", [2, 3], "bf16")], [], {})
write("int8.strata", [("a", "packed", [1, 1], "int8"), ("b", "packed", [0, 5], "int8g64")],
      [], None)
write("empty.strata", [], [], {})
print("ok")
