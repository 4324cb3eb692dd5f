"""strata.LLM(device='hybrid', policy=..., profile=...) against `strata generate --device
hybrid` on the shipped model, its statistics (`LLM.stats()`), strata.LLM(device='gpu')
against `strata generate --device gpu`, and the keyword checks of device and policy.

The hybrid runs need an accelerator (Mesa's lavapipe will do): where `strata devices` finds
none they are skipped with the reason, unless STRATA_GPU_TESTS=1 (as CI sets it), which
makes a missing accelerator a failure."""

import json
import re
import subprocess

import pytest

import strata

PROMPT = "The capital of France is"
MAX_TOKENS = 24
# Room for about 20 of the shipped model's 32 experts x 6 layers (192 KiB each in BF16): the
# policies evict and stage.
BUDGET = "4MiB"


@pytest.fixture(scope="module")
def trace(strata_bin, model_dir, tmp_path_factory):
    """A routing trace of PROMPT with hidden states (`strata trace`), as `--profile` takes."""
    d = tmp_path_factory.mktemp("trace")
    (d / "prompts.txt").write_text(PROMPT + "\n")
    out = d / "prompt.trace"
    subprocess.run([strata_bin, "trace", "--model", str(model_dir), "--prompts",
                    str(d / "prompts.txt"), "--out", str(out), "--decode", str(MAX_TOKENS)],
                   capture_output=True, text=True, check=True, timeout=300)
    return out


def cli_hybrid(strata_bin, model_dir, policy, *extra):
    """`strata generate --device hybrid`'s text and the pairs its statistics line counts."""
    r = subprocess.run(
        [strata_bin, "generate", "--model", str(model_dir), "--temperature", "0",
         "--max-tokens", str(MAX_TOKENS), "--device", "hybrid", "--policy", policy,
         "--vram-budget", BUDGET, "--prompt", PROMPT, *extra],
        capture_output=True, text=True, check=True, timeout=300)
    # The executor's statistics say the policy ran.
    assert f"policy {policy}" in r.stderr, r.stderr
    pairs = re.search(r"pairs gpu (\d+) / cpu (\d+)", r.stderr)
    assert pairs, r.stderr
    # generate ends its text with one newline of its own.
    return r.stdout.removesuffix("\n"), tuple(map(int, pairs.groups()))


