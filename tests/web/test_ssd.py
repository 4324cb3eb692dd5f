"""The page's expert cache panel on `strata serve --expert-cache`: a GGUF's routed experts read
from the file into a DRAM cache (the SSD tier), its hits, reads and guesses counted after a
request ran; the accelerator panel stays on its CPU-only note. Under `--device hybrid` (three
tiers, needs an accelerator as test_hybrid.py's servers do) both panels show, and the cache's
counts what the accelerator took from it."""

import json
import os
import time
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import expect

from conftest import Server
from test_hybrid import hybrid_server

TIMEOUT_MS = 60_000
GGUF = Path(__file__).resolve().parents[2] / "tests" / "fixtures-gguf" / "qwen3_moe_q32.q8_0.gguf"


@pytest.fixture(scope="module")
def cached(log_dir):
    # 96 KiB: four of the fixture's 24 KiB experts, two tokens' worth per layer of 6 experts,
    # so the cache misses and evicts all along.
    s = Server(os.environ["STRATA_BIN"], log_dir,
               extra=["--model", str(GGUF), "--expert-cache", "96K"], name="serve-ssd",
               ctx_size=128)  # the fixture's context
    s.start()
    yield s
    if s.proc.poll() is None:
        assert s.stop() == 0


@pytest.fixture(scope="module")
def three_tiers(log_dir):
    # The device cache (96 KiB: four slots of the fixture's experts, two of them staging)
    # above the DRAM cache (four page-aligned slots) above the file.
    yield from hybrid_server(
        log_dir, ["--model", str(GGUF), "--policy", "hybrimoe", "--vram-budget", "96K",
                  "--expert-cache", "96K"], "serve-three-tiers", ctx_size=128)


def complete(server, max_tokens, timeout):
    """`max_tokens` tokens of a plain completion, outside the page (the fixture has no chat
    template)."""
    body = json.dumps({"model": GGUF.stem, "prompt": "Tell me about the sea.",
                       "max_tokens": max_tokens, "ignore_eos": True}).encode()
    req = urllib.request.Request(server.url + "/v1/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        assert json.load(r)["usage"]["completion_tokens"] == max_tokens


def ssd_rows(page):
    rows = {}
    for row in page.locator("#ssd-table tr").all():
        cells = row.locator("td").all_inner_texts()
        if len(cells) == 2:
            rows[cells[0]] = cells[1]
    return rows


def test_expert_cache_panel_counts_hits_and_reads(browser, cached, log_dir):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(cached.url + "/")
    expect(page.locator("#conn")).to_have_attribute("data-state", "live", timeout=TIMEOUT_MS)
    expect(page.locator("#ssd")).to_be_visible(timeout=TIMEOUT_MS)
    expect(page.locator("#hybrid-none")).to_be_visible()
    expect(page.locator("#hybrid-live")).to_be_hidden()
    complete(cached, 48, timeout=60)
    # The counters reach the page within a tick of the request's end.
    deadline = time.monotonic() + 10
    rows = {}
    while time.monotonic() < deadline:
        rows = ssd_rows(page)
        counts = rows.get("hits / in flight / misses", "0 / 0 / 0").split(" (")[0]
        hits, _, misses = (int(n) for n in counts.split(" / "))
        if hits > 0 and misses > 0:
            break
        time.sleep(0.2)
    assert hits > 0 and misses > 0, rows
    read = float(rows["read from the file"].split()[0])
    assert read > 0, rows
    assert "% of the experts used were guessed" in rows["fetched ahead"], rows
    assert rows["cache"].startswith("0.1 MiB") or rows["cache"].startswith("0.0 MiB"), rows
    page.screenshot(path=str(log_dir / "09-expert-cache.png"), full_page=True)
    page.close()


def test_three_tiers_show_both_caches(browser, three_tiers):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(three_tiers.url + "/")
    expect(page.locator("#conn")).to_have_attribute("data-state", "live", timeout=TIMEOUT_MS)
    complete(three_tiers, 24, timeout=120)
    expect(page.locator("#ssd")).to_be_visible(timeout=TIMEOUT_MS)
    expect(page.locator("#hybrid-live")).to_be_visible(timeout=TIMEOUT_MS)
    deadline = time.monotonic() + 10
    rows = {}
    while time.monotonic() < deadline and "copied to the accelerator" not in rows:
        rows = ssd_rows(page)
        time.sleep(0.2)
    copied = rows.get("copied to the accelerator", "0")
    assert int(copied.split()[0]) > 0 and "% from the cache" in copied, rows
    # The hybrid table keeps to the executor's counters.
    hybrid = page.locator("#hybrid-table").inner_text()
    assert "expert_cache" not in hybrid, hybrid
    page.close()
