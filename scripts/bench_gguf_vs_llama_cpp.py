#!/usr/bin/env python3
"""Strata against llama.cpp on the same GGUF, side by side: time to first token, peak memory
(private and file-backed), prefill and decode speed.

    # once: llama.cpp and its venv (see the script), the Strata binary, the asset
    scripts/setup_llama_cpp.sh
    cargo build --release -p strata-cli
    python scripts/make_bench_gguf.py --out /work/bench-assets/qwen3-30b-a3b.q4_k_m.gguf
    # then, on a quiet machine:
    .venv-llama/bin/python scripts/bench_gguf_vs_llama_cpp.py \\
        --model /work/bench-assets/qwen3-30b-a3b.q4_k_m.gguf --rounds 3 --json bench.json

Run it with the Python of the venv scripts/setup_llama_cpp.sh made (it imports llama_cpp to
build the prompt); LLAMA_CPP_LIB_PATH defaults to that script's build (`--llama-lib`).

Both engines get the same file, the same thread count (`--threads`: STRATA_THREADS for
Strata, n_threads / n_threads_batch for llama.cpp) and the same prompt text of exactly
`--prompt-tokens` tokens (built from a fixed English text with llama.cpp's tokenizer of the
file, checked to re-tokenize to that length), and generate `--gen-tokens` tokens greedily.
Each round runs both, one after the other, in a fresh process each; the order alternates
between rounds (on a shared host back-to-back runs drift). Reported per engine: the median
over rounds (and the best) of

- `load_s`: start of the process's model load to the model being ready (Strata: time to
  first token minus prefill, as it prints no load time);
- `ttft_s`: process start (llama.cpp: the `Llama(...)` call, so Python's own start-up is not
  counted) to the first generated token: load + prefill + first sample;
- `prefill_tps`: prompt tokens / (prefill wall time until the first token is sampled);
- `decode_tps`: generated tokens after the first / their wall time;
- `peak_rss_anon_mb`, `peak_rss_file_mb`: the largest RssAnon (private) and RssFile
  (file-backed: the mapped GGUF) seen in /proc/PID/status, sampled every 20 ms;
  `vm_hwm_mb`: VmHWM (the kernel's peak resident set) at the last sample.

llama.cpp runs through llama-cpp-python in a child process (`--worker`): `eval(prompt)`, then
one `eval([token])` per generated token with the argmax of the last logits, each step
timed (its `generate` would re-evaluate the prompt). Loaded with use_extra_bufts=False (its
AMX repacking dies with SIGILL on some machines here) and the default mmap, or with
`--llama-repack` with llama.cpp's default extra buffer types (weights repacked at load for
its AMX / AVX-512 kernels, in anonymous memory). The child's
RssAnon includes the Python interpreter and numpy (~40 MB).

`--memory-limit 8G` runs each engine inside a memory cgroup of that size (v1 or v2, made
under /sys/fs/cgroup; needs root) with the page cache dropped before each run: a machine
with less RAM than the model (the SSD tier, issue #29). Then also reported: the cgroup's
peak usage (`cgroup_peak_mb`, page cache included), the bytes the process read from disk
(`read_mb`, /proc/PID/io), and a run the OOM killer ends is recorded as such, not retried.
Strata runs as `strata generate --model FILE --prompt TEXT --max-tokens N --temperature 0`
(plus `--strata-arg`s) and its statistics line on stderr is parsed:
`[load T, P prompt tokens at X tok/s, G generated at Y tok/s, finish: ...]`; the first byte on its
stdout is its first token. A random model may emit its end-of-sequence token early; such a
run is marked (`finish`).
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_LIB = ROOT / ".cache" / "llama.cpp" / "build" / "bin"

# A fixed, varied English text to cut the prompt from (repeated as needed).
TEXT = (
    "The river town woke slowly that spring. Fishermen mended their nets along the quay while "
    "the baker, a tall man with flour on his sleeves, argued with a merchant about the price "
    "of rye. Children ran between the stalls, chasing a dog that had stolen a sausage. In the "
    "council hall, the mayor read a letter from the capital: the new railway would pass north "
    "of the hills, not through the valley as everyone had hoped. He folded it twice, put it in "
    "his pocket and walked to the window. Below, a cart loaded with barrels turned the corner "
    "too fast and lost one of them, which rolled all the way down to the water. Nobody moved "
    "to stop it. Later that day the schoolteacher asked her pupils to write about the future "
    "of their town; most wrote about trains, two wrote about the sea, and one boy wrote a long "
    "story about a barrel that floated to America and made its owner rich. "
)


def proc_status(pid: int) -> dict:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmHWM", "RssAnon", "RssFile", "VmRSS"):
                    out[key] = int(rest.split()[0]) / 1024.0  # kB -> MB
    except (FileNotFoundError, ProcessLookupError):
        pass
    return out


def read_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


class MemSampler(threading.Thread):
    """Samples a process's /proc/PID/status (and /proc/PID/io) every 20 ms until it exits."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.anon, self.file, self.hwm, self.done = pid, 0.0, 0.0, 0.0, False
        self.read = 0

    def run(self) -> None:
        while not self.done:
            s = proc_status(self.pid)
            if s:
                self.anon = max(self.anon, s.get("RssAnon", 0.0))
                self.file = max(self.file, s.get("RssFile", 0.0))
                self.hwm = max(self.hwm, s.get("VmHWM", 0.0))
            self.read = max(self.read, read_bytes(self.pid))
            time.sleep(0.02)

    def result(self) -> dict:
        r = {"peak_rss_anon_mb": round(self.anon, 1), "peak_rss_file_mb": round(self.file, 1),
             "vm_hwm_mb": round(self.hwm, 1), "read_mb": round(self.read / 2**20, 1)}
        if CGROUP:
            r["cgroup_peak_mb"] = round(CGROUP.peak() / 2**20, 1)
        return r


