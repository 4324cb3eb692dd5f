"""strata.LLM(device='hybrid', policy=...) against `strata generate --device hybrid` on the
shipped model, and the keyword checks of device and policy.

The hybrid runs need an accelerator (Mesa's lavapipe will do): where `strata devices` finds
none they are skipped with the reason, unless STRATA_GPU_TESTS=1 (as CI sets it), which
makes a missing accelerator a failure."""

import json
import os
import subprocess

import pytest

import strata

PROMPT = "The capital of France is"
MAX_TOKENS = 24
# Room for about 20 of the shipped model's 32 experts x 6 layers (192 KiB each in BF16): the
# policies evict and stage.
BUDGET = "4MiB"


@pytest.fixture(scope="module")
def accelerator(strata_bin):
    """Skips (or, with STRATA_GPU_TESTS=1, fails) where no accelerator can be opened."""
    r = subprocess.run([strata_bin, "devices", "--json"], capture_output=True, text=True,
                       check=True, timeout=120)
    found = json.loads(r.stdout)
    if not found["devices"]:
        why = f"no accelerator for device='hybrid': {found['error']}"
        if os.environ.get("STRATA_GPU_TESTS") == "1":
            pytest.fail(f"STRATA_GPU_TESTS=1 but {why}")
        pytest.skip(f"SKIPPED: {why} (STRATA_GPU_TESTS=1 makes this a failure)")


def cli_hybrid(strata_bin, model_dir, policy):
    r = subprocess.run(
        [strata_bin, "generate", "--model", str(model_dir), "--temperature", "0",
         "--max-tokens", str(MAX_TOKENS), "--device", "hybrid", "--policy", policy,
         "--vram-budget", BUDGET, "--prompt", PROMPT],
        capture_output=True, text=True, check=True, timeout=300)
    # The executor's statistics say the policy ran.
    assert f"policy {policy}" in r.stderr, r.stderr
    # generate ends its text with one newline of its own.
    return r.stdout.removesuffix("\n")


@pytest.mark.parametrize("policy", ["smoe", "gpu-lru", "hybrimoe"])
def test_hybrid_greedy_equals_cli(accelerator, strata_bin, model_dir, policy):
    # A fresh executor per policy, one prompt: the same expert cache and decisions as the
    # command line's run.
    llm = strata.LLM(str(model_dir), device="hybrid", policy=policy, vram_budget=BUDGET)
    (o,) = llm.generate(PROMPT, strata.SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    assert o.outputs[0].text == cli_hybrid(strata_bin, model_dir, policy)


def test_hybrid_budget_in_bytes(accelerator, model_dir):
    llm = strata.LLM(str(model_dir), device="hybrid", policy="ktransformers", defer=1,
                     vram_budget=4 << 20)
    (o,) = llm.generate(PROMPT, strata.SamplingParams(temperature=0, max_tokens=4))
    assert len(o.outputs[0].token_ids) == 4


@pytest.mark.parametrize("kwargs, error", [
    (dict(device="hybrid", policy="lru"), r"policy: unknown policy `lru`, expected one of "
                                          r"gpu-lru, fiddler, ktransformers, hybrimoe, smoe"),
    (dict(policy="smoe"), r"policy applies only with device='hybrid'"),
    (dict(vram_budget="64MiB"), r"vram_budget applies only with device='hybrid'"),
    (dict(device="hybrid", vram_budget="lots"), r"vram_budget: "),
    (dict(device="hybrid", hardware="no-such-machine"), r"hardware: .*no-such-machine"),
    (dict(device="gpu"), r"one sequence at a time and is not under the scheduler yet"),
    (dict(device="tpu"), r"device: expected 'cpu', 'hybrid' or 'gpu', got 'tpu'"),
])
def test_device_and_policy_keywords_are_checked(model_dir, kwargs, error):
    with pytest.raises(ValueError, match=error):
        strata.LLM(str(model_dir), **kwargs)


def test_defer_only_with_ktransformers(model_dir):
    # Checked against the model before any accelerator is opened.
    with pytest.raises(ValueError, match=r"deferral \(defer 2\) applies only with policy "
                                         r"ktransformers, not smoe"):
        strata.LLM(str(model_dir), device="hybrid", policy="smoe", defer=2)
