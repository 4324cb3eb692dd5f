#!/usr/bin/env python3
"""Writes a GGUF shaped like Qwen3-30B-A3B in a Q4_K_M-like mix, with random but valid
blocks: the benchmark asset for Strata against llama.cpp (scripts/bench_gguf_vs_llama_cpp.py).

    python scripts/make_qwen3_30b_gguf.py --layers 12 --out /work/bench-assets/qwen3-30b-a3b-12l.q4_k_m.gguf
    python scripts/make_qwen3_30b_gguf.py --out /work/bench-assets/qwen3-30b-a3b.q4_k_m.gguf   # 48 layers, ~17 GB

Needs numpy and gguf (0.19; `pip install gguf numpy`), and a GGUF of the Qwen2.5 family to
copy the tokenizer from (default .cache/assets/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf,
fetched by scripts/fetch_assets.sh: the same 151,936-token vocabulary as Qwen3).

Shape (arch `qwen3moe`): hidden 2048, 32 query / 4 KV heads of 128 with q/k RMS norms, rope
base 1e6, 128 experts of 768, top-8 (renormalized, as llama.cpp's qwen3moe always does),
vocabulary 151,936, untied output. `--layers N` cuts the depth (48 by default).

Types, like llama.cpp's Q4_K_M on this model: Q4_K for every matrix except `attn_v` and
`ffn_down_exps` of the layers llama.cpp gives more bits (`use_more_bits`: the first and last
eighth of the layers and every third in between) and `output`, which are Q6_K; norms and
the router (`ffn_gate_inp`) F32.

Random blocks: random `qs` and scale bytes with a fixed `d` per tensor, chosen so a matrix
with fan-in n has weights of standard deviation ~1/sqrt(n) and mean ~0 (Q4_K: `dmin = 7.5 d`
and each sub-block's 6-bit min equal to its random 6-bit scale, so every sub-block is
`d * sc * (q - 7.5)`; Q6_K: 6-bit q - 32 times int8 scales in [-32, 32), symmetric). RMS norms of weight 1 keep
every layer's input at unit scale, so activations stay finite through 48 layers.

The file is streamed tensor by tensor (header and tensor infos first, then each tensor's
data as it is generated): memory stays at one tensor (~115 MB), whatever the depth.
Deterministic for a given --seed.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER_GGUF = ROOT / ".cache" / "assets" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"

HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 2048, 32, 4, 128
EXPERTS, EXPERT_FF, TOP_K, DENSE_FF = 128, 768, 8, 6144
VOCAB, CONTEXT, ROPE_BASE, EPS = 151936, 40960, 1e6, 1e-6


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's rule (llama-quant.cpp) for the layers that get Q6_K in Q4_K_M."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4_k_blocks(rng: np.random.Generator, n: int, fan_in: int) -> np.ndarray:
    """`n` random Q4_K super-blocks (144 bytes: f16 d, f16 dmin, 12 scale bytes, 128 qs).

    Weight = d * sc * q - dmin * m with sc uniform in 0..63 and q in 0..15. Each
    sub-block's min is its scale (m = sc) and dmin = 7.5 d, so every sub-block of 32 weights
    is d * sc * (q - 7.5): mean 0, standard deviation ~168 d. (Independent random mins would
    give every sub-block an offset 7.5 d (sc - m), rows with large sums, and hidden states
    that converge to one direction whatever the token.)"""
    b = rng.integers(0, 256, size=(n, 144), dtype=np.uint8)
    # get_scale_min_k4: bytes 0-3 hold sc 0-3 (+ high bits of sc 4-7), bytes 4-7 m 0-3
    # (+ high bits of m 4-7), bytes 8-11 the low nibbles of sc 4-7 (low) and m 4-7 (high).
    # The 12 scale bytes (block bytes 4-15), as get_scale_min_k4 reads them: bytes 0-3
    # hold sc 0-3 (and the high bits of sc 4-7), bytes 4-7 m 0-3 (and the high bits of
    # m 4-7), bytes 8-11 the low nibbles of sc 4-7 (low half) and m 4-7 (high half).
    b[:, 8:12] = b[:, 4:8]
    b[:, 12:16] = (b[:, 12:16] & 0x0F) | ((b[:, 12:16] & 0x0F) << 4)
    d = np.float16(1.0 / np.sqrt(fan_in) / 168.0)
    b[:, 0:2] = np.frombuffer(d.tobytes(), np.uint8)
    b[:, 2:4] = np.frombuffer(np.float16(7.5 * float(d)).tobytes(), np.uint8)
    return b


def q6_k_blocks(rng: np.random.Generator, n: int, fan_in: int) -> np.ndarray:
    """`n` random Q6_K super-blocks (210 bytes: 128 ql, 64 qh, 16 int8 scales, f16 d).

    Weight = d * scale * (q - 32), q uniform in 0..63, scale uniform in [-32, 32): mean 0,
    standard deviation ~342 d."""
    b = rng.integers(0, 256, size=(n, 210), dtype=np.uint8)
    b[:, 192:208] = rng.integers(-32, 32, size=(n, 16), dtype=np.int8).view(np.uint8)
    d = np.float16(1.0 / np.sqrt(fan_in) / 342.0)
    b[:, 208:210] = np.frombuffer(d.tobytes(), np.uint8)
    return b


BLOCK_BYTES = {T.Q4_K: 144, T.Q6_K: 210}
BLOCKS = {T.Q4_K: q4_k_blocks, T.Q6_K: q6_k_blocks}


def plan(layers: int):
    """(name, GGUF shape [ne0, ne1, ...], type) of every tensor, in file order."""
    out = [("token_embd.weight", [HIDDEN, VOCAB], T.Q4_K)]
    for i in range(layers):
        more = use_more_bits(i, layers)
        p = f"blk.{i}."
        out += [
            (p + "attn_norm.weight", [HIDDEN], T.F32),
            (p + "attn_q.weight", [HIDDEN, HEADS * HEAD_DIM], T.Q4_K),
            (p + "attn_k.weight", [HIDDEN, KV_HEADS * HEAD_DIM], T.Q4_K),
            (p + "attn_v.weight", [HIDDEN, KV_HEADS * HEAD_DIM], T.Q6_K if more else T.Q4_K),
            (p + "attn_output.weight", [HEADS * HEAD_DIM, HIDDEN], T.Q4_K),
            (p + "attn_q_norm.weight", [HEAD_DIM], T.F32),
            (p + "attn_k_norm.weight", [HEAD_DIM], T.F32),
            (p + "ffn_norm.weight", [HIDDEN], T.F32),
            (p + "ffn_gate_inp.weight", [HIDDEN, EXPERTS], T.F32),
            (p + "ffn_gate_exps.weight", [HIDDEN, EXPERT_FF, EXPERTS], T.Q4_K),
            (p + "ffn_up_exps.weight", [HIDDEN, EXPERT_FF, EXPERTS], T.Q4_K),
            (p + "ffn_down_exps.weight", [EXPERT_FF, HIDDEN, EXPERTS], T.Q6_K if more else T.Q4_K),
        ]
    out += [("output_norm.weight", [HIDDEN], T.F32), ("output.weight", [HIDDEN, VOCAB], T.Q6_K)]
    return out


def nbytes(shape, ty) -> int:
    n = int(np.prod(shape))
    if ty == T.F32:
        return 4 * n
    return n // 256 * BLOCK_BYTES[ty]


def data(rng: np.random.Generator, name: str, shape, ty) -> np.ndarray:
    if ty == T.F32:
        if name.endswith("ffn_gate_inp.weight"):
            # Router logits of standard deviation ~1 on a unit-RMS input.
            w = rng.standard_normal(int(np.prod(shape)), dtype=np.float32) / np.sqrt(shape[0])
            return w.astype(np.float32)
        return np.ones(int(np.prod(shape)), np.float32)  # RMS norm weights
    n = int(np.prod(shape)) // 256
    return BLOCKS[ty](rng, n, shape[0]).reshape(-1)


def copy_tokenizer(w: gguf.GGUFWriter, src: Path) -> None:
    r = gguf.GGUFReader(src)
    for key, field in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        if field.types[0] == V.ARRAY:
            w.add_key_value(key, field.contents(), V.ARRAY, sub_type=field.types[-1])
        else:
            w.add_key_value(key, field.contents(), field.types[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--tokenizer-from", type=Path, default=TOKENIZER_GGUF,
                   help="GGUF whose tokenizer.* metadata is copied (Qwen2.5/Qwen3 vocabulary)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if not args.tokenizer_from.exists():
        sys.exit(f"{args.tokenizer_from}: not found (scripts/fetch_assets.sh fetches it, "
                 "or pass --tokenizer-from)")

    arch = "qwen3moe"
    w = gguf.GGUFWriter(args.out, arch)
    w.add_name(f"Qwen3-30B-A3B-shaped random ({args.layers} layers)")
    w.add_type("model")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(args.layers)
    w.add_feed_forward_length(DENSE_FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_layer_norm_rms_eps(EPS)
    w.add_expert_count(EXPERTS)
    w.add_expert_used_count(TOP_K)
    w.add_expert_feed_forward_length(EXPERT_FF)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    copy_tokenizer(w, args.tokenizer_from)

    tensors = plan(args.layers)
    for name, shape, ty in tensors:
        size = nbytes(shape, ty)
        # add_tensor_info takes the numpy shape (outermost first), as add_tensor would.
        np_shape = list(reversed(shape))
        if ty != T.F32:
            np_shape[-1] = np_shape[-1] // 256 * BLOCK_BYTES[ty]
        w.add_tensor_info(name, np_shape, np.dtype(np.float32 if ty == T.F32 else np.uint8),
                          size, raw_dtype=None if ty == T.F32 else ty)
    total = sum(nbytes(s, t) for _, s, t in tensors)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()

    rng = np.random.default_rng(args.seed)
    start, done = time.time(), 0
    for name, shape, ty in tensors:
        arr = data(rng, name, shape, ty)
        assert arr.nbytes == nbytes(shape, ty), name
        w.write_tensor_data(arr)
        done += arr.nbytes
        if name.endswith("ffn_down_exps.weight") or name == "output.weight":
            print(f"{name}: {done / 1e9:.2f} / {total / 1e9:.2f} GB, {time.time() - start:.0f} s",
                  flush=True)
    w.close()
    print(f"wrote {args.out}: {args.layers} layers, {len(tensors)} tensors, "
          f"{args.out.stat().st_size / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
