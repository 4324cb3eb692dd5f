#!/usr/bin/env python3
"""One MoE layer on KTransformers' own CPU kernels (PyPI `kt-kernel`) beside Strata's.

The layer is Qwen3-30B-A3B's (hidden 2048, intermediate 768, 128 experts, top-8). The
kt-kernel side calls its C++ extension `kt_kernel_ext` the way KTransformers' own bench and
test scripts do (kt-kernel/bench/bench_moe.py, kt-kernel/examples/test_bf16_moe.py, and the
0.7.2 wrappers kt_kernel/utils/llamafile.py and kt_kernel/experts_base.py):
`CPUInfer(WorkerPoolConfig)` -> `moe.MOEConfig(E, k, H, I, gpu_experts_mask)` -> a backend
class -> `load_weights_task(physical_to_logical_map)` -> `forward_task(qlen, k, ids, weights,
input, output, False)` + `sync()`. Backends:

  llamafile  `moe.MOE`: GGUF blocks (here Q4_K for gate, up and down), llamafile/ggml
             kernels; compared with `strata bench moe --formats q4_k`.
  bf16       `moe.AMXBF16_MOE` in the AVX-512/AMX builds, `moe.AVX2BF16_MOE` in the AVX2 one;
             compared with `strata bench moe --formats bf16`.

Weights are random but valid and reproducible (seeded): Q4_K blocks are random bytes whose two
f16 super-block scales are set to 0.01 + 0.003 * ((block + field) % 7), the recipe of Strata's
own `ggml::random_blocks`, so both sides read the same kind of blocks; BF16 weights are
normal(0, 1/sqrt(fan-in)). Routing is Strata's bench routing (token t's j-th expert is
`(t*k + j + offset) % E`, the offset advancing by t*k each call so weights come from DRAM),
weights 1/k. Input and output are BF16 on the kt-kernel side (its `hidden_type`, as its
wrappers set it) and f32 on Strata's. Each point is the median of the timed calls (one warm-up
call first, then at least --min-calls calls and --min-seconds seconds), as `strata bench moe`
times its own. Every kt-kernel backend runs in a child process, so an illegal instruction
(SIGILL) or a crash is reported, not fatal; a child also checks kt-kernel's output against an
f32 reference (gguf's dequantizer for Q4_K) on a few tokens, so the API is known to be called
correctly; for Q4_K also against that reference with its activations rounded to Q8_K as the
ggml kernels round them, which leaves only kt-kernel's BF16 output rounding.

The kt-kernel extension is loaded with kt-kernel's own loader (`kt_kernel/_cpu_detect.py`,
which picks the build for this CPU) without importing the `kt_kernel` package, whose Python
wrappers import torch: the CPU kernels do not need it (the extension links no libtorch), so the
venv may hold kt-kernel without its torch/CUDA dependencies. `--probe` also loads each of the
wheel's other builds (AVX-512, AMX) in a child and runs a tiny forward, to record whether they
run on this CPU.

Threads: a kt-kernel pool of N runs N compute threads (`numa_0_m_0`, `numa_0_t_1`, ...) while the
CPUInfer task-queue thread that dispatched the job spin-waits for it, so N+1 threads are busy;
on a machine with only N cores they share them, and each call loses scheduler ticks (per-thread
CPU time of a kt-kernel process during forward calls with a pool of 2: three threads busy).
`--kt-threads 2,1` times both pool sizes and prints, per token count, the faster one beside
Strata.

Exit status: 0 when the LLAMAFILE (GGUF Q4_K) backend ran and was timed; 2 when it could not
run here (the reason is printed), after the BF16 backend has been tried in its place (and, if it
runs, measured beside `strata bench moe --formats bf16`).

Usage (run it at normal priority, on a quiet host):
  /work/venv-kt/bin/python scripts/bench_kt_kernel.py --strata target/release/strata \\
      [--tokens 1,64,512] [--threads 2] [--backends llamafile,bf16] [--rounds 1] [--probe] \\
      [--json-out kt_bench.json]
"""

import argparse
import glob
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HIDDEN, INTER, EXPERTS, TOPK = 2048, 768, 128, 8
QK_K, Q4_K_BYTES = 256, 144
SEED = 0x5EED

# Strata format each kt-kernel backend is compared with.
STRATA_FORMAT = {"llamafile": "q4_k", "bf16": "bf16"}


# --------------------------------------------------------------------------- kt-kernel side


