#!/usr/bin/env python3
"""Converts the tiny Hugging Face fixtures in tests/fixtures/ to GGUF with llama.cpp's own
converter, and records llama.cpp's logits for the fixtures' two token sequences.

Two steps, each run with the Python environment that has what it needs:

    # 1. convert (needs torch, transformers, numpy, safetensors):
    python scripts/make_gguf_fixtures.py convert [--llama-cpp DIR]
    # 2. llama.cpp logits (needs llama-cpp-python==0.3.36 and numpy):
    python scripts/make_gguf_fixtures.py logits

`--llama-cpp DIR` points at an extracted `vendor/llama.cpp` of the llama-cpp-python 0.3.36
sdist (it must hold convert_hf_to_gguf.py, conversion/ and gguf-py/). Without it the sdist is
fetched with `pip download llama-cpp-python==0.3.36 --no-deps --no-binary llama-cpp-python` into
~/.cache/strata-gguf-fixtures and extracted there.

The fixtures have no tokenizer, and the converter needs one: every model class's
`set_vocab` is replaced by one that writes a placeholder gpt2-style vocabulary of
`vocab_size` tokens (byte-level symbols, one merge). The GGUF only needs some vocabulary:
the tests feed token ids, never text. Everything else (tensor names, permutations, expert
stacking, metadata) is the converter's own.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
OUT = ROOT / "tests" / "fixtures-gguf"
VERSION = "0.3.36"

# Derived fixtures: (name, source fixture, config overrides). Their transformers logits are
# recomputed here (`<name>.hf_{0,1}.npy`) because the overrides change the model.
#  - qwen3_moe_normed: llama.cpp's qwen3moe graph always renormalizes the top-k weights (it
#    ignores norm_topk_prob), and the only all-MoE Qwen3 fixture has norm_topk_prob=false
#    (the others have dense mlp_only_layers, which the converter refuses).
#  - deepseek_v3: GGUF stores one YaRN mscale (`rope.scaling.yarn_log_multiplier` =
#    0.1 * mscale_all_dim) and llama.cpp takes mscale == mscale_all_dim, as in the real
#    DeepSeek-V3 config (both 1.0); the fixture has mscale 0.9, mscale_all_dim 0.7.
VARIANTS = {
    "qwen3_moe_normed": ("qwen3_moe_bf16", {"norm_topk_prob": True}),
    "deepseek_v3": ("deepseek_v3", {"rope_parameters": {
        "beta_fast": 32, "beta_slow": 1, "factor": 4.0, "mscale": 0.7, "mscale_all_dim": 0.7,
        "original_max_position_embeddings": 32, "rope_theta": 1000.0, "rope_type": "yarn"}}),
}

# Generated fixtures: (name, model_type, config, fixture whose sequences are used). Q8_0
# needs every quantized matrix's row length to be a multiple of 32, and every fixture in
# tests/fixtures has hidden size 40, so qwen3_moe_q32 has 64 / 16 / 32 to get real Q8_0
# blocks (and `<name>.q8_0.dequant_{0,1}.npy`: transformers on its dequantized weights).
GENERATED = {
    "qwen3_moe_q32": ("qwen3_moe", dict(
        vocab_size=211, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=64, moe_intermediate_size=32,
        num_experts=6, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], max_position_embeddings=128, rms_norm_eps=1e-6,
        initializer_range=0.1, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        architectures=["Qwen3MoeForCausalLM"]), "qwen3_moe_bf16"),
    # The qwen2_moe fixture has a dense layer, which the converter refuses.
    "qwen2_moe_sparse": ("qwen2_moe", dict(
        vocab_size=211, hidden_size=40, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=52, moe_intermediate_size=18,
        shared_expert_intermediate_size=44, num_experts=6, num_experts_per_tok=2,
        norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[],
        max_position_embeddings=128, rms_norm_eps=1e-6, initializer_range=0.1,
        tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        architectures=["Qwen2MoeForCausalLM"]), "qwen2_moe"),
}

# Config keys added to the temporary copy that do not change transformers' model (its
# DeepSeek-V3 class always uses sigmoid scoring with noaux_tc), but that real DeepSeek-V3
# config.json files carry and the converter reads: without scoring_func it writes no
# expert_gating_func, and llama.cpp then falls back to softmax (its DeepSeek-V2 default).
EXTRA_KEYS = {
    "deepseek_v3": {"scoring_func": "sigmoid", "topk_method": "noaux_tc"},
}

# (fixture, outtype). Q8_0 needs every quantized row length (the input width of each matrix)
# to be a multiple of 32; the converter keeps other tensors in F32/F16.
JOBS = [
    ("llama", "f32"),
    ("qwen2", "f32"),
    ("mixtral", "f32"),
    ("qwen2_moe", "f32"),
    ("qwen2_moe_sparse", "f32"),
    ("qwen3_moe", "f32"),
    ("qwen3_moe_normed", "f32"),
    ("qwen3_moe_stacked", "f32"),
    ("deepseek_v2", "f32"),
    ("deepseek_v3", "f32"),
    ("glm4_moe", "f32"),
    ("mixtral", "q8_0"),
    ("qwen3_moe_normed", "q8_0"),
    ("qwen3_moe_q32", "q8_0"),
    ("deepseek_v3", "q8_0"),
]


def out_name(fixture: str, outtype: str) -> str:
    return f"{fixture}.gguf" if outtype == "f32" else f"{fixture}.{outtype}.gguf"


def fetch_llama_cpp() -> Path:
    cache = Path.home() / ".cache" / "strata-gguf-fixtures"
    src = cache / f"llama-cpp-python-{VERSION}" / "vendor" / "llama.cpp"
    if src.is_dir():
        return src
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", f"llama-cpp-python=={VERSION}",
         "--no-deps", "--no-binary", "llama-cpp-python", "-d", str(cache)],
        check=True,
    )
    with tarfile.open(cache / f"llama_cpp_python-{VERSION}.tar.gz") as tar:
        members = [m for m in tar.getmembers() if "/vendor/llama.cpp/" in m.name and (
            m.name.endswith("convert_hf_to_gguf.py") or "/conversion/" in m.name or "/gguf-py/" in m.name)]
        tar.extractall(cache, members=members, filter="data")
    extracted = cache / f"llama_cpp_python-{VERSION}"
    extracted.rename(cache / f"llama-cpp-python-{VERSION}")
    return src


def placeholder_vocab(self) -> None:
    """Replaces the converter's set_vocab: a gpt2-style vocabulary of vocab_size tokens."""
    import gguf

    n = self.hparams["vocab_size"]
    # GPT-2's byte-to-symbol map, so that llama.cpp finds "\n" (Ċ) when it loads the vocab.
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    byte_sym, extra = {}, 0
    for b in range(256):
        if b in printable:
            byte_sym[b] = chr(b)
        else:
            byte_sym[b] = chr(256 + extra)
            extra += 1
    syms = [byte_sym[b] for b in range(256)]
    space = byte_sym[ord(" ")]
    tokens = syms[: n - 1] + [space + space]
    # Vocabularies larger than the 256 byte symbols + 1 merge get unreachable fillers.
    tokens += [f"<filler_{i}>" for i in range(len(tokens), n)]
    self.gguf_writer.add_tokenizer_model("gpt2")
    self.gguf_writer.add_tokenizer_pre("default")
    self.gguf_writer.add_token_list(tokens)
    self.gguf_writer.add_token_types([gguf.TokenType.NORMAL] * n)
    self.gguf_writer.add_token_merges([f"{space} {space}"])


