"""vLLM plugin: vLLM's CPU fused-MoE computed by Strata's expert kernels.

Registered through the `vllm.general_plugins` entry point, so vLLM calls `register()` in
its main, engine and every worker process. It replaces two methods of vLLM's CPU experts
(`CPUUnquantizedExperts` in vllm/model_executor/layers/fused_moe/experts/cpu_moe.py, and
so its x86/Arm/Power subclasses):

- `process_weights_after_loading`: packs the layer's `w13 [E, 2I, H]` (gate rows then up
  rows) and `w2 [E, H, I]` once into Strata's format (`STRATA_VLLM_FORMAT`: bf16 by
  default, int8, int4) instead of vLLM's prepacking. A tensor-parallel rank holds a slice
  of every expert's intermediate dimension: that is just a smaller `I`, its output the
  rank's partial sum, which vLLM all-reduces as it does its own.
- `apply`: `strata.ops.fused_moe_into` on the routed tokens, read from and written into
  vLLM's own tensors (bfloat16 included).

Strata's thread pool takes the cores vLLM bound the worker's OpenMP threads to, unless
`STRATA_THREADS`/`STRATA_CPUS` are set.

A layer Strata cannot compute (an activation other than SiLU, expert biases, ...) keeps
vLLM's own kernels, with a warning that says why. `STRATA_VLLM=0` turns the plugin off.
"""

import logging
import os

# A child of vLLM's logger: its handler and format, INFO and up on stderr.
logger = logging.getLogger("vllm.strata")

# Process-wide state: plugins are loaded once per process but `register` may still be
# called more than once (vLLM's guard is per process; tests call it directly).
_state = {"registered": False, "layers": 0, "announced": False, "format": None}


def _warn(msg, *args):
    logger.warning("Strata vLLM plugin: " + msg, *args)


def register():
    """The entry point: patches vLLM's CPU experts once per process."""
    if _state["registered"]:
        return
    _state["registered"] = True
    if os.environ.get("STRATA_VLLM", "1") == "0":
        return
    try:
        import strata.ops  # noqa: F401
    except ImportError as e:
        _warn("not active: the strata package does not import (%s); vLLM computes its MoE", e)
        return
    try:
        from vllm.model_executor.layers.fused_moe.experts import cpu_moe
    except ImportError as e:
        _warn("not active: this vLLM has no CPU experts module (%s); vLLM computes its MoE", e)
        return
    _threads_like_vllm()
    fmt = os.environ.get("STRATA_VLLM_FORMAT", "bf16")
    _state["format"] = fmt
    from strata_vllm import experts

    experts.patch(cpu_moe.CPUUnquantizedExperts, fmt, _state, logger, _warn)


def _omp_cpus():
    """The cores vLLM bound this process's OpenMP threads to, from the variables its CPU
    worker sets (GOMP_CPU_AFFINITY `0 1 2`, KMP_AFFINITY `...proclist=[0,1,2]`, OMP_PLACES
    `{0,1,2}`), or None."""
    import re

    for var, pattern in (
        ("GOMP_CPU_AFFINITY", r"(.*)"),
        ("KMP_AFFINITY", r".*proclist=\[([^\]]*)\]"),
        ("OMP_PLACES", r"\{([^}]*)\}"),
    ):
        m = re.fullmatch(pattern, os.environ.get(var, "").strip())
        if not m or not m.group(1).strip():
            continue
        cpus = []
        for part in re.split(r"[\s,]+", m.group(1).strip()):
            a, _, b = part.partition("-")
            if not a.isdigit() or (b and not b.isdigit()):
                return None
            cpus.extend(range(int(a), int(b or a) + 1))
        return cpus or None
    return None


def _threads_like_vllm():
    """Strata's pool on the cores vLLM gives this worker's OpenMP threads. vLLM pins the main
    thread, which creates the pool, to the first of them; left alone, Strata would see one
    core and run single-threaded beside vLLM's N threads. `STRATA_THREADS`/`STRATA_CPUS`
    set by the user win. Runs before the first kernel call (the pool reads them once)."""
    cpus = _omp_cpus()
    if cpus is None or "STRATA_THREADS" in os.environ or "STRATA_CPUS" in os.environ:
        return
    os.environ["STRATA_CPUS"] = ",".join(map(str, cpus))
    os.environ["STRATA_THREADS"] = str(len(cpus))