def kt_package_dir():
    spec = importlib.util.find_spec("kt_kernel")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("kt-kernel is not installed in this Python (pip install kt-kernel)")
    return list(spec.submodule_search_locations)[0]


def load_kt_ext(variant=None):
    """kt_kernel_ext through kt-kernel's own loader, without importing the package (torch).

    With `variant`, that build's .so is loaded directly (no fallback, no ISA check): used by
    the probe to find out whether the AVX-512 / AMX builds run on this CPU."""
    pkg = kt_package_dir()
    if variant is None:
        spec = importlib.util.spec_from_file_location(
            "kt_kernel_cpu_detect", os.path.join(pkg, "_cpu_detect.py"))
        det = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(det)
        ext, loaded = det.initialize()
    else:
        so = glob.glob(os.path.join(pkg, f"_kt_kernel_ext_{variant}.*.so"))
        if not so:
            raise ImportError(f"no build for variant {variant} in {pkg}")
        spec = importlib.util.spec_from_file_location("kt_kernel_ext", so[0])
        ext = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(ext)
        loaded = getattr(ext, "__cpu_variant__", variant)
    sys.modules["kt_kernel_ext"] = ext
    return ext, str(loaded)


def random_q4k(rows, cols, rng):
    """Random valid Q4_K blocks for a rows x cols matrix (ggml layout, row-major)."""
    import numpy as np
    nb = rows * cols // QK_K
    v = rng.integers(0, 256, size=(nb, Q4_K_BYTES), dtype=np.uint8)
    b = np.arange(nb)
    for i, off in enumerate((0, 2)):  # d, dmin (f16)
        val = (0.01 + 0.003 * ((b + i) % 7)).astype(np.float16)
        v[:, off:off + 2] = val.view(np.uint8).reshape(nb, 2)
    return v.reshape(-1)


def to_bf16(x):
    """float32 array -> bf16 bits (uint16), round to nearest even."""
    import numpy as np
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(b):
    import numpy as np
    return (b.astype(np.uint32) << 16).view(np.float32)


def routing(t, k, e, offset):
    """Strata's bench routing: token t's j-th expert is (t*k + j + offset) % e, weights 1/k."""
    import numpy as np
    ids = ((np.arange(t * k, dtype=np.int64) + offset) % e).reshape(t, k)
    return ids, np.full((t, k), 1.0 / k, dtype=np.float32)


def build_layer(ext, backend, threads, max_len, shape, rng):
    """kt-kernel's MoE module for one layer; returns (cpu_infer, moe, weights-to-keep, deq)."""
    import numpy as np
    h, inter, e, k = shape
    moe_mod = ext.moe
    wpc = ext.WorkerPoolConfig()
    wpc.subpool_count = 1
    wpc.subpool_numa_map = [0]
    wpc.subpool_thread_count = [threads]
    cpu = ext.CPUInfer(wpc)
    mask = np.zeros(e, dtype=np.bool_)  # no expert on a GPU
    cfg = moe_mod.MOEConfig(e, k, h, inter, mask.ctypes.data)
    cfg.layer_idx = 0
    cfg.pool = cpu.backend_
    cfg.max_len = max_len
    if backend == "llamafile":
        from kt_kernel_ext.kvcache import ggml_type
        gate = np.concatenate([random_q4k(inter, h, rng) for _ in range(e)])
        up = np.concatenate([random_q4k(inter, h, rng) for _ in range(e)])
        down = np.concatenate([random_q4k(h, inter, rng) for _ in range(e)])
        # As kt_kernel/utils/llamafile.py configures it.
        cfg.m_block = 32
        cfg.group_min_len = 10
        cfg.group_max_len = max_len
        cfg.gate_type = ggml_type.Q4_K
        cfg.up_type = ggml_type.Q4_K
        cfg.down_type = ggml_type.Q4_K
        cfg.hidden_type = ggml_type.BF16
        cls = moe_mod.MOE
        p2l = np.arange(e, dtype=np.int32)

        def deq(x):  # expert x's f32 (gate, up, down), by gguf's reference dequantizer
            from gguf import GGMLQuantizationType as Q
            from gguf.quants import dequantize
            eg, ed = inter * h // QK_K * Q4_K_BYTES, h * inter // QK_K * Q4_K_BYTES
            return (dequantize(gate[x * eg:(x + 1) * eg].reshape(inter, -1), Q.Q4_K),
                    dequantize(up[x * eg:(x + 1) * eg].reshape(inter, -1), Q.Q4_K),
                    dequantize(down[x * ed:(x + 1) * ed].reshape(h, -1), Q.Q4_K))
    elif backend == "bf16":
        def mat(n, kk):
            return to_bf16(rng.standard_normal((n, kk), dtype=np.float32) / np.sqrt(kk))
        gate = np.stack([mat(inter, h) for _ in range(e)])
        up = np.stack([mat(inter, h) for _ in range(e)])
        down = np.stack([mat(h, inter) for _ in range(e)])
        cfg.gate_scale = cfg.up_scale = cfg.down_scale = 0
        cls = getattr(moe_mod, "AMXBF16_MOE", None) or getattr(moe_mod, "AVX2BF16_MOE", None)
        if cls is None:
            raise RuntimeError("this kt-kernel build has no BF16 MoE class")
        p2l = np.arange(e, dtype=np.int64)

        def deq(x):
            return from_bf16(gate[x]), from_bf16(up[x]), from_bf16(down[x])
    else:
        raise ValueError(f"unknown backend {backend}")
    cfg.gate_proj = gate.ctypes.data
    cfg.up_proj = up.ctypes.data
    cfg.down_proj = down.ctypes.data
    moe = cls(cfg)
    cpu.submit(moe.load_weights_task(p2l.ctypes.data))
    cpu.sync()
    return cpu, moe, (gate, up, down, mask, p2l), deq, cls.__name__


