"""Decode and prompt speed of llama.cpp (through llama-cpp-python) on a GGUF, for the
side-by-side rows of docs/benchmarks.md.

    python scripts/bench_llama_cpp.py MODEL.gguf [--prompt TEXT] [--tokens 64] [--threads 2]

Greedy decoding of `--tokens` tokens after the prompt; prints prompt and decode tokens/s.
Loads with use_extra_bufts=False: llama.cpp's AMX path built with native flags dies with
SIGILL on some machines here.
"""

import argparse
import time

import llama_cpp


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prompt", default="The history of the Roman Empire began when")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    params = llama_cpp.llama_model_default_params()
    llm = llama_cpp.Llama(
        model_path=args.model,
        n_ctx=512,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        verbose=False,
        use_extra_bufts=False,
    )
    del params
    tokens = llm.tokenize(args.prompt.encode())
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(tokens)
    t1 = time.perf_counter()
    generated = 0
    for tok in llm.generate(tokens, temp=0.0, top_k=1, reset=False):
        generated += 1
        if generated >= args.tokens:
            break
    t2 = time.perf_counter()
    print(
        f"llama.cpp: {len(tokens)} prompt tokens at {len(tokens) / (t1 - t0):.1f} tok/s, "
        f"{generated} generated at {generated / (t2 - t1):.1f} tok/s"
    )


if __name__ == "__main__":
    main()