def convert(args: argparse.Namespace) -> None:
    src = Path(args.llama_cpp) if args.llama_cpp else fetch_llama_cpp()
    sys.path.insert(0, str(src))
    sys.path.insert(1, str(src / "gguf-py"))
    import convert_hf_to_gguf  # noqa: E402  (llama.cpp's converter)

    # Model classes are registered lazily, so patch the class the converter picks.
    pick = convert_hf_to_gguf.get_model_class

    def get_model_class(*a, **kw):
        cls = pick(*a, **kw)
        cls.set_vocab = placeholder_vocab
        return cls

    convert_hf_to_gguf.get_model_class = get_model_class
    OUT.mkdir(parents=True, exist_ok=True)
    results = {}
    only = set(args.only or [])
    for fixture, outtype in JOBS:
        name = out_name(fixture, outtype)
        if only and fixture not in only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = Path(tmp) / fixture
            source, overrides = VARIANTS.get(fixture, (fixture, {}))
            if fixture in GENERATED:
                source = generate(model_dir, fixture)
                overrides = {}
            else:
                shutil.copytree(FIXTURES / source, model_dir)
            config = json.loads((model_dir / "config.json").read_text())
            config.update(overrides)
            config.update(EXTRA_KEYS.get(fixture, {}))
            (model_dir / "config.json").write_text(json.dumps(config))
            if overrides or fixture in GENERATED:
                hf_logits(model_dir, source, fixture)
            if not config.get("architectures"):
                # The stacked-experts fixture's config names no class; transformers maps its
                # model_type to this one.
                config["architectures"] = ["Qwen3MoeForCausalLM"]
                (model_dir / "config.json").write_text(json.dumps(config))
            sys.argv = ["convert_hf_to_gguf.py", str(model_dir), "--outtype", outtype,
                        "--outfile", str(OUT / name)]
            try:
                convert_hf_to_gguf.main()
                results[name] = "ok"
                if fixture in GENERATED and outtype != "f32":
                    dequant_logits(model_dir, source, OUT / name)
            except (Exception, SystemExit) as e:  # record what the converter refused
                results[name] = f"refused: {type(e).__name__}: {e}"
                (OUT / name).unlink(missing_ok=True)
        print(f"{name}: {results[name]}", flush=True)
    print(json.dumps(results, indent=2))