def kt_forward(cpu, moe, x_bf16, ids, wts, out_bf16, k):
    import numpy as np
    qlen = np.array([x_bf16.shape[0]], dtype=np.int32)
    cpu.submit(moe.forward_task(qlen.ctypes.data, k, ids.ctypes.data, wts.ctypes.data,
                                x_bf16.ctypes.data, out_bf16.ctypes.data, False))
    cpu.sync()


def q8_k(v):
    """Round a vector as ggml's Q8_K does (per 256 values: scale max|v| / 127, int8)."""
    import numpy as np
    b = v.reshape(-1, QK_K)
    s = np.abs(b).max(axis=1, keepdims=True) / 127.0
    s[s == 0] = 1.0
    return (np.clip(np.round(b / s), -127, 127) * s).reshape(v.shape)


def reference(deq, x, ids, wts, act_q8=False):
    """f32 MoE (SiLU(gate x) * up x, then down, weighted sum) on dequantized weights.

    With `act_q8`, the activations (input and SiLU product) are rounded to Q8_K first, as the
    ggml/llamafile vec-dot kernels for K-quants do: what is left is kt-kernel's BF16 output."""
    import numpy as np
    out = np.zeros((x.shape[0], deq(0)[2].shape[0]), dtype=np.float64)
    cache = {}
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if e not in cache:
                cache[e] = [m.astype(np.float64) for m in deq(e)]
            g, u, d = cache[e]
            xt = q8_k(x[t]) if act_q8 else x[t]
            gx, ux = g @ xt, u @ xt
            with np.errstate(over="ignore"):
                act = gx / (1.0 + np.exp(-gx)) * ux
            out[t] += wts[t, j] * (d @ (q8_k(act) if act_q8 else act))
    return out


