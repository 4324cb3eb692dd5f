"""strata.LLM(expert_cache=...): a GGUF's routed experts read from the file into a DRAM cache
(the SSD tier, as `strata generate --expert-cache` runs it), its greedy output equal to the
model run from memory, below the accelerator's expert cache too (device='hybrid', three
tiers), its statistics (`LLM.expert_cache_stats()`), and the errors of its keywords."""

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import strata

ROOT = Path(__file__).resolve().parents[2]
GGUF = ROOT / "tests" / "fixtures-gguf" / "qwen3_moe_q32.q8_0.gguf"
PROMPT = "The capital of France is"


def greedy_ids(llm):
    params = strata.SamplingParams(temperature=0, max_tokens=12)
    (out,) = llm.generate(PROMPT, params)
    return out.outputs[0].token_ids


@pytest.fixture(scope="module")
def min_budget():
    """The least cache the fixture takes, read from the refusal of one byte less."""
    with pytest.raises(ValueError) as e:
        strata.LLM(str(GGUF), expert_cache=1)
    m = re.search(r"needs at least ([\d.]+) (KiB|MiB)", str(e.value))
    assert m, str(e.value)
    # Printed to a tenth: a tenth more is still less than one more slot.
    return int((float(m[1]) + 0.1) * {"KiB": 2**10, "MiB": 2**20}[m[2]])


@pytest.mark.parametrize("rule", ["lfu", "lru", "ema:0.5"])
def test_cached_experts_give_the_mapped_models_output(min_budget, rule):
    mapped = strata.LLM(str(GGUF), expert_cache="off")
    assert mapped.expert_cache_stats() is None
    # One token's experts per layer: evicted and read again all through the run.
    cached = strata.LLM(str(GGUF), expert_cache=min_budget, expert_cache_rule=rule)
    assert greedy_ids(cached) == greedy_ids(mapped)
    s = cached.expert_cache_stats()
    assert s["lookups"] == s["hits"] + s["in_flight"] + s["misses"], s
    assert s["misses"] > s["slots"] and s["bytes_read"] > 0, s
    assert 0 < s["slots_used"] <= s["slots"], s
    assert 0.3 <= s["top30_share"] <= 1.0 and 0.0 <= s["hit_rate"] < 1.0, s
    assert 0 < s["guessed"] <= s["guess_lookups"] < s["lookups"], s


def test_a_size_string_and_auto():
    cached = strata.LLM(str(GGUF), expert_cache="4MiB")
    greedy_ids(cached)
    assert cached.expert_cache_stats()["slot_bytes"] * cached.expert_cache_stats()["slots"] <= 4 << 20
    # The fixture fits in memory: auto (the default) maps it.
    assert strata.LLM(str(GGUF)).expert_cache_stats() is None
    assert strata.LLM(str(GGUF), expert_cache="auto").expert_cache_stats() is None


@pytest.mark.parametrize("policy", ["hybrimoe", "ktransformers"])
def test_three_tiers_give_the_mapped_models_output(accelerator, min_budget, policy):
    """device='hybrid': the accelerator's expert cache above the DRAM cache above the file."""
    kw = {"device": "hybrid", "policy": policy, "vram_budget": "64KiB"}
    mapped = strata.LLM(str(GGUF), expert_cache="off", **kw)
    assert mapped.expert_cache_stats() is None
    tiered = strata.LLM(str(GGUF), expert_cache=2 * min_budget, **kw)
    assert greedy_ids(tiered) == greedy_ids(mapped)
    s, ex = tiered.expert_cache_stats(), tiered.stats()
    assert s["lookups"] == ex["cpu_experts"] and s["misses"] > 0, (s, ex)
    # Every upload to the accelerator read through the DRAM cache.
    assert s["device_reads"] == ex["uploads"], (s, ex)
    if policy == "hybrimoe":
        assert ex["gpu_pairs"] > 0 and s["device_reads"] > 0, (s, ex)


