"""The official `openai` client against `strata serve`."""

import openai
import pytest

MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]


def test_models(client, model):
    ids = [m.id for m in client.models.list().data]
    assert ids == [model]


def test_chat_non_streaming_and_streaming_agree(client, model):
    full = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=16, temperature=0)
    choice = full.choices[0]
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    usage = full.usage
    assert 1 <= usage.completion_tokens <= 16
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens

    stream = client.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, streamed_usage = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            streamed_usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    assert text == choice.message.content
    assert finish == choice.finish_reason
    assert streamed_usage.completion_tokens == usage.completion_tokens


def test_completions(client, model):
    r = client.completions.create(model=model, prompt="Once upon a time", max_tokens=12, temperature=0)
    assert r.object == "text_completion"
    assert r.choices[0].text
    assert r.usage.completion_tokens <= 12
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=model, prompt="Once upon a time", max_tokens=12, temperature=0, stream=True
        )
        if c.choices
    )
    assert streamed == r.choices[0].text


def test_chat_logprobs(client, model):
    r = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for tok in content:
        assert tok.logprob <= 0
        assert 1 <= len(tok.top_logprobs) <= 3
        # Greedy picks the most likely token.
        assert abs(tok.top_logprobs[0].logprob - tok.logprob) < 1e-4
        assert tok.top_logprobs[0].token == tok.token


def test_completion_logprobs(client, model):
    r = client.completions.create(model=model, prompt="The sea", max_tokens=6, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == r.usage.completion_tokens
    assert all(len(t) <= 2 for t in lp.top_logprobs)


def test_stop_strings(client, model):
    base = client.completions.create(model=model, prompt="Once upon a time", max_tokens=24, temperature=0)
    text = base.choices[0].text
    words = text.split()
    assert len(words) >= 3, text
    stop = words[2]
    cut = client.completions.create(
        model=model, prompt="Once upon a time", max_tokens=24, temperature=0, stop=[stop, "\u2603"]
    )
    assert cut.choices[0].text == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_seed_reproducibility(client, model):
    def run(seed):
        r = client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=24, temperature=1.0, top_p=0.95, seed=seed
        )
        return r.choices[0].message.content

    assert run(1234) == run(1234)
    assert len({run(s) for s in (1, 2, 3, 4)}) > 1


def test_n_choices(client, model):
    r = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8, n=3, seed=5)
    assert [c.index for c in r.choices] == [0, 1, 2]


def test_client_errors(client, model):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "word " * 2000}], max_tokens=4
        )
    assert e.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=MESSAGES, temperature=-1)
    assert e.value.body["param"] == "temperature"