def worker(a):
    """Child process: time one kt-kernel backend; results go to a.result as JSON."""
    import numpy as np
    res = {"backend": a.worker, "stage": "loading extension"}

    def save():
        with open(a.result, "w") as f:
            json.dump(res, f)

    save()
    ext, variant = load_kt_ext()
    res.update(variant=variant, stage="building layer")
    save()
    tokens = [int(t) for t in a.tokens.split(",")]
    shape = (HIDDEN, INTER, EXPERTS, TOPK)
    rng = np.random.default_rng(SEED)
    t0 = time.perf_counter()
    cpu, moe, keep, deq, cls = build_layer(ext, a.worker, a.threads, max(max(tokens), 32),
                                           shape, rng)
    res.update(kt_class=cls, load_seconds=time.perf_counter() - t0, stage="checking")
    save()

    # Correctness on a few tokens against f32 math on the same (dequantized) weights.
    tc = 2
    x = rng.uniform(-1, 1, size=(tc, HIDDEN)).astype(np.float32)
    xb = to_bf16(x)
    ids, wts = routing(tc, TOPK, EXPERTS, 0)
    out = np.zeros((tc, HIDDEN), dtype=np.uint16)
    kt_forward(cpu, moe, xb, ids, wts, out, TOPK)
    want = reference(deq, from_bf16(xb).astype(np.float64), ids, wts)
    got = from_bf16(out).astype(np.float64)
    res["check"] = {"tokens": tc,
                    "rel_rms_err": float(np.linalg.norm(got - want) / np.linalg.norm(want))}
    if a.worker == "llamafile":
        want = reference(deq, from_bf16(xb).astype(np.float64), ids, wts, act_q8=True)
        res["check"]["rel_rms_err_q8_k_activations"] = float(
            np.linalg.norm(got - want) / np.linalg.norm(want))
    res["stage"] = "timing"
    save()

    rows = []
    for t in tokens:
        xb = to_bf16(rng.uniform(-1, 1, size=(t, HIDDEN)).astype(np.float32))
        out = np.zeros((t, HIDDEN), dtype=np.uint16)
        calls = [routing(t, TOPK, EXPERTS, (c * t * TOPK) % EXPERTS) for c in range(64)]
        ids, wts = calls[0]
        kt_forward(cpu, moe, xb, ids, wts, out, TOPK)  # warm-up
        times, start, c = [], time.perf_counter(), 1
        while len(times) < a.min_calls or (time.perf_counter() - start < a.min_seconds
                                          and len(times) < 2000):
            ids, wts = calls[c % len(calls)]
            t1 = time.perf_counter()
            kt_forward(cpu, moe, xb, ids, wts, out, TOPK)
            times.append(time.perf_counter() - t1)
            c += 1
        rows.append({"tokens": t, "seconds": statistics.median(times), "calls": len(times)})
        res["results"] = rows
        save()
    res["stage"] = "done"
    save()


def probe_worker(a):
    """Child process: load one of the wheel's builds and run a tiny forward of one backend."""
    import numpy as np
    res = {"variant": a.probe_variant, "backend": a.probe_backend, "stage": "loading .so"}

    def save():
        with open(a.result, "w") as f:
            json.dump(res, f)

    save()
    ext, _ = load_kt_ext(a.probe_variant)
    res["classes"] = sorted(n for n in dir(ext.moe) if n.endswith("MOE"))
    shape = (512, 256, 8, 2)
    rng = np.random.default_rng(1)
    tc = 2
    xb = to_bf16(rng.uniform(-1, 1, size=(tc, shape[0])).astype(np.float32))
    ids, wts = routing(tc, shape[3], shape[2], 0)
    out = np.zeros((tc, shape[0]), dtype=np.uint16)
    backend = a.probe_backend
    res["stage"] = f"{backend}: CPUInfer, MOEConfig, class, load_weights_task"
    save()
    cpu, moe, keep, deq, cls = build_layer(ext, backend, 1, 32, shape, rng)
    res["kt_class"] = cls
    res["stage"] = f"{backend} ({cls}): forward_task"
    save()
    kt_forward(cpu, moe, xb, ids, wts, out, shape[3])
    res["finite"] = bool(np.isfinite(from_bf16(out)).all())
    res["stage"] = "done"
    save()


