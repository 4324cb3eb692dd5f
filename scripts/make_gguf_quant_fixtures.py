#!/usr/bin/env python3
"""Small Qwen3-MoE GGUF fixtures in many ggml quantization types, with llama.cpp's logits
and the logits of transformers on the dequantized weights of each file.

The checkpoint is random (seeded), shaped so that every matrix row is a multiple of 256 and
every K-quant and i-quant type really applies: hidden 256, 2 layers, 8 query / 2 KV heads
of 32, 8 experts of 256 (top-2, renormalized), vocabulary 512, untied output. It is converted
to an F32 GGUF by llama.cpp's converter, then quantized by llama-quantize with `--pure` (every
matrix of the file in that one type; llama-quantize never quantizes norms or the router
`ffn_gate_inp`, which stay F32). The 2-3 bit types are quantized with an importance matrix
that llama-imatrix computes on a fixed random text; IQ2_XXS cannot quantize `token_embd`
(no importance data: it is a lookup, not a product), which is Q4_K there.

Steps, each with the Python environment that has what it needs (the tools and the converter
come from scripts/setup_llama_cpp.sh's build, `--llama-cpp-build DIR`, default
.cache/llama.cpp):

    # 1. random checkpoint, F32 GGUF, token sequences, unquantized transformers logits
    #    (torch, transformers 5.23, numpy, safetensors):
    python scripts/make_gguf_quant_fixtures.py generate
    # 2. importance matrix and every quantized file (llama-imatrix, llama-quantize):
    python scripts/make_gguf_quant_fixtures.py quantize
    # 3. transformers on each file's weights dequantized by gguf-py (torch, gguf 0.19):
    python scripts/make_gguf_quant_fixtures.py dequant
    # 4. llama.cpp's logits (the venv of setup_llama_cpp.sh: llama-cpp-python 0.3.36):
    .venv-llama/bin/python scripts/make_gguf_quant_fixtures.py logits
    # 5. the README table (numpy, gguf):
    python scripts/make_gguf_quant_fixtures.py report

Outputs in tests/fixtures-gguf/: `qwen3_moe_k.json` (config, seed, the two token sequences,
which types each file holds, and the measured agreement), `qwen3_moe_k.hf_{0,1}.npy`
(transformers, unquantized weights), and per type `qwen3_moe_k.<type>.gguf`,
`.dequant_{0,1}.npy` (transformers on the file's weights as gguf-py dequantizes them: what
an exact reader of the file computes) and `.llama_cpp_{0,1}.npy` (llama.cpp, loaded with
`use_extra_bufts=False`, `logits_all=True`). The intermediate checkpoint, F32 GGUF and
importance matrix go to .cache/gguf-quant-fixtures/ (not committed; regenerated the same).

The seed (7) and the router scale (x8, as for qwen3_moe_q32) were chosen for decisive expert
choices: `generate --search-seeds N` prints, per seed, the smallest gap between the 2nd and
3rd router logit and between the two largest output logits over both sequences (larger is
safer); of seeds 0-9, 7 has the largest router gap (0.040) with a top-1 gap of 1.4e-3.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_gguf_fixtures as base  # noqa: E402  (placeholder vocabulary)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures-gguf"
WORK = ROOT / ".cache" / "gguf-quant-fixtures"
NAME = "qwen3_moe_k"
SEED = 7
SEQ_SEED = 3  # the token sequences
ROUTER_SCALE = 8.0
SEQ_LENS = (32, 12)

CONFIG = dict(
    vocab_size=512, hidden_size=256, num_hidden_layers=2, num_attention_heads=8,
    num_key_value_heads=2, head_dim=32, intermediate_size=512, moe_intermediate_size=256,
    num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
    mlp_only_layers=[], max_position_embeddings=256, rms_norm_eps=1e-6,
    initializer_range=0.05, tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    architectures=["Qwen3MoeForCausalLM"])

# (file suffix, llama-quantize type, extra llama-quantize arguments, uses the imatrix)
QUANTS = [
    ("q8_0", "Q8_0", [], False),
    ("q6_k", "Q6_K", [], False),
    ("q5_k", "Q5_K_S", [], False),
    ("q4_k", "Q4_K_S", [], False),
    ("iq4_xs", "IQ4_XS", [], False),
    ("iq4_nl", "IQ4_NL", [], False),
    ("q5_0", "Q5_0", [], False),
    ("q5_1", "Q5_1", [], False),
    ("q4_0", "Q4_0", [], False),
    ("q4_1", "Q4_1", [], False),
    ("q3_k", "Q3_K_S", [], True),
    ("q2_k", "Q2_K", [], True),
    ("iq2_xxs", "IQ2_XXS", ["--token-embedding-type", "q4_k"], True),
]


def llama_dirs(args):
    d = Path(args.llama_cpp_build).resolve()
    return d / "src" / "vendor" / "llama.cpp", d / "build" / "bin"


def sequences():
    import numpy as np

    rng = np.random.default_rng(SEQ_SEED)
    return [rng.integers(0, CONFIG["vocab_size"], n).tolist() for n in SEQ_LENS]


def random_model(seed: int):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    config = AutoConfig.for_model("qwen3_moe", **CONFIG)
    model = AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():
        for layer in model.model.layers:
            # Decisive routing: the default init gives near-tie router scores that any
            # rounding flips, which says nothing about the reader.
            layer.mlp.gate.weight.mul_(ROUTER_SCALE)
    return model


def margins(model, seqs):
    """Smallest gap between the k-th and (k+1)-th router logit, and between the two largest
    output logits, over all positions of `seqs`."""
    import torch

    k = CONFIG["num_experts_per_tok"]
    gaps = []

    def hook(_m, _i, out):
        s = (out[0] if isinstance(out, tuple) else out).float()
        top = s.topk(k + 1, dim=-1).values
        gaps.append((top[..., k - 1] - top[..., k]).min().item())

    hooks = [layer.mlp.gate.register_forward_hook(hook) for layer in model.model.layers]
    logit_gap = float("inf")
    with torch.no_grad():
        for seq in seqs:
            out = model(torch.tensor([seq]), use_cache=False).logits[0]
            top = out.topk(2, dim=-1).values
            logit_gap = min(logit_gap, ((top[:, 0] - top[:, 1]) / out.abs().max()).min().item())
    for h in hooks:
        h.remove()
    return min(gaps), logit_gap


def run_logits(model, seqs):
    import numpy as np
    import torch

    outs = []
    with torch.no_grad():
        for seq in seqs:
            outs.append(model(torch.tensor([seq]), use_cache=False).logits[0].float().numpy()
                        .astype(np.float32))
    return outs


def generate(args) -> None:
    import numpy as np

    seqs = sequences()
    if args.search_seeds:
        for seed in range(args.search_seeds):
            r, lg = margins(random_model(seed), seqs)
            print(f"seed {seed}: router gap {r:.4f}, top-1 logit gap {lg:.4f} x max|logit|")
        return
    src, _ = llama_dirs(args)
    sys.path.insert(0, str(src))
    sys.path.insert(1, str(src / "gguf-py"))
    import convert_hf_to_gguf  # noqa: E402  (llama.cpp's converter)

    pick = convert_hf_to_gguf.get_model_class

    def get_model_class(*a, **kw):
        cls = pick(*a, **kw)
        cls.set_vocab = base.placeholder_vocab
        return cls

    convert_hf_to_gguf.get_model_class = get_model_class
    model = random_model(SEED)
    router, logit = margins(model, seqs)
    print(f"seed {SEED}: router gap {router:.4f}, top-1 logit gap {logit:.4f} x max|logit|")
    WORK.mkdir(parents=True, exist_ok=True)
    model_dir = WORK / "model"
    model.save_pretrained(model_dir)
    for i, out in enumerate(run_logits(model, seqs)):
        np.save(OUT / f"{NAME}.hf_{i}.npy", out)
    sys.argv = ["convert_hf_to_gguf.py", str(model_dir), "--outtype", "f32",
                "--outfile", str(WORK / f"{NAME}.f32.gguf")]
    convert_hf_to_gguf.main()
    manifest = {
        "generated_by": "scripts/make_gguf_quant_fixtures.py",
        "model_type": "qwen3_moe", "config": CONFIG, "seed": SEED,
        "router_scale": ROUTER_SCALE, "sequences": seqs,
        "margins": {"router_gap": router, "top1_logit_gap_rel": logit},
        "files": {},
    }
    (OUT / f"{NAME}.json").write_text(json.dumps(manifest, indent=1) + "\n")


def imatrix_text() -> str:
    """A fixed random text of short lowercase words for llama-imatrix (the placeholder
    vocabulary is byte-level, so every byte is a token)."""
    import numpy as np

    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = ["".join(rng.choice(letters, rng.integers(1, 8))) for _ in range(3000)]
    return " ".join(words)


def quantize(args) -> None:
    _, bin_dir = llama_dirs(args)
    f32 = WORK / f"{NAME}.f32.gguf"
    imatrix = WORK / "imatrix.gguf"
    if not imatrix.exists():
        text = WORK / "imatrix.txt"
        text.write_text(imatrix_text())
        subprocess.run([str(bin_dir / "llama-imatrix"), "-m", str(f32), "-f", str(text),
                        "-o", str(imatrix), "-c", "128", "-t", str(os.cpu_count()),
                        "--process-output", "--no-ppl"], check=True)
    only = set(args.only or [])
    for suffix, qtype, extra, use_imatrix in QUANTS:
        if only and suffix not in only:
            continue
        out = OUT / f"{NAME}.{suffix}.gguf"
        cmd = [str(bin_dir / "llama-quantize"), "--pure", *extra]
        if use_imatrix:
            cmd += ["--imatrix", str(imatrix)]
        cmd += [str(f32), str(out), qtype, str(os.cpu_count())]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        print(f"{out.name}: {out.stat().st_size / 1e6:.2f} MB", flush=True)


def dequantized_state(model, path: Path):
    """The model's state dict with every weight taken from the GGUF at `path`, dequantized
    by gguf-py."""
    import gguf
    import numpy as np
    import torch

    r = gguf.GGUFReader(path)
    w = {t.name: torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type),
                                           dtype=np.float32)) for t in r.tensors}
    names = {"input_layernorm.weight": "attn_norm", "post_attention_layernorm.weight": "ffn_norm",
             "self_attn.q_proj.weight": "attn_q", "self_attn.k_proj.weight": "attn_k",
             "self_attn.v_proj.weight": "attn_v", "self_attn.o_proj.weight": "attn_output",
             "self_attn.q_norm.weight": "attn_q_norm", "self_attn.k_norm.weight": "attn_k_norm",
             "mlp.gate.weight": "ffn_gate_inp", "mlp.experts.down_proj": "ffn_down_exps"}
    state = {}
    for k, v in model.state_dict().items():
        if k == "model.embed_tokens.weight":
            new = w["token_embd.weight"]
        elif k == "lm_head.weight":
            new = w["output.weight"]
        elif k == "model.norm.weight":
            new = w["output_norm.weight"]
        else:
            layer, rest = k.removeprefix("model.layers.").split(".", 1)
            if rest == "mlp.experts.gate_up_proj":
                new = torch.cat([w[f"blk.{layer}.ffn_gate_exps.weight"],
                                 w[f"blk.{layer}.ffn_up_exps.weight"]], dim=1)
            else:
                new = w[f"blk.{layer}.{names[rest]}.weight"]
        state[k] = new.reshape(v.shape)
    return state


def dequant(args) -> None:
    import numpy as np
    from transformers import AutoModelForCausalLM

    seqs = json.loads((OUT / f"{NAME}.json").read_text())["sequences"]
    model = AutoModelForCausalLM.from_pretrained(
        WORK / "model", attn_implementation="eager", experts_implementation="eager").float().eval()
    for path in sorted(OUT.glob(f"{NAME}.*.gguf")):
        stem = path.name[: -len(".gguf")]
        if args.only and stem.split(".")[1] not in args.only:
            continue
        model.load_state_dict(dequantized_state(model, path))
        for i, out in enumerate(run_logits(model, seqs)):
            np.save(OUT / f"{stem}.dequant_{i}.npy", out)
        print(f"{stem}: transformers logits on the dequantized weights", flush=True)


def logits(args) -> None:
    import numpy as np
    from llama_cpp import Llama

    seqs = json.loads((OUT / f"{NAME}.json").read_text())["sequences"]
    for path in sorted(OUT.glob(f"{NAME}.*.gguf")):
        stem = path.name[: -len(".gguf")]
        if args.only and stem.split(".")[1] not in args.only:
            continue
        # use_extra_bufts=False: llama.cpp's AMX repacking dies with SIGILL on some machines.
        llm = Llama(model_path=str(path), n_ctx=128, logits_all=True, verbose=False,
                    n_threads=os.cpu_count(), use_extra_bufts=False)
        for i, seq in enumerate(seqs):
            llm.reset()
            llm.eval(seq)
            np.save(OUT / f"{stem}.llama_cpp_{i}.npy",
                    np.array(llm.scores[: len(seq)], dtype=np.float32))
        print(f"{stem}: llama.cpp logits", flush=True)
        del llm


def compare(got, want):
    import numpy as np

    err = float(np.abs(got - want).max() / np.abs(want).max())
    top1 = float((got.argmax(-1) == want.argmax(-1)).mean())
    return err, top1


def report(args) -> None:
    import gguf
    import numpy as np

    manifest_path = OUT / f"{NAME}.json"
    manifest = json.loads(manifest_path.read_text())
    n = len(manifest["sequences"])
    hf = np.concatenate([np.load(OUT / f"{NAME}.hf_{i}.npy") for i in range(n)])
    rows = ["| file | types held (matrices; norms and router F32) | size | llama.cpp vs dequant "
            "(max err / max abs, top-1) | dequant vs unquantized (max err, top-1) |",
            "|---|---|---|---|---|"]
    files = {}
    for suffix, _, _, _ in QUANTS:
        stem = f"{NAME}.{suffix}"
        path = OUT / f"{stem}.gguf"
        if not path.exists():
            continue
        r = gguf.GGUFReader(path)
        counts = {}
        for t in r.tensors:
            if len(t.shape) > 1 and not t.name.endswith("ffn_gate_inp.weight"):
                counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
        deq = np.concatenate([np.load(OUT / f"{stem}.dequant_{i}.npy") for i in range(n)])
        lcpp = np.concatenate([np.load(OUT / f"{stem}.llama_cpp_{i}.npy") for i in range(n)])
        le, lt = compare(lcpp, deq)
        qe, qt = compare(deq, hf)
        files[suffix] = {"types": counts, "bytes": path.stat().st_size,
                         "llama_cpp_vs_dequant": {"max_rel_err": le, "top1": lt},
                         "dequant_vs_unquantized": {"max_rel_err": qe, "top1": qt}}
        held = ", ".join(f"{k} x{v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
        rows.append(f"| `{stem}.gguf` | {held} | {path.stat().st_size / 1e6:.2f} MB | "
                    f"{le:.1e}, {lt:.3f} | {qe:.1e}, {qt:.3f} |")
    manifest["files"] = files
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    print("\n".join(rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", choices=["generate", "quantize", "dequant", "logits", "report"])
    p.add_argument("--llama-cpp-build", default=os.environ.get(
        "LLAMA_CPP_DIR", str(ROOT / ".cache" / "llama.cpp")),
        help="scripts/setup_llama_cpp.sh's build directory (src/ and build/bin/ inside)")
    p.add_argument("--only", nargs="*", help="file suffixes to process (q4_k, iq2_xxs, ...)")
    p.add_argument("--search-seeds", type=int, default=0,
                   help="generate: print the margins of seeds 0..N-1 and stop")
    args = p.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    {"generate": generate, "quantize": quantize, "dequant": dequant, "logits": logits,
     "report": report}[args.step](args)


if __name__ == "__main__":
    main()
