"""strata.LLM against the `strata` command line on the shipped model, and
`python -m strata serve` against the HTTP API."""

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

import strata

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
MAX_TOKENS = 24


def cli(strata_bin, model_dir, *args):
    r = subprocess.run(
        [strata_bin, "generate", "--model", str(model_dir), "--temperature", "0",
         "--max-tokens", str(MAX_TOKENS), *args],
        capture_output=True, text=True, check=True, timeout=300)
    # generate ends its text with one newline of its own.
    return r.stdout.removesuffix("\n")


def test_greedy_generate_equals_cli(llm, strata_bin, model_dir):
    outs = llm.generate(PROMPTS, strata.SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    assert [o.prompt for o in outs] == PROMPTS
    for prompt, o in zip(PROMPTS, outs):
        want = cli(strata_bin, model_dir, "--prompt", prompt)
        (c,) = o.outputs
        assert c.text == want, f"prompt {prompt!r}"
        assert o.prompt_token_ids == llm.encode(prompt)
        assert c.finish_reason in ("stop", "length")
        if c.finish_reason == "length":
            assert len(c.token_ids) == MAX_TOKENS


def test_greedy_chat_equals_cli(llm, strata_bin, model_dir):
    params = strata.SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    (o,) = llm.chat([{"role": "user", "content": "How do I sort a list in Python?"}], params)
    want = cli(strata_bin, model_dir, "--chat", "How do I sort a list in Python?")
    assert o.outputs[0].text == want
    # A list of conversations gives one output each.
    two = llm.chat([[{"role": "user", "content": "Hi"}], [{"role": "user", "content": "Bye"}]],
                   params)
    assert len(two) == 2


def test_one_prompt_token_ids_and_stop(llm):
    params = strata.SamplingParams(temperature=0, max_tokens=8)
    (a,) = llm.generate("Once upon a time", params)
    (b,) = llm.generate(llm.encode("Once upon a time"), params)
    assert a.outputs[0].token_ids == b.outputs[0].token_ids and b.prompt is None
    assert a.outputs[0].finish_reason == "length" and len(a.outputs[0].token_ids) == 8
    # A stop string that the greedy text contains ends it there, with reason "stop".
    text = a.outputs[0].text
    stop = text.strip().split()[0] if text.strip() else None
    if stop:
        (c,) = llm.generate("Once upon a time", strata.SamplingParams(
            temperature=0, max_tokens=8, stop=[stop]))
        assert c.outputs[0].finish_reason == "stop" and stop not in c.outputs[0].text


def test_many_prompts_sharing_a_prefix_equal_each_alone(llm):
    """More prompts than the batch holds, sharing a long prefix: continuous batching and
    the prefix cache give each the answer it gets alone."""
    prefix = "The harbour log, kept by the captain on the night of the storm, says: " * 6
    prompts = [f"{prefix}Entry {i}:" for i in range(20)]
    params = strata.SamplingParams(temperature=0, max_tokens=6)
    together = llm.generate(prompts, params)
    for prompt, o in zip(prompts, together):
        (alone,) = llm.generate(prompt, params)
        assert o.outputs[0].token_ids == alone.outputs[0].token_ids, prompt
        assert o.outputs[0].text == alone.outputs[0].text


def test_bad_arguments_raise_clear_errors(llm, model_dir):
    with pytest.raises(ValueError, match="does not exist"):
        strata.LLM(str(model_dir / "missing"))
    with pytest.raises(ValueError, match="weights: expected 'bf16', 'int8' or 'int4', got 'fp8'"):
        strata.LLM(str(model_dir), weights="fp8")
    with pytest.raises(ValueError, match="max_tokens must be at least 1"):
        strata.SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="prompt 0: .*temperature"):
        llm.generate("Hi", strata.SamplingParams(temperature=-1.0))
    with pytest.raises(ValueError, match="max_batch must be at least 1"):
        strata.LLM(str(model_dir), max_batch=0)
    with pytest.raises(ValueError, match="ctx_size must be between 2 and the model's context"):
        strata.LLM(str(model_dir), ctx_size=1)
    with pytest.raises(RuntimeError, match="not enough memory.*lower ctx_size, max_batch or "
                       "prefix_cache_mb"):
        strata.LLM(str(model_dir), prefix_cache_mb=1 << 30)
    with pytest.raises(TypeError, match=r"prompts\[1\]: expected a string or a list of token ids"):
        llm.generate(["Hi", 3.5])
    with pytest.raises(TypeError, match=r"messages\[0\]\[0\]: expected a dict"):
        llm.chat([{"role": "user"}])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_python_m_strata_serve(llm, model_dir):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "strata", "serve", "--model", str(model_dir), "--port", str(port),
         "--max-batch", "4", "--ctx-size", "256"],
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
        body = json.dumps({"model": "strata-tiny-moe", "prompt": PROMPTS[0],
                           "max_tokens": 12, "temperature": 0}).encode()
        req = urllib.request.Request(url + "/v1/completions", body,
                                     {"content-type": "application/json"})
        got = json.load(urllib.request.urlopen(req, timeout=120))
        (want,) = llm.generate(PROMPTS[0], strata.SamplingParams(temperature=0, max_tokens=12))
        assert got["choices"][0]["text"] == want.outputs[0].text
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    assert code == 0, f"serve exited with {code} after SIGTERM"
