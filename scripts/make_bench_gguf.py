#!/usr/bin/env python3
"""Writes a GGUF shaped like a real MoE release in a Q4_K_M-like mix, with random but valid
blocks: the benchmark asset for Strata against llama.cpp (scripts/bench_gguf_vs_llama_cpp.py)
and for the device check (scripts/device_bench.sh).

    python scripts/make_bench_gguf.py --layers 12 --out /work/bench-assets/qwen3-30b-a3b-12l.q4_k_m.gguf
    python scripts/make_bench_gguf.py --out /work/bench-assets/qwen3-30b-a3b.q4_k_m.gguf   # 48 layers, ~17 GB
    python scripts/make_bench_gguf.py --shape deepseek-v2-lite --layers 12 --out ds-v2-lite-12l.gguf
    # The SSD tier's benchmark files (issue #29): routing skewed as in trained MoEs, and spread.
    python scripts/make_bench_gguf.py --routing trained --out /work/bench-assets/q3-48l-trained.gguf
    python scripts/make_bench_gguf.py --routing uniform --out /work/bench-assets/q3-48l-uniform.gguf

Needs numpy and gguf (0.19; `pip install gguf numpy`), and a GGUF of the Qwen2.5 family to
copy the tokenizer from (default .cache/assets/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf,
fetched by scripts/fetch_assets.sh: the same 151,936-token vocabulary as Qwen3). Both
shapes use that vocabulary (DeepSeek-V2-Lite's own has 102,400 tokens: its embedding and LM
head here are 1.5x larger).

Shapes (`--shape`; `--layers N` cuts the depth):
  qwen3-30b-a3b (arch `qwen3moe`, 48 layers): hidden 2048, 32 query / 4 KV heads of 128 with
    q/k RMS norms, rope base 1e6, 128 experts of 768, top-8 (renormalized, as llama.cpp's
    qwen3moe always does), untied output.
  deepseek-v2-lite (arch `deepseek2`, 27 layers): hidden 2048, MLA with 16 heads (no query
    LoRA, KV LoRA rank 512, 128 + 64 rope key dims, 128 value dims, stored as llama.cpp's
    split attn_k_b / attn_v_b), YaRN rope (factor 40 of 4096), the first layer dense (10944),
    then 64 routed experts of 1408 (top-6, softmax, not renormalized) and 2 shared ones.

Types, like llama.cpp's Q4_K_M: Q4_K for every matrix whose rows are whole 256-value
blocks, except `attn_v`, `ffn_down_exps` and `ffn_down_shexp` of the layers llama.cpp gives
more bits (`use_more_bits`: the first and last eighth of the layers and every third in
between) and `output`, which are Q6_K; rows of 128, 1408 or 10944 values (DeepSeek's
attn_k_b, ffn_down_exps and dense ffn_down), which K-quants cannot hold, are Q8_0 (llama.cpp
falls back to a 32-value type there too); norms and the router (`ffn_gate_inp`) F32.

Random blocks: random `qs` and scale bytes with a fixed `d` per tensor, chosen so a matrix
with fan-in n has weights of standard deviation ~1/sqrt(n) and mean ~0 (Q4_K: `dmin = 7.5 d`
and each sub-block's 6-bit min equal to its random 6-bit scale, so every sub-block is
`d * sc * (q - 7.5)`; Q6_K: 6-bit q - 32 times int8 scales in [-32, 32), symmetric; Q8_0:
int8 q in [-127, 127]). RMS norms of weight 1 keep every layer's input at unit scale, so
activations stay finite through 48 layers.

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

VOCAB, HIDDEN, EPS = 151936, 2048, 1e-6


class Qwen3:
    """Qwen3-30B-A3B."""
    arch, layers = "qwen3moe", 48
    heads, kv_heads, head_dim = 32, 4, 128
    experts, expert_ff, top_k, dense_ff = 128, 768, 8, 6144
    context, rope_base = 40960, 1e6


class DeepSeekV2Lite:
    """DeepSeek-V2-Lite."""
    arch, layers = "deepseek2", 27
    heads, kv_lora, nope, rope, v_dim = 16, 512, 128, 64, 128
    experts, expert_ff, top_k, shared, dense_ff, dense_layers = 64, 1408, 6, 2, 10944, 1
    context, rope_base, yarn_factor, yarn_orig, yarn_log_multiplier = 163840, 10000.0, 40.0, 4096, 0.0707


SHAPES = {"qwen3-30b-a3b": Qwen3, "deepseek-v2-lite": DeepSeekV2Lite}


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


def q8_0_blocks(rng: np.random.Generator, n: int, fan_in: int) -> np.ndarray:
    """`n` random Q8_0 blocks (34 bytes: f16 d, 32 int8): weight = d * q, q uniform in
    [-127, 127], standard deviation ~73 d."""
    b = np.empty((n, 34), np.uint8)
    b[:, 2:] = rng.integers(-127, 128, size=(n, 32), dtype=np.int8).view(np.uint8)
    d = np.float16(1.0 / np.sqrt(fan_in) / 73.0)
    b[:, 0:2] = np.frombuffer(d.tobytes(), np.uint8)
    return b


BLOCK_BYTES = {T.Q4_K: 144, T.Q6_K: 210, T.Q8_0: 34}
BLOCK_VALUES = {T.Q4_K: 256, T.Q6_K: 256, T.Q8_0: 32}
BLOCKS = {T.Q4_K: q4_k_blocks, T.Q6_K: q6_k_blocks, T.Q8_0: q8_0_blocks}


def kq(row: int, more: bool = False):
    """Q4_K (Q6_K with `more`) for rows of whole 256-value blocks, else Q8_0."""
    if row % 256:
        return T.Q8_0
    return T.Q6_K if more else T.Q4_K


def plan(shape, layers: int):
    """(name, GGUF shape [ne0, ne1, ...], type) of every tensor, in file order."""
    out = [("token_embd.weight", [HIDDEN, VOCAB], T.Q4_K)]
    for i in range(layers):
        more = use_more_bits(i, layers)
        p = f"blk.{i}."
        out.append((p + "attn_norm.weight", [HIDDEN], T.F32))
        if shape is Qwen3:
            q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
            out += [
                (p + "attn_q.weight", [HIDDEN, q], T.Q4_K),
                (p + "attn_k.weight", [HIDDEN, kv], T.Q4_K),
                (p + "attn_v.weight", [HIDDEN, kv], kq(HIDDEN, more)),
                (p + "attn_output.weight", [q, HIDDEN], T.Q4_K),
                (p + "attn_q_norm.weight", [shape.head_dim], T.F32),
                (p + "attn_k_norm.weight", [shape.head_dim], T.F32),
            ]
        else:
            s = shape
            out += [
                (p + "attn_q.weight", [HIDDEN, s.heads * (s.nope + s.rope)], T.Q4_K),
                (p + "attn_kv_a_mqa.weight", [HIDDEN, s.kv_lora + s.rope], T.Q4_K),
                (p + "attn_kv_a_norm.weight", [s.kv_lora], T.F32),
                (p + "attn_k_b.weight", [s.nope, s.kv_lora, s.heads], kq(s.nope)),
                (p + "attn_v_b.weight", [s.kv_lora, s.v_dim, s.heads], kq(s.kv_lora, more)),
                (p + "attn_output.weight", [s.heads * s.v_dim, HIDDEN], T.Q4_K),
            ]
        out.append((p + "ffn_norm.weight", [HIDDEN], T.F32))
        if shape is DeepSeekV2Lite and i < shape.dense_layers:
            ff = shape.dense_ff
            out += [
                (p + "ffn_gate.weight", [HIDDEN, ff], T.Q4_K),
                (p + "ffn_up.weight", [HIDDEN, ff], T.Q4_K),
                (p + "ffn_down.weight", [ff, HIDDEN], kq(ff, more)),
            ]
            continue
        e, ff = shape.experts, shape.expert_ff
        out += [
            (p + "ffn_gate_inp.weight", [HIDDEN, e], T.F32),
            (p + "ffn_gate_exps.weight", [HIDDEN, ff, e], T.Q4_K),
            (p + "ffn_up_exps.weight", [HIDDEN, ff, e], T.Q4_K),
            (p + "ffn_down_exps.weight", [ff, HIDDEN, e], kq(ff, more)),
        ]
        if shape is DeepSeekV2Lite:
            sf = shape.shared * ff
            out += [
                (p + "ffn_gate_shexp.weight", [HIDDEN, sf], T.Q4_K),
                (p + "ffn_up_shexp.weight", [HIDDEN, sf], T.Q4_K),
                (p + "ffn_down_shexp.weight", [sf, HIDDEN], kq(sf, more)),
            ]
    out += [("output_norm.weight", [HIDDEN], T.F32), ("output.weight", [HIDDEN, VOCAB], T.Q6_K)]
    return out


def nbytes(shape, ty) -> int:
    n = int(np.prod(shape))
    if ty == T.F32:
        return 4 * n
    return n // BLOCK_VALUES[ty] * BLOCK_BYTES[ty]


class Routing:
    """How the random model routes (`--routing`).

    converged: every weight at its fan-in scale. The hidden states of a deep random network
      converge (attention averages the same values for every token, and each layer's output
      outweighs the embedding 45 to 1), so a few experts take nearly every token: each layer's
      most used 30% of experts take ~99% of lookups.
    trained: the embedding at unit scale and attention's share of the residual stream a tenth,
      so the hidden state stays the token's own through the depth, and router rows scaled by
      exp(0.5 z), z ~ N(0, 1): the most used 30% take ~73% of lookups on independent hidden
      states, as in trained MoEs (strata-tiny-moe: 69-81%). The benchmarks measure the share.
    uniform: as trained, every router row alike: ~32% (30% is exactly uniform).
    """

    def __init__(self, name: str, skew=None, residual_scale=None):
        converged = name == "converged"
        self.embedding_fan_in = HIDDEN if converged else 1
        self.attention_scale = 1.0 if converged else 0.1
        self.skew = skew if skew is not None else {"trained": 0.5}.get(name, 0.0)
        self.residual_scale = residual_scale if residual_scale is not None else 1.0


def data(rng: np.random.Generator, name: str, shape, ty, routing: Routing) -> np.ndarray:
    if ty == T.F32:
        if name.endswith("ffn_gate_inp.weight"):
            # Router logits of standard deviation ~1 on a unit-RMS input; with a skew, expert
            # e's row is scaled by exp(skew * z_e), z_e ~ N(0, 1): experts with wider logits
            # reach the top-k more often, so a few take a large share of the tokens.
            w = rng.standard_normal(int(np.prod(shape)), dtype=np.float32) / np.sqrt(shape[0])
            if routing.skew:
                rows = w.reshape(shape[1], shape[0])
                rows *= np.exp(routing.skew * rng.standard_normal(shape[1]))[:, None].astype(np.float32)
            return w.astype(np.float32)
        return np.ones(int(np.prod(shape)), np.float32)  # RMS norm weights
    n = int(np.prod(shape)) // BLOCK_VALUES[ty]
    fan_in = shape[0]
    # Weights d / sqrt(fan_in) * scale: a fan-in scaled by 1 / scale^2.
    if name == "token_embd.weight":
        fan_in = routing.embedding_fan_in
    scale = routing.residual_scale
    if name.endswith("attn_output.weight"):
        scale *= routing.attention_scale
    if scale != 1.0 and name.endswith(("attn_output.weight", "ffn_down_exps.weight",
                                       "ffn_down_shexp.weight", "ffn_down.weight")):
        fan_in = fan_in / scale**2
    return BLOCKS[ty](rng, n, fan_in).reshape(-1)


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
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-30b-a3b")
    p.add_argument("--layers", type=int, help="depth (default: the model's)")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--tokenizer-from", type=Path, default=TOKENIZER_GGUF,
                   help="GGUF whose tokenizer.* metadata is copied (Qwen2.5/Qwen3 vocabulary)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--routing", choices=["converged", "trained", "uniform"], default="converged",
                   help="how the random model routes (see Routing): converged (a few experts "
                        "take nearly every token), trained (skewed as trained MoEs are) or "
                        "uniform")
    p.add_argument("--residual-scale", type=float,
                   help="scale of what each layer adds to the residual stream (attention output, "
                        "expert down projections); default 1")
    p.add_argument("--router-skew", type=float,
                   help="spread of the experts' router row scales (0: every expert alike); "
                        "default from --routing")
    args = p.parse_args()
    if not args.tokenizer_from.exists():
        sys.exit(f"{args.tokenizer_from}: not found (scripts/fetch_assets.sh fetches it, "
                 "or pass --tokenizer-from)")
    shape = SHAPES[args.shape]
    routing = Routing(args.routing, args.router_skew, args.residual_scale)
    args.layers = args.layers or shape.layers

    w = gguf.GGUFWriter(args.out, shape.arch)
    w.add_name(f"{shape.__doc__.strip('.')}-shaped random ({args.layers} layers, "
               f"{args.routing} routing)")
    w.add_type("model")
    w.add_context_length(shape.context)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(args.layers)
    w.add_feed_forward_length(shape.dense_ff)
    w.add_head_count(shape.heads)
    w.add_rope_freq_base(shape.rope_base)
    w.add_layer_norm_rms_eps(EPS)
    w.add_expert_count(shape.experts)
    w.add_expert_used_count(shape.top_k)
    w.add_expert_feed_forward_length(shape.expert_ff)
    key = lambda k: f"{shape.arch}.{k}"  # noqa: E731
    if shape is Qwen3:
        w.add_head_count_kv(shape.kv_heads)
        w.add_key_length(shape.head_dim)
        w.add_value_length(shape.head_dim)
    else:
        # llama.cpp's MLA as MQA over the latent: one KV head of kv_lora + rope key dims and
        # kv_lora value dims; the per-head sizes in the `_mla` keys.
        w.add_head_count_kv(1)
        w.add_key_length(shape.kv_lora + shape.rope)
        w.add_value_length(shape.kv_lora)
        w.add_uint32(key("attention.key_length_mla"), shape.nope + shape.rope)
        w.add_uint32(key("attention.value_length_mla"), shape.v_dim)
        w.add_uint32(key("attention.kv_lora_rank"), shape.kv_lora)
        w.add_uint32(key("rope.dimension_count"), shape.rope)
        w.add_string(key("rope.scaling.type"), "yarn")
        w.add_float32(key("rope.scaling.factor"), shape.yarn_factor)
        w.add_uint32(key("rope.scaling.original_context_length"), shape.yarn_orig)
        w.add_float32(key("rope.scaling.yarn_log_multiplier"), shape.yarn_log_multiplier)
        w.add_uint32(key("leading_dense_block_count"), shape.dense_layers)
        w.add_uint32(key("expert_shared_count"), shape.shared)
        w.add_float32(key("expert_weights_scale"), 1.0)
        w.add_uint32(key("expert_group_count"), 1)
        w.add_uint32(key("expert_group_used_count"), 1)
        w.add_uint32(key("expert_gating_func"), 1)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    copy_tokenizer(w, args.tokenizer_from)

    tensors = plan(shape, args.layers)
    for name, shape, ty in tensors:
        size = nbytes(shape, ty)
        # add_tensor_info takes the numpy shape (outermost first), as add_tensor would.
        np_shape = list(reversed(shape))
        if ty != T.F32:
            np_shape[-1] = np_shape[-1] // BLOCK_VALUES[ty] * BLOCK_BYTES[ty]
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
        arr = data(rng, name, shape, ty, routing)
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