class Cgroup:
    """A memory cgroup of `limit` bytes for the benchmarked processes (v2, else v1)."""

    def __init__(self, limit: int):
        v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
        base = Path("/sys/fs/cgroup") if v2 else Path("/sys/fs/cgroup/memory")
        self.dir = base / f"strata-bench-{os.getpid()}"
        self.dir.mkdir(exist_ok=True)
        self.v2 = v2
        (self.dir / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(str(limit))
        if not v2:
            # No swap beyond the limit either, where the kernel accounts it.
            memsw = self.dir / "memory.memsw.limit_in_bytes"
            if memsw.exists():
                memsw.write_text(str(limit))

    def enter(self) -> None:
        """In the child, before exec: join the cgroup."""
        (self.dir / "cgroup.procs").write_text(str(os.getpid()))

    def reset(self) -> None:
        """Drops the page cache and resets the peak before a run."""
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3")
        if not self.v2:
            (self.dir / "memory.max_usage_in_bytes").write_text("0")

    def peak(self) -> int:
        f = self.dir / ("memory.peak" if self.v2 else "memory.max_usage_in_bytes")
        try:
            return int(f.read_text())
        except (FileNotFoundError, ValueError):
            return 0

    def remove(self) -> None:
        try:
            self.dir.rmdir()
        except OSError:
            pass


CGROUP = None


def launch(cmd, **kw):
    """Popen inside the benchmark's cgroup (page cache dropped first), if there is one."""
    if CGROUP:
        CGROUP.reset()
        kw["preexec_fn"] = CGROUP.enter
    return subprocess.Popen(cmd, **kw)


def killed(p, err: str, engine: str) -> dict:
    """The record of a run that did not finish: the OOM killer's, or an error."""
    if p.returncode == -9:
        return {"finish": "killed (SIGKILL: the OOM killer)", "error": err[-300:]}
    raise RuntimeError(f"{engine} failed ({p.returncode}): {err[-2000:]}")


def run_llama(args, prompt: str) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--model", str(args.model),
           "--threads", str(args.threads), "--gen-tokens", str(args.gen_tokens),
           "--prompt-file", str(args.prompt_file)]
    if args.llama_repack:
        cmd.append("--llama-repack")
    p = launch(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
               env=llama_env(args))
    mem = MemSampler(p.pid)
    mem.start()
    out, err = p.communicate()
    mem.done = True
    mem.join()
    if p.returncode != 0:
        return {**killed(p, err, "llama.cpp worker"), **mem.result()}
    r = json.loads(out.strip().splitlines()[-1])
    r.update(mem.result())
    return r


STATS = re.compile(r"[\[ ](\d+) prompt tokens at ([\d.]+) tok/s, (\d+) generated at ([\d.]+) tok/s, "
                   r"finish: ([^,\]]+)")
# The SSD tier's line (`--expert-cache`): prefill and decode hit rates and bytes read.
CACHE = re.compile(r"experts took ([\d.]+)% of lookups;(?: [^;]*;)*? prefill ([\d.]+)% hits, ([\d.]+) MiB read; "
                   r"decode ([\d.]+)% hits, ([\d.]+) MiB read per token")
GUESSED = re.compile(r"fetched ahead \(([\d.]+)% of the experts used guessed\)")


