"""strata.LLM(expert_cache=...): a GGUF's routed experts read from the file into a DRAM cache
(the SSD tier, as `strata generate --expert-cache` runs it), its greedy output equal to the
model run from memory, below the accelerator's expert cache too (device='hybrid', three
tiers), its statistics (`LLM.expert_cache_stats()`), and the errors of its keywords."""

import re
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


@pytest.mark.parametrize("kwargs, message", [
    ({"expert_cache": "lots"}, "expert_cache lots: a size, auto or off"),
    ({"expert_cache": 0}, "expert_cache 0: give a size, or 'off'"),
    ({"expert_cache": "4MiB", "expert_cache_rule": "mru"}, "expert_cache_rule mru"),
    ({"expert_cache": "4MiB", "device": "gpu"}, "expert_cache applies with device='cpu' or 'hybrid'"),
])
def test_bad_settings_are_value_errors(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        strata.LLM(str(GGUF), **kwargs)


def test_the_strata_tiny_moe_checkpoint_is_refused_by_name(model_dir):
    # Safetensors experts are copied into memory at load: nothing to read from a file.
    with pytest.raises(ValueError, match="the SSD tier reads the routed experts from the one file a model maps"):
        strata.LLM(str(model_dir), expert_cache="4MiB")
