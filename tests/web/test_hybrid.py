"""The page's accelerator panel on `strata serve --device hybrid`: each device's busy
share and the expert cache's counters while a request runs. Needs an accelerator (Mesa's
lavapipe does); required when STRATA_GPU_TESTS=1, as CI sets."""

import os
import re
import time

import pytest
from playwright.sync_api import expect

from conftest import Server

TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def hybrid(log_dir):
    s = Server(os.environ["STRATA_BIN"], log_dir,
               extra=["--device", "hybrid", "--policy", "gpu-lru", "--vram-budget", "1MiB"],
               name="serve-hybrid")
    try:
        s.start()
    except RuntimeError as e:
        log = (log_dir / "serve-hybrid.log").read_text(errors="replace")[-2000:]
        if os.environ.get("STRATA_GPU_TESTS") == "1":
            raise AssertionError(f"{e}\n{log}")
        pytest.skip(f"no accelerator for --device hybrid (STRATA_GPU_TESTS unset): {log}")
    yield s
    if s.proc.poll() is None:
        assert s.stop() == 0


def test_accelerator_panel_shows_the_executors_counters(browser, hybrid, log_dir):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(hybrid.url + "/")
    expect(page.locator("#conn")).to_have_attribute("data-state", "live", timeout=TIMEOUT_MS)
    expect(page.locator("#hybrid-live")).to_be_visible(timeout=TIMEOUT_MS)
    expect(page.locator("#hybrid-none")).to_be_hidden()
    page.set_checked("#ignore_eos", True)
    page.fill("#max_tokens", "200")
    page.fill("#prompt", "Tell me about the sea.")
    page.click("#send")
    deadline = time.monotonic() + 60
    busy = None
    while time.monotonic() < deadline:
        bars = page.locator("#busy .bar").all_inner_texts()
        shares = [int(m.group(1)) for b in bars if (m := re.search(r"(\d+)%\s*$", b))]
        if page.locator(".msg.assistant.streaming").count() and any(shares):
            busy = bars
            break
        time.sleep(0.1)
    assert busy, "no device was busy while the request ran"
    table = page.locator("#hybrid-table").inner_text()
    assert "cache hits / misses" in table and "uploaded" in table, table
    page.screenshot(path=str(log_dir / "07-hybrid.png"), full_page=True)
    page.click("#halt")
    expect(page.locator("#send")).to_be_enabled(timeout=TIMEOUT_MS)
    page.close()
