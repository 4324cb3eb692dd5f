"""Greedy completions of vLLM (CPU) on a model, printed as one line on stdout:
`RESULT {"batch1": [[ids...]], "batch16": [[ids...] x 16], "seconds": ...}`. Run in its own
process per configuration (vLLM's plugins load once per process): the test and the
benchmark set VLLM_PLUGINS to load Strata's plugin or not."""

import argparse
import json
import sys
import time

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time",
    "How do I sort a list in Python?",
    "The best way to learn a language is",
    "import numpy as np",
    "My favourite food is",
    "Write a haiku about the sea.",
    "The meaning of life is",
    "SELECT * FROM users WHERE",
    "In 1492, Columbus",
    "Dear Sir or Madam,",
    "The quick brown fox",
    "To install the package, run",
    "Water boils at",
    "She opened the door and",
]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--dtype", default="float32")
    a = p.parse_args()
    from vllm import LLM, SamplingParams

    llm = LLM(model=a.model, dtype=a.dtype, enforce_eager=True, max_model_len=512,
              tensor_parallel_size=a.tp, seed=0)
    params = SamplingParams(temperature=0, max_tokens=a.max_tokens, ignore_eos=True)
    started = time.perf_counter()
    one = llm.generate(PROMPTS[:1], params, use_tqdm=False)
    many = llm.generate(PROMPTS, params, use_tqdm=False)
    seconds = time.perf_counter() - started
    ids = lambda outs: [list(o.outputs[0].token_ids) for o in outs]  # noqa: E731
    print("RESULT " + json.dumps({"batch1": ids(one), "batch16": ids(many), "seconds": seconds}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