@pytest.fixture(scope="module")
def pin_trace(strata_bin, tmp_path_factory):
    """A routing trace of the fixture (`strata trace`), to pin its most used experts."""
    d = tmp_path_factory.mktemp("pins")
    (d / "prompts.txt").write_text("The capital of France\nSing a song of the sea\n")
    subprocess.run([strata_bin, "trace", "--model", str(GGUF), "--prompts", str(d / "prompts.txt"),
                    "--out", str(d / "pins.trace"), "--decode", "4"],
                   check=True, capture_output=True, timeout=300)
    return d / "pins.trace"


def test_pinned_experts_are_read_at_start(min_budget, pin_trace):
    mapped = strata.LLM(str(GGUF), expert_cache="off")
    pinned = strata.LLM(str(GGUF), expert_cache=4 * min_budget, expert_cache_pin=str(pin_trace))
    s = pinned.expert_cache_stats()
    # Half the slots, read before any token, none of it counted as a token's read.
    assert s["pinned_experts"] == s["slots"] // 2 and s["pinned_bytes"] > 0, s
    assert s["bytes_read"] == 0 and s["lookups"] == 0, s
    assert greedy_ids(pinned) == greedy_ids(mapped)
    assert pinned.expert_cache_stats()["hits"] > 0


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_python_m_strata_serve_with_an_expert_cache(min_budget, pin_trace):
    """`python -m strata serve --expert-cache`: the tier runs and `/metrics` shows it."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "strata", "serve", "--model", str(GGUF), "--port", str(port),
         "--ctx-size", "128", "--expert-cache", str(2 * min_budget), "--expert-cache-rule", "lru",
         "--expert-cache-pin", str(pin_trace)],
        stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                assert proc.poll() is None, f"serve exited: {proc.stderr.read()}"
                time.sleep(0.1)
        body = json.dumps({"model": "qwen3_moe_q32.q8_0", "prompt": PROMPT, "max_tokens": 8,
                           "temperature": 0}).encode()
        req = urllib.request.Request(url + "/v1/completions", body,
                                     {"content-type": "application/json"})
        got = json.load(urllib.request.urlopen(req, timeout=120))
        mapped = strata.LLM(str(GGUF), expert_cache="off")
        params = strata.SamplingParams(temperature=0, max_tokens=8)
        (want,) = mapped.generate(PROMPT, params)
        assert got["choices"][0]["text"] == want.outputs[0].text
        metrics = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
        hits = re.search(r'strata_expert_cache_lookups_total\{result="hit"\} (\d+)', metrics)
        assert hits and int(hits[1]) > 0, metrics
        assert re.search(r"strata_expert_cache_pinned_experts [1-9]", metrics), metrics
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    assert code == 0, f"serve exited with {code} after SIGTERM"


@pytest.mark.parametrize("kwargs, message", [
    ({"expert_cache": "lots"}, "expert_cache lots: a size, auto or off"),
    ({"expert_cache": 0}, "expert_cache 0: give a size, or 'off'"),
    ({"expert_cache": "4MiB", "expert_cache_rule": "mru"}, "expert_cache_rule mru"),
    ({"expert_cache": "4MiB", "device": "gpu"}, "expert_cache applies with device='cpu' or 'hybrid'"),
    ({"expert_cache": "off", "expert_cache_pin": "x.trace"}, "expert_cache='off' turns off"),
    ({"expert_cache": "4MiB", "expert_cache_pin": "/no/such.trace"}, "/no/such.trace"),
])
def test_bad_settings_are_value_errors(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        strata.LLM(str(GGUF), **kwargs)


def test_the_strata_tiny_moe_checkpoint_is_refused_by_name(model_dir):
    # Safetensors experts are copied into memory at load: nothing to read from a file.
    with pytest.raises(ValueError, match="the SSD tier reads the routed experts from the one file a model maps"):
        strata.LLM(str(model_dir), expert_cache="4MiB")