def run_child(args, timeout):
    """Run this script as a child; returns (json result or {}, description of how it ended)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    cmd = [sys.executable, os.path.abspath(__file__), "--result", path] + args
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        rc, tail = p.returncode, (p.stdout + p.stderr).strip().splitlines()[-6:]
    except subprocess.TimeoutExpired:
        rc, tail = None, ["timed out"]
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        doc = {}
    os.unlink(path)
    if rc == 0:
        how = "ok"
    elif rc is None:
        how = f"timed out after {timeout} s"
    elif rc < 0:
        import signal
        try:
            how = f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            how = f"killed by signal {-rc}"
    else:
        how = f"exit {rc}: " + " | ".join(tail)
    if rc != 0 and doc.get("stage"):
        how += f" (during: {doc['stage']})"
    return doc, how


# --------------------------------------------------------------------------- Strata side


def run_strata(a, formats):
    env = dict(os.environ, STRATA_THREADS=str(a.threads))
    cmd = [a.strata, "bench", "moe", "--formats", ",".join(formats), "--tokens", a.tokens,
           "--min-seconds", str(a.min_seconds), "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return cmd, json.loads(out)


# --------------------------------------------------------------------------- driver


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return sorted(flags & {"avx2", "fma", "f16c", "avx512f", "avx512bw",
                                           "avx512_vnni", "avx512_bf16", "avx_vnni",
                                           "amx_tile", "amx_bf16", "amx_int8"})
    except OSError:
        pass
    return []


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strata", default="target/release/strata")
    p.add_argument("--tokens", default="1,64,512")
    p.add_argument("--threads", type=int, default=2, help="threads on both sides")
    p.add_argument("--kt-threads", default=None,
                   help="kt-kernel worker-pool sizes to time, comma-separated (default: "
                        "--threads). kt-kernel's CPUInfer task-queue thread spin-waits on the "
                        "pool while it computes, so a pool of N keeps N+1 threads busy: on a "
                        "machine with N cores a pool of N-1 can be faster; '2,1' times both")
    p.add_argument("--backends", default="llamafile",
                   help="kt-kernel backends to time: llamafile (GGUF Q4_K) and/or bf16")
    p.add_argument("--rounds", type=int, default=1,
                   help="alternate kt-kernel and Strata this many times, keep each side's best")
    p.add_argument("--min-seconds", type=float, default=1.0,
                   help="timed seconds per point, each side (at least --min-calls calls)")
    p.add_argument("--min-calls", type=int, default=5)
    p.add_argument("--probe", action="store_true",
                   help="also try the wheel's AVX-512 / AMX builds in children")
    p.add_argument("--json-out", default=None, help="write the full results here")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--probe-variant", help=argparse.SUPPRESS)
    p.add_argument("--probe-backend", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    if a.probe_variant:
        return probe_worker(a)

    backends = [b.strip() for b in a.backends.split(",") if b.strip()]
    for b in backends:
        if b not in STRATA_FORMAT:
            p.error(f"unknown backend {b} (llamafile, bf16)")
    try:
        kt_dir = kt_package_dir()
        from importlib.metadata import version
        kt_version = version("kt-kernel")
    except Exception as e:  # noqa: BLE001
        print(f"kt-kernel is not importable from {sys.executable}: {e}", file=sys.stderr)
        return 2
    doc = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "cpu": cpu_model(),
        "cpu_flags": cpu_flags(),
        "kt_kernel": {"version": kt_version, "dir": kt_dir,
                      "builds": sorted(os.path.basename(s).split(".")[0]
                                       for s in glob.glob(os.path.join(kt_dir, "_kt_kernel_ext_*.so")))},
        "shape": {"hidden": HIDDEN, "inter": INTER, "experts": EXPERTS, "topk": TOPK},
        "threads": a.threads,
        "tokens": [int(t) for t in a.tokens.split(",")],
        "probe": [],
        "kt": {},
        "strata": {},
    }
    print(f"{doc['cpu']}; flags {' '.join(doc['cpu_flags'])}", file=sys.stderr)
    print(f"kt-kernel {kt_version}: builds {', '.join(doc['kt_kernel']['builds'])}",
          file=sys.stderr)

    if a.probe:
        for b in doc["kt_kernel"]["builds"]:
            variant = b.replace("_kt_kernel_ext_", "")
            for backend in ("llamafile", "bf16"):
                r, how = run_child(["--probe-variant", variant, "--probe-backend", backend],
                                   timeout=120)
                r["outcome"] = how
                doc["probe"].append(r)
                print(f"probe {variant} build, {backend} ({r.get('kt_class', '?')}): {how}",
                      file=sys.stderr)

    kt_threads = [int(t) for t in (a.kt_threads or str(a.threads)).split(",")]
    doc["kt_threads"] = kt_threads
    best = {"kt": {}, "strata": {}}
    failed = {}
    strata_cmd = None
    for rnd in range(a.rounds):
        ran = []
        i = 0
        while i < len(backends):
            b = backends[i]
            i += 1
            for kth in kt_threads:
                if b in failed:
                    continue
                r, how = run_child(["--worker", b, "--tokens", a.tokens, "--threads",
                                    str(kth), "--min-seconds", str(a.min_seconds),
                                    "--min-calls", str(a.min_calls)], timeout=900)
                if how != "ok":
                    failed[b] = how
                    print(f"kt-kernel backend {b} did not run here: {how}", file=sys.stderr)
                    doc["kt"][b] = {"outcome": how, **r}
                    if b == "llamafile" and "bf16" not in backends:
                        print("trying kt-kernel's BF16 backend instead", file=sys.stderr)
                        backends.append("bf16")
                    continue
                if b not in ran:
                    ran.append(b)
                doc["kt"][b] = {k: v for k, v in r.items() if k != "results"}
                q8 = r["check"].get("rel_rms_err_q8_k_activations")
                print(f"kt-kernel {b} ({r.get('kt_class')}, {r.get('variant')} build, pool of "
                      f"{kth}): output vs f32 reference, rel RMS err "
                      f"{r['check']['rel_rms_err']:.2e}"
                      + (f" ({q8:.2e} against it with Q8_K-rounded activations)" if q8 else ""),
                      file=sys.stderr)
                doc.setdefault("kt_rounds", []).append(
                    {"round": rnd + 1, "backend": b, "pool_threads": kth,
                     "results": r["results"]})
                for row in r["results"]:
                    key = (b, kth, row["tokens"])
                    best["kt"][key] = min(best["kt"].get(key, row["seconds"]), row["seconds"])
        formats = [STRATA_FORMAT[b] for b in ran]
        if formats:
            strata_cmd, s = run_strata(a, formats)
            doc["strata"]["machine"] = s.get("machine")
            doc["strata"]["peaks"] = s.get("peaks")
            doc["strata"]["accuracy"] = s.get("accuracy")
            doc.setdefault("strata_rounds", []).append({"round": rnd + 1,
                                                        "results": s["results"]})
            for row in s["results"]:
                key = (row["format"], row["tokens"])
                best["strata"][key] = min(best["strata"].get(key, row["seconds"]),
                                          row["seconds"])
        print(f"round {rnd + 1}/{a.rounds} done", file=sys.stderr)

    doc["strata_command"] = (f"STRATA_THREADS={a.threads} " + " ".join(strata_cmd)
                             if strata_cmd else None)
    rows = []
    for b in backends:
        if b in failed:
            continue
        for kth in kt_threads:
            for t in doc["tokens"]:
                kt = best["kt"].get((b, kth, t))
                st = best["strata"].get((STRATA_FORMAT[b], t))
                rows.append({"kt_backend": b, "kt_threads": kth,
                             "strata_format": STRATA_FORMAT[b], "strata_threads": a.threads,
                             "tokens": t, "kt_seconds": kt, "strata_seconds": st,
                             "speedup": kt / st if kt and st else None})
    doc["rows"] = rows
    doc["failed"] = failed
    print("| kt-kernel backend (pool threads) | Strata format (threads) | tokens "
          "| kt-kernel ms/call | Strata ms/call | Strata speed-up (kt / Strata) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        ratio = f"{r['speedup']:.2f}x" if r["speedup"] else "n/a"
        kt_ms = f"{r['kt_seconds'] * 1e3:.2f}" if r["kt_seconds"] else "n/a"
        st_ms = f"{r['strata_seconds'] * 1e3:.2f}" if r["strata_seconds"] else "n/a"
        print(f"| {r['kt_backend']} ({r['kt_threads']}) | {r['strata_format']} "
              f"({r['strata_threads']}) | {r['tokens']} | {kt_ms} | {st_ms} | {ratio} |")
    if len(kt_threads) > 1:
        print()
        print("| kt-kernel backend (its fastest pool) | tokens | kt-kernel ms/call "
              "| Strata ms/call | Strata speed-up |")
        print("|---|---|---|---|---|")
        doc["best_rows"] = []
        for b in backends:
            for t in doc["tokens"]:
                rs = [r for r in rows if r["kt_backend"] == b and r["tokens"] == t
                      and r["kt_seconds"]]
                if not rs:
                    continue
                r = min(rs, key=lambda r: r["kt_seconds"])
                doc["best_rows"].append(r)
                ratio = f"{r['speedup']:.2f}x" if r["speedup"] else "n/a"
                st_ms = f"{r['strata_seconds'] * 1e3:.2f}" if r["strata_seconds"] else "n/a"
                print(f"| {b} ({r['kt_threads']}) | {t} | {r['kt_seconds'] * 1e3:.2f} "
                      f"| {st_ms} | {ratio} |")
    for b, how in failed.items():
        print(f"kt-kernel backend {b}: did not run ({how})")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(doc, f, indent=2)
    if "llamafile" in failed or "llamafile" not in backends:
        if "llamafile" in failed:
            print("The LLAMAFILE (GGUF) backend cannot run on this machine: "
                  f"{failed['llamafile']}", file=sys.stderr)
        return 2 if "llamafile" in failed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main() or 0)
