"""The page's accelerator panel on `strata serve --device hybrid`: each device's busy
share and the expert cache's counters while a request runs, the experts the device holds
outlined in the heat map, and expert deferral counted. Needs an accelerator (Mesa's
lavapipe does); required when STRATA_GPU_TESTS=1, as CI sets."""

import os
import re
import time

import pytest
from playwright.sync_api import expect

from conftest import Server, stop_if_running

TIMEOUT_MS = 60_000


def hybrid_server(log_dir, policy_args, name, **server):
    """A `--device hybrid` server for a module's tests, stopped cleanly after them."""
    s = Server(os.environ["STRATA_BIN"], log_dir,
               extra=["--device", "hybrid", *policy_args], name=name, **server)
    try:
        s.start()
    except RuntimeError as e:
        log = (log_dir / f"{name}.log").read_text(errors="replace")[-2000:]
        if os.environ.get("STRATA_GPU_TESTS") == "1":
            raise AssertionError(f"{e}\n{log}")
        pytest.skip(f"no accelerator for --device hybrid (STRATA_GPU_TESTS unset): {log}")
    yield s
    if s.proc.poll() is None:
        assert s.stop() == 0


@pytest.fixture(scope="module")
def hybrid(log_dir):
    # 4 MiB holds 21 of the shipped model's expert slots (192 KiB each in BF16), two of
    # them staging: the cache hits and misses, and every layer's 32 experts compete.
    yield from hybrid_server(log_dir, ["--policy", "gpu-lru", "--vram-budget", "4MiB"],
                             "serve-hybrid")


@pytest.fixture(scope="module")
def deferring(log_dir):
    yield from hybrid_server(log_dir, ["--policy", "ktransformers", "--defer", "1"], "serve-defer")


def table_value(page, name):
    """The hybrid table's value for the row named `name`."""
    for row in page.locator("#hybrid-table tr").all():
        cells = row.locator("td").all_inner_texts()
        if cells and cells[0] == name:
            return cells[1]
    raise AssertionError(f"no row {name!r} in {page.locator('#hybrid-table').inner_text()}")


def send(page, max_tokens):
    page.set_checked("#ignore_eos", True)
    page.fill("#max_tokens", str(max_tokens))
    page.fill("#prompt", "Tell me about the sea.")
    page.click("#send")


def test_accelerator_panel_shows_the_executors_counters(browser, hybrid, log_dir):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(hybrid.url + "/")
    expect(page.locator("#conn")).to_have_attribute("data-state", "live", timeout=TIMEOUT_MS)
    expect(page.locator("#hybrid-live")).to_be_visible(timeout=TIMEOUT_MS)
    expect(page.locator("#hybrid-none")).to_be_hidden()
    send(page, 200)
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
    # The experts the device cache holds are outlined in the heat map and counted. The
    # page redraws twice a second, so both are read in one evaluation (one redraw).
    resident, counted = page.evaluate(
        """() => {
            const row = [...document.querySelectorAll('#hybrid-table tr')]
                .map(r => [...r.querySelectorAll('td')].map(c => c.innerText))
                .find(c => c[0] === 'resident experts');
            return [document.querySelector('#heat').dataset.resident, row ? row[1] : null];
        }"""
    )
    resident = int(resident)
    assert 1 <= resident <= 19, resident
    assert counted is not None and counted.startswith(f"{resident} "), (resident, counted, table)
    page.screenshot(path=str(log_dir / "07-hybrid.png"), full_page=True)
    stop_if_running(page)
    expect(page.locator("#send")).to_be_enabled(timeout=TIMEOUT_MS)
    page.close()


def test_deferred_experts_are_counted(browser, deferring, log_dir):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(deferring.url + "/")
    expect(page.locator("#hybrid-live")).to_be_visible(timeout=TIMEOUT_MS)
    send(page, 24)
    expect(page.locator("#send")).to_be_enabled(timeout=TIMEOUT_MS)
    # Decode steps defer one expert per token; the counter reaches the page within a tick.
    deadline = time.monotonic() + 10
    deferred = 0
    while time.monotonic() < deadline and not deferred:
        deferred = int(table_value(page, "deferred expert tasks").split()[0])
        time.sleep(0.2)
    assert deferred > 0, page.locator("#hybrid-table").inner_text()
    # Nothing is resident: KTransformers keeps the routed experts on the CPU.
    assert page.locator("#heat").get_attribute("data-resident") == "0"
    page.screenshot(path=str(log_dir / "08-deferral.png"), full_page=True)
    page.close()