def run_strata(args, prompt: str) -> dict:
    cmd = [str(args.strata), "generate", "--model", str(args.model), "--prompt", prompt,
           "--max-tokens", str(args.gen_tokens), "--temperature", "0", *args.strata_arg]
    env = dict(os.environ, STRATA_THREADS=str(args.threads))
    start = time.perf_counter()
    p = launch(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    mem = MemSampler(p.pid)
    mem.start()
    first = p.stdout.read(1)
    ttft = time.perf_counter() - start
    rest = p.stdout.read()
    err = p.stderr.read().decode(errors="replace")
    p.wait()
    mem.done = True
    mem.join()
    if p.returncode != 0:
        return {**killed(p, err, "strata"), **mem.result()}
    m = STATS.search(err)
    if not m:
        raise RuntimeError(f"no statistics line in strata's stderr: {err[-2000:]}")
    prompt_tokens, prefill_tps = int(m[1]), float(m[2])
    generated, decode_tps, finish = int(m[3]), float(m[4]), m[5]
    if not first:
        ttft = float("nan")
    r = {"load_s": round(ttft - prompt_tokens / prefill_tps, 3), "ttft_s": round(ttft, 3),
         "prompt_tokens": prompt_tokens, "prefill_tps": prefill_tps, "generated": generated,
         "decode_tps": decode_tps, "finish": finish,
         "text": (first + rest).decode(errors="replace")[:80]}
    c = CACHE.search(err)
    if c:
        r.update({"top30_share_pct": float(c[1]), "prefill_hit_pct": float(c[2]),
                  "prefill_read_mb": float(c[3]), "decode_hit_pct": float(c[4]),
                  "decode_read_mb_per_token": float(c[5])})
    if g := GUESSED.search(err):
        r["guess_recall_pct"] = float(g[1])
    r.update(mem.result())
    return r


def worker(args) -> None:
    """llama.cpp side, in its own process: prints one JSON line."""
    import numpy as np
    from llama_cpp import Llama

    prompt = Path(args.prompt_file).read_text()

    def last_logits():
        # Without logits_all, Llama.eval keeps no scores: read llama.cpp's last row.
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))

    # `Llama` takes no `use_extra_bufts` (an unknown keyword is swallowed by its **kwargs, and
    # llama.cpp repacked whatever was asked until 2026-12-01): set it on the model parameters
    # the constructor starts from.
    import llama_cpp.llama as llama_module
    default_params = llama_module.llama_cpp.llama_model_default_params

    def model_params():
        params = default_params()
        params.use_extra_bufts = args.llama_repack
        return params

    llama_module.llama_cpp.llama_model_default_params = model_params
    t0 = time.perf_counter()
    llm = Llama(model_path=str(args.model), n_ctx=4096, n_batch=512, n_ubatch=512,
                n_threads=args.threads, n_threads_batch=args.threads, verbose=False)
    t_load = time.perf_counter()
    tokens = llm.tokenize(prompt.encode(), add_bos=True, special=False)
    t_tok = time.perf_counter()
    llm.eval(tokens)
    tok = int(np.argmax(last_logits()))
    t_first = time.perf_counter()
    out, steps = [tok], []
    for _ in range(args.gen_tokens - 1):
        s = time.perf_counter()
        llm.eval([tok])
        tok = int(np.argmax(last_logits()))
        steps.append(time.perf_counter() - s)
        out.append(tok)
    logits = last_logits()
    finite = bool(np.isfinite(logits).all())
    prefill = t_first - t_tok
    print(json.dumps({
        "load_s": round(t_load - t0, 3),
        "ttft_s": round(t_load - t0 + prefill, 3),
        "prompt_tokens": len(tokens),
        "prefill_tps": round(len(tokens) / prefill, 2),
        "generated": len(out),
        "decode_tps": round(len(steps) / sum(steps), 2) if steps else float("nan"),
        "finish": "length" if finite else "non-finite logits",
        "text": llm.detokenize(out).decode(errors="replace")[:80],
    }))


def llama_env(args) -> dict:
    env = dict(os.environ)
    env.setdefault("LLAMA_CPP_LIB_PATH", str(args.llama_lib))
    return env


