"""The shared prefix cache through the official `openai` client: a second request with the
same long system prompt reports `usage.prompt_tokens_details.cached_tokens`, streamed and
not, and gets the same greedy answer as without the cache."""

import re
import urllib.request
import uuid


def system_prompt() -> str:
    # A fresh prompt per test run: nothing of it is cached before the first request.
    tag = uuid.uuid4().hex
    return f"Session {tag}. You are a careful assistant who answers briefly. " + (
        "Keep to the facts about the sea, the wind and the ships that sail on them. " * 8
    )


def chat(client, model, system, user, **kw):
    return client.chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
        max_tokens=8,
        temperature=0,
        **kw,
    )


def cached(usage) -> int:
    assert usage.prompt_tokens_details is not None, usage
    return usage.prompt_tokens_details.cached_tokens


def hit_tokens(base_url) -> int:
    text = urllib.request.urlopen(f"{base_url}/metrics", timeout=10).read().decode()
    return int(re.search(r"^strata_prefix_cache_hit_tokens_total (\d+)$", text, re.M).group(1))


def test_a_shared_system_prompt_is_served_from_the_cache(client, model, base_url):
    system = system_prompt()
    hits_before = hit_tokens(base_url)
    first = chat(client, model, system, "What is a tide?")
    # At most the opening it shares with every session prompt (template, "Session").
    assert cached(first.usage) < 16, first.usage
    second = chat(client, model, system, "Why is the sea salty?")
    n = cached(second.usage)
    # The system prompt (well over 100 tokens) comes from the cache, and the template's
    # tokens after it up to where the questions differ.
    assert 100 <= n < second.usage.prompt_tokens, second.usage
    # The same request again: everything but its last token is cached (that one is
    # computed for the first logits), and the greedy answer is the one computed from
    # scratch.
    again = chat(client, model, system, "What is a tide?")
    assert cached(again.usage) == first.usage.prompt_tokens - 1
    assert again.choices[0].message.content == first.choices[0].message.content
    assert hit_tokens(base_url) - hits_before >= n + cached(again.usage)


def test_cached_tokens_in_the_streamed_usage_chunk(client, model):
    system = system_prompt()
    chat(client, model, system, "Name a fish.")
    stream = chat(
        client, model, system, "Name a bird.", stream=True, stream_options={"include_usage": True}
    )
    usage = [c.usage for c in stream if c.usage is not None]
    assert len(usage) == 1
    assert cached(usage[0]) >= 100, usage[0]