def greedy(llm):
    (o,) = llm.generate(PROMPT, strata.SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    return o.outputs[0].text


@pytest.mark.parametrize("policy", ["smoe", "gpu-lru", "hybrimoe"])
def test_hybrid_greedy_equals_cli(accelerator, strata_bin, model_dir, policy):
    # A fresh executor per policy, one prompt: the same expert cache and decisions as the
    # command line's run.
    llm = strata.LLM(str(model_dir), device="hybrid", policy=policy, vram_budget=BUDGET)
    text, (gpu_pairs, cpu_pairs) = cli_hybrid(strata_bin, model_dir, policy)
    assert greedy(llm) == text
    # The experts really ran on the accelerator, as many as on the command line.
    s = llm.stats()
    assert s["policy"] == policy
    assert s["gpu_pairs"] > 0 and s["gpu_experts"] > 0 and s["uploads"] > 0, s
    assert s["gpu_time_s"] > 0 and s["upload_bytes"] > 0, s
    assert (s["gpu_pairs"], s["cpu_pairs"]) == (gpu_pairs, cpu_pairs), s


def test_stats_add_up_over_calls_and_are_none_on_the_cpu(accelerator, model_dir, llm):
    assert llm.stats() is None
    hybrid = strata.LLM(str(model_dir), device="hybrid", vram_budget=BUDGET)
    assert hybrid.stats()["steps"] == 0
    greedy(hybrid)
    first = hybrid.stats()
    greedy(hybrid)
    second = hybrid.stats()
    assert second["steps"] > first["steps"] > 0
    assert second["gpu_pairs"] > first["gpu_pairs"] > 0


@pytest.mark.parametrize("policy", ["fiddler", "smoe"])
def test_profile_equals_cli(accelerator, strata_bin, model_dir, trace, policy):
    llm = strata.LLM(str(model_dir), device="hybrid", policy=policy, vram_budget=BUDGET,
                     profile=str(trace))
    text, pairs = cli_hybrid(strata_bin, model_dir, policy, "--profile", str(trace))
    assert greedy(llm) == text
    s = llm.stats()
    assert (s["gpu_pairs"], s["cpu_pairs"]) == pairs, s


def test_profile_pins_the_experts_the_prompt_uses(accelerator, model_dir, trace):
    # Fiddler pins its cache by the profile's counts (else in layer order): with the
    # prompt's own trace, more of its (token, expert) pairs find their expert on the GPU.
    def gpu_share(**profile):
        llm = strata.LLM(str(model_dir), device="hybrid", policy="fiddler", vram_budget=BUDGET,
                         **profile)
        greedy(llm)
        s = llm.stats()
        return s["gpu_pairs"] / (s["gpu_pairs"] + s["cpu_pairs"])

    assert gpu_share(profile=str(trace)) > gpu_share()


def test_profile_trains_smoes_predictors(accelerator, model_dir, trace):
    # The trace holds hidden states: SMoE's token-wise predictors prefetch in decode, which
    # it does not without them.
    def uploads(**profile):
        llm = strata.LLM(str(model_dir), device="hybrid", policy="smoe", vram_budget=BUDGET,
                         **profile)
        greedy(llm)
        return llm.stats()["uploads"]

    assert uploads(profile=str(trace)) > uploads()


def test_hybrid_budget_in_bytes(accelerator, model_dir):
    llm = strata.LLM(str(model_dir), device="hybrid", policy="ktransformers", defer=1,
                     vram_budget=4 << 20)
    (o,) = llm.generate(PROMPT, strata.SamplingParams(temperature=0, max_tokens=4))
    assert len(o.outputs[0].token_ids) == 4


def test_gpu_greedy_equals_cli_alone_and_batched(accelerator, strata_bin, model_dir):
    # The whole model on the accelerator under the scheduler: three prompts per forward
    # pass give each prompt's own `strata generate --device gpu` text.
    prompts = [PROMPT, PROMPT + " a city", "Once upon a time"]
    want = []
    for p in prompts:
        r = subprocess.run(
            [strata_bin, "generate", "--model", str(model_dir), "--temperature", "0",
             "--max-tokens", "8", "--device", "gpu", "--prompt", p],
            capture_output=True, text=True, check=True, timeout=300)
        assert "device: gpu" in r.stderr, r.stderr
        want.append(r.stdout.removesuffix("\n"))
    llm = strata.LLM(str(model_dir), device="gpu", vram_budget="256MiB", max_batch=3,
                     ctx_size=64)
    outs = llm.generate(prompts, strata.SamplingParams(temperature=0, max_tokens=8))
    assert [o.outputs[0].text for o in outs] == want
    assert llm.stats() is None


@pytest.mark.parametrize("kwargs, error", [
    (dict(device="hybrid", policy="lru"), r"policy: unknown policy `lru`, expected one of "
                                          r"gpu-lru, fiddler, ktransformers, hybrimoe, smoe"),
    (dict(policy="smoe"), r"policy applies only with device='hybrid'"),
    (dict(vram_budget="64MiB"), r"vram_budget applies only with device='hybrid'"),
    (dict(profile="x.trace"), r"profile applies only with device='hybrid'"),
    (dict(device="hybrid", vram_budget="lots"), r"vram_budget: "),
    (dict(device="hybrid", hardware="no-such-machine"), r"hardware: .*no-such-machine"),
    (dict(device="gpu", policy="smoe"), r"policy applies only with device='hybrid'"),
    (dict(device="tpu"), r"device: expected 'cpu', 'hybrid' or 'gpu', got 'tpu'"),
])
def test_device_and_policy_keywords_are_checked(model_dir, kwargs, error):
    with pytest.raises(ValueError, match=error):
        strata.LLM(str(model_dir), **kwargs)


def test_defer_only_with_ktransformers(model_dir):
    # Checked before the model loads (PolicyOptions::check_policy, as the command line).
    with pytest.raises(ValueError, match=r"deferral \(defer 2\) applies only with policy "
                                         r"ktransformers, not smoe"):
        strata.LLM(str(model_dir), device="hybrid", policy="smoe", defer=2)


def test_profile_errors_name_the_trace(model_dir, tmp_path):
    # Read before any accelerator is opened.
    missing = tmp_path / "missing.trace"
    with pytest.raises(ValueError, match=re.escape(str(missing))):
        strata.LLM(str(model_dir), device="hybrid", policy="fiddler", profile=str(missing))