def make_prompt(args) -> str:
    """Text that llama.cpp's tokenizer of the file turns into exactly --prompt-tokens tokens."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(args.model), vocab_only=True, verbose=False)
    want = args.prompt_tokens
    ids = llm.tokenize((TEXT * (want // 100 + 2)).encode(), add_bos=False, special=False)
    for n in range(want, want - 16, -1):
        text = llm.detokenize(ids[:n]).decode(errors="ignore")
        if len(llm.tokenize(text.encode(), add_bos=False, special=False)) == want:
            return text
        # Cutting may split a merge; one token short is fixed by the next try.
    raise SystemExit(f"could not build a prompt of exactly {want} tokens")


def summarize(runs: list) -> dict:
    keys = ["load_s", "ttft_s", "prefill_tps", "decode_tps", "peak_rss_anon_mb",
            "peak_rss_file_mb", "vm_hwm_mb", "read_mb", "cgroup_peak_mb"]
    out = {}
    for k in keys:
        vals = [r[k] for r in runs if k in r]
        if not vals:
            out[k] = {"median": float("nan"), "best": float("nan")}
            continue
        best = min(vals) if k.endswith("_s") or k.endswith("_mb") else max(vals)
        out[k] = {"median": round(statistics.median(vals), 3), "best": round(best, 3)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--strata", type=Path, default=ROOT / "target" / "release" / "strata")
    p.add_argument("--strata-arg", action="append", default=[],
                   help="extra argument for `strata generate` (repeatable), e.g. --strata-arg=--weights=int4")
    p.add_argument("--llama-lib", type=Path, default=Path(os.environ.get("LLAMA_CPP_LIB_PATH", DEFAULT_LIB)),
                   help="directory holding libllama.so (default: scripts/setup_llama_cpp.sh's build)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--llama-repack", action="store_true",
                   help="llama.cpp with its default weight repacking (extra buffer types)")
    p.add_argument("--only", choices=["llama.cpp", "strata"], help="run one engine")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--memory-limit", help="run each engine in a memory cgroup of this size "
                   "(e.g. 8G), page cache dropped before each run (root)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--prompt-file", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    os.environ.setdefault("LLAMA_CPP_LIB_PATH", str(args.llama_lib))
    if args.worker:
        worker(args)
        return

    global CGROUP
    if args.memory_limit:
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        v = args.memory_limit.upper().rstrip("B").removesuffix("I")
        CGROUP = Cgroup(int(float(v[:-1]) * units[v[-1]]) if v[-1] in units else int(v))
    prompt = make_prompt(args)
    args.prompt_file = Path(f"/tmp/bench_gguf_prompt_{os.getpid()}.txt")
    args.prompt_file.write_text(prompt)
    engines = {"llama.cpp": run_llama, "strata": run_strata}
    if args.only:
        engines = {args.only: engines[args.only]}
    runs = {e: [] for e in engines}
    for r in range(args.rounds):
        order = list(engines) if r % 2 == 0 else list(reversed(engines))
        for e in order:
            res = engines[e](args, prompt)
            runs[e].append(res)
            print(f"round {r + 1} {e}: " + json.dumps(res), file=sys.stderr, flush=True)
    args.prompt_file.unlink()
    if CGROUP:
        CGROUP.remove()

    summary = {e: summarize(v) for e, v in runs.items()}
    ratios = {}
    if len(summary) == 2:
        s, l = summary["strata"], summary["llama.cpp"]
        ratios = {k: round(s[k]["median"] / l[k]["median"], 3) if l[k]["median"] else None
                  for k in s}
    rows = [("load (s)", "load_s"), ("time to first token (s)", "ttft_s"),
            (f"prefill tok/s ({args.prompt_tokens} tokens)", "prefill_tps"),
            (f"decode tok/s ({args.gen_tokens} tokens)", "decode_tps"),
            ("peak RssAnon (MB)", "peak_rss_anon_mb"), ("peak RssFile (MB)", "peak_rss_file_mb"),
            ("VmHWM (MB)", "vm_hwm_mb"), ("read from disk (MB)", "read_mb"),
            ("cgroup peak (MB)", "cgroup_peak_mb")]
    names = list(summary)
    print(f"\n{args.model.name}: {args.threads} threads, {args.rounds} rounds, medians (best)")
    head = f"| {'metric':<28} | " + " | ".join(f"{n:>18}" for n in names)
    print(head + (" | strata / llama.cpp |" if ratios else " |"))
    print("|" + "-" * 30 + "|" + "|".join("-" * 20 for _ in names) + ("|" + "-" * 20 + "|" if ratios else "|"))
    for label, k in rows:
        cells = " | ".join(f"{summary[n][k]['median']:>9.2f} ({summary[n][k]['best']:.2f})".rjust(18)
                           for n in names)
        line = f"| {label:<28} | {cells}"
        if ratios:
            # No ratio where llama.cpp's figure is zero (nothing read from disk, say).
            r = ratios[k]
            line += f" | {r:>18.3f} |" if r is not None else f" | {'n/a':>18} |"
        else:
            line += " |"
        print(line)
    result = {"model": str(args.model), "threads": args.threads, "rounds": args.rounds,
              "prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens,
              "strata_args": args.strata_arg, "summary": summary,
              "ratios_strata_over_llama_cpp": ratios, "runs": runs}
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
