#!/usr/bin/env python3
"""Reference logits and token ids for the real GGUF test models, from llama.cpp.

Runs llama.cpp (through the PyPI package llama-cpp-python, which builds it from source) on
the two models scripts/fetch_assets.sh fetches, and writes compact results to
tests/reference/<model>.json:

- for each prompt: the text, llama.cpp's token ids (its tokenizer, special tokens parsed, BOS
  as the model's metadata asks), and for every position the reference's top-32 token ids with
  their logits and the full-vocabulary max |logit|;
- `tokenize`: llama.cpp's ids for a wider set of texts (multilingual, code, emoji, whitespace
  runs, special tokens), tokenizer only;
- for SmolLM2, `greedy`: llama.cpp's greedy continuation of "The capital of France is";
- `spm-tiny`: a 1000-piece SentencePiece BPE vocabulary trained here on the shared notes,
  written as a vocab-only GGUF (crates/formats/tests/data/gguf/spm-tiny.gguf), with
  llama.cpp's ids (and sentencepiece's) for a few texts in tests/reference/spm-tiny.json.

Usage (a venv with `pip install llama-cpp-python gguf numpy sentencepiece`):

    scripts/fetch_assets.sh
    /work/venv-gguf/bin/python scripts/make_gguf_reference.py [--assets DIR] [--out DIR]

llama.cpp is built with native flags; its AMX weight-repacking path dies with SIGILL on some
Sapphire Rapids hosts, so models load with `use_extra_bufts = False` (no repacked buffers).
"""
import argparse
import json
import os
import sys

import numpy as np
import llama_cpp
import llama_cpp.llama as llama_mod

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP_K = 32

MODELS = {
    "smollm2-135m-instruct-q4_1": "smollm2-135m-instruct-q4_1.gguf",
    "qwen2.5-coder-0.5b-instruct-q4_k_m": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
}

PROMPTS = [
    ("english", "The quick brown fox jumps over the lazy dog. Meanwhile, in a quiet village by "
                "the sea, the fishermen were preparing their boats for the morning tide."),
    ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n"
             "        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"),
    ("chat", "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
             "What is the capital of France? Answer in one word.<|im_end|>\n"
             "<|im_start|>assistant\n"),
    ("numbers", "In 2023 the town had 8,045 people; it grew 1.5% in 2024. 12 * 12 = 144."),
    ("facts", "Water boils at 100 degrees Celsius at sea level. The Earth orbits the Sun once "
              "every 365.25 days, and the Moon orbits the Earth in about 27 days."),
    ("capital", "The capital of France is"),
]

TOKENIZE_ONLY = [
    "Hello, world!",
    "  leading spaces and   runs of   spaces\n\n\ttabs\tand newlines\r\n",
    "Bonjour ! Wie geht's? ¿Qué tal? Привет, мир! Γειά σου κόσμε.",
    "日本語のテキストと中文文本，还有한국어 텍스트.",
    "Emoji: 🚀✨👩‍💻🇫🇷 and symbols ©®™ ≠ ≤ ∑ √",
    "fn main() {\n    let x: Vec<u32> = (0..10).map(|i| i * i).collect();\n    println!(\"{x:?}\");\n}\n",
    "I'm sure they'll say it's John's, we've seen I'd DON'T SHE'LL",
    "Numbers 1234567890 3.14159 1e-10 0x1F -42 1,000,000",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "https://example.com/path?query=1&x=y#frag user@example.org",
]


def load(path, vocab_only=False):
    # Llama() has no keyword for use_extra_bufts: patch the default model params it starts from.
    orig = llama_cpp.llama_model_default_params

    def params():
        p = orig()
        p.use_extra_bufts = False
        return p

    llama_mod.llama_cpp.llama_model_default_params = params
    try:
        return llama_cpp.Llama(model_path=path, n_ctx=512, n_batch=512, n_threads=2,
                               n_threads_batch=2, logits_all=True, vocab_only=vocab_only,
                               verbose=False)
    finally:
        llama_mod.llama_cpp.llama_model_default_params = orig


def tokenize(llm, text):
    # add_bos=True means "add special tokens as the model's metadata says" in llama.cpp.
    return llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)


def logits_for(llm, tokens):
    llm.reset()
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)], dtype=np.float32)


def summarize(logits):
    out = []
    for row in logits:
        top = np.argsort(-row, kind="stable")[:TOP_K]
        out.append({
            "top_ids": [int(i) for i in top],
            "top_logits": [round(float(row[i]), 4) for i in top],
            "max_abs_logit": round(float(np.max(np.abs(row))), 4),
        })
    return out