def generate(model_dir: Path, name: str) -> str:
    """Writes a random checkpoint for GENERATED[name]; returns the fixture whose token
    sequences it is run on."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, kw, seqs_from = GENERATED[name]
    torch.manual_seed(2)
    config = AutoConfig.for_model(model_type, **kw)
    model = AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():
        # Non-trivial biases (the default init leaves 0).
        for pname, p in model.named_parameters():
            if pname.endswith("bias"):
                p.normal_(0.0, 0.5)
        for layer in model.model.layers:
            # Decisive routing: with the default init the router's scores are near-ties
            # that 8-bit weights flip, which says nothing about the reader.
            layer.mlp.gate.weight.mul_(8.0)
    model.save_pretrained(model_dir)
    return seqs_from


def hf_logits(model_dir: Path, source: str, name: str) -> None:
    """transformers' logits of a derived fixture, computed as scripts/make_fixtures.py does
    (eager attention and experts, float32 compute)."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        model_dir, attn_implementation="eager", experts_implementation="eager").float().eval()
    ref = json.loads((FIXTURES / source / "reference.json").read_text())
    for i, seq in enumerate(ref["sequences"]):
        with torch.no_grad():
            out = model(torch.tensor([seq]), use_cache=False).logits[0].float().numpy()
        np.save(OUT / f"{name}.hf_{i}.npy", out.astype(np.float32))
        print(f"{name} seq {i}: transformers logits recomputed", flush=True)


def dequant_logits(model_dir: Path, source: str, path: Path) -> None:
    """transformers' logits with the weights of the quantized GGUF at `path`, dequantized by
    gguf-py (`<stem>.dequant_{0,1}.npy`): what an exact reader of that file must compute.
    Only for qwen3moe files (the generated fixture)."""
    import gguf
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        model_dir, attn_implementation="eager", experts_implementation="eager").float().eval()
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
    model.load_state_dict(state)
    ref = json.loads((FIXTURES / source / "reference.json").read_text())
    stem = path.name[: -len(".gguf")]
    for i, seq in enumerate(ref["sequences"]):
        with torch.no_grad():
            out = model(torch.tensor([seq]), use_cache=False).logits[0].float().numpy()
        np.save(OUT / f"{stem}.dequant_{i}.npy", out.astype(np.float32))
        print(f"{stem} seq {i}: transformers logits on the dequantized weights", flush=True)


def reference(stem: str, i: int):
    """The transformers logits a GGUF fixture is compared with, and its token sequence."""
    import numpy as np

    fixture = stem.split(".")[0]
    source = VARIANTS.get(fixture, (fixture, {}))[0]
    if fixture in GENERATED:
        source = GENERATED[fixture][2]
    seq = json.loads((FIXTURES / source / "reference.json").read_text())["sequences"][i]
    if fixture in VARIANTS or fixture in GENERATED:  # recomputed by hf_logits
        return seq, np.load(OUT / f"{fixture}.hf_{i}.npy")
    return seq, np.load(FIXTURES / source / f"logits_{i}.npy")


def logits(args: argparse.Namespace) -> None:
    import numpy as np
    from llama_cpp import Llama

    for path in sorted(OUT.glob("*.gguf")):
        fixture = path.name.split(".")[0]
        if args.only and fixture not in args.only:
            continue
        try:
            # use_extra_bufts=False: llama.cpp's AMX path dies with SIGILL on some machines.
            llm = Llama(model_path=str(path), n_ctx=128, logits_all=True, verbose=False,
                        n_threads=os.cpu_count(), use_extra_bufts=False)
        except Exception as e:  # noqa: BLE001
            print(f"{path.name}: llama.cpp refused to load: {e}", flush=True)
            continue
        stem = path.name[: -len(".gguf")]
        for i in range(2):
            seq, want = reference(stem, i)
            llm.reset()
            llm.eval(seq)
            out = np.array(llm.scores[: len(seq)], dtype=np.float32)
            err = np.abs(out - want).max() / np.abs(want).max()
            top1 = (out.argmax(-1) == want.argmax(-1)).mean()
            print(f"{stem} seq {i}: llama.cpp vs transformers max rel err {err:.2e}, top-1 {top1:.3f}",
                  flush=True)
            np.save(OUT / f"{stem}.llama_cpp_{i}.npy", out)
        del llm


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", choices=["convert", "logits"])
    p.add_argument("--llama-cpp", help="extracted vendor/llama.cpp of llama-cpp-python 0.3.36")
    p.add_argument("--only", nargs="*", help="fixture names to process (default: all)")
    args = p.parse_args()
    convert(args) if args.step == "convert" else logits(args)


if __name__ == "__main__":
    main()