def greedy(llm, prompt, n_new):
    tokens = tokenize(llm, prompt)
    llm.reset()
    llm.eval(tokens)
    new = []
    for _ in range(n_new):
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        new.append(nxt)
        if nxt == llm.token_eos():
            break
        llm.eval([nxt])
    text = llm.detokenize(new).decode("utf-8", errors="replace")
    return {"prompt": prompt, "prompt_tokens": tokens, "new_tokens": new, "text": text}


SPM_TEXTS = [
    "Hello world",
    "The engine loads the model and runs every expert where it runs best.",
    "  two leading spaces, trailing space ",
    "line one\nline two\n\ttabbed",
    "Unicode beyond the training text: Ωmega, naïve, 日本, 🚀",
    "digits 1234567 and symbols #$%&*()",
    "<s>special tokens</s> inside text",
    "",
]


def make_spm_tiny(out_gguf, out_json):
    """A tiny SentencePiece BPE vocabulary (byte fallback) trained on the shared notes, written
    as a vocab-only `llama` GGUF, with llama.cpp's (and sentencepiece's) ids for SPM_TEXTS."""
    import glob
    import io
    import gguf
    import sentencepiece as spm

    text = []
    for path in sorted(glob.glob("/work/shared/**/*.md", recursive=True)):
        with open(path, encoding="utf-8") as f:
            text.extend(line.strip() for line in f if line.strip())
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text), model_writer=model, vocab_size=1000, model_type="bpe",
        byte_fallback=True, character_coverage=0.9995, split_digits=True,
        bos_id=1, eos_id=2, unk_id=0, pad_id=-1, num_threads=2, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else
                     5 if sp.is_unused(i) else 6 if sp.is_byte(i) else 1)
    w = gguf.GGUFWriter(out_gguf, "llama")
    for k, v in [("context_length", 64), ("embedding_length", 8), ("block_count", 1),
                 ("feed_forward_length", 16), ("attention.head_count", 1)]:
        w.add_uint32(f"llama.{k}", v)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    llm = load(out_gguf, vocab_only=True)
    doc = {
        "model": "spm-tiny",
        "reference": f"llama.cpp via llama-cpp-python {llama_cpp.__version__} (vocab only); "
                     "sentencepiece ids for comparison",
        "tokenize": [{"text": t, "tokens": tokenize(llm, t),
                      "sentencepiece": [1] + sp.encode(t)} for t in SPM_TEXTS],
    }
    with open(out_json, "w") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {out_gguf} ({os.path.getsize(out_gguf)} bytes) and {out_json}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--assets", default=os.environ.get("STRATA_ASSETS",
                                                       os.path.join(ROOT, ".cache", "assets")))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "reference"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    make_spm_tiny(os.path.join(ROOT, "crates", "formats", "tests", "data", "gguf", "spm-tiny.gguf"),
                  os.path.join(args.out, "spm-tiny.json"))
    for name, file in MODELS.items():
        path = os.path.join(args.assets, file)
        if not os.path.exists(path):
            sys.exit(f"make_gguf_reference: {path} missing; run scripts/fetch_assets.sh")
        llm = load(path)
        doc = {
            "model": name,
            "file": file,
            "file_bytes": os.path.getsize(path),
            "reference": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}, "
                         "use_extra_bufts=false, n_threads=2, f32 logits",
            "n_vocab": llm.n_vocab(),
            "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(llama_cpp.llama_model_get_vocab(llm.model))),
            "top_k": TOP_K,
            "prompts": [],
        }
        for pname, text in PROMPTS:
            tokens = tokenize(llm, text)
            logits = logits_for(llm, tokens)
            doc["prompts"].append({"name": pname, "text": text, "tokens": tokens,
                                   "positions": summarize(logits)})
            print(f"{name}: {pname}: {len(tokens)} tokens", file=sys.stderr)
        doc["tokenize"] = [{"text": t, "tokens": tokenize(llm, t)} for t in TOKENIZE_ONLY]
        if name.startswith("smollm2"):
            doc["greedy"] = greedy(llm, "The capital of France is", 16)
            print(f"{name}: greedy: {doc['greedy']['text']!r}", file=sys.stderr)
        out = os.path.join(args.out, f"{name}.json")
        with open(out, "w") as f:
            json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
            f.write("\n")
        print(f"wrote {out} ({os.path.getsize(out)} bytes)", file=sys.stderr)
        del llm


if __name__ == "__main__":
    main()
