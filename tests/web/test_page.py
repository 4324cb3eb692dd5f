"""The page at `/` in headless Chromium: it loads, a chat reply streams, the expert view
updates while a request runs, a rejected request shows the server's message, and the page
reconnects after the server restarts. Screenshots go to STRATA_LOG_DIR."""

import json
import time
import urllib.error
import urllib.request

from playwright.sync_api import Page, expect

from conftest import MODEL, stop_if_running

TIMEOUT_MS = 60_000


def shot(page: Page, log_dir, name: str) -> None:
    page.screenshot(path=str(log_dir / f"{name}.png"), full_page=True)


def ask(page: Page, text: str, max_tokens: int, temperature: float = 0.0,
        ignore_eos: bool = False) -> None:
    page.set_checked("#ignore_eos", ignore_eos)
    page.fill("#max_tokens", str(max_tokens))
    page.fill("#temperature", str(temperature))
    page.fill("#prompt", text)
    page.click("#send")


def wait_idle(page: Page) -> None:
    expect(page.locator("#send")).to_be_enabled(timeout=TIMEOUT_MS)


def test_page_loads(page: Page, server, log_dir):
    expect(page).to_have_title("Strata")
    expect(page.locator("#conn")).to_have_attribute("data-state", "live", timeout=TIMEOUT_MS)
    expect(page.locator("#model")).to_have_text(MODEL)
    # Compiled into the binary: the page asks nothing of any other host.
    for asset in ("/assets/app.js", "/assets/style.css"):
        with urllib.request.urlopen(server.url + asset) as r:
            assert r.status == 200
            assert b"http://" not in r.read().replace(b"http://www.w3.org", b"")
    shot(page, log_dir, "01-loaded")


def test_chat_streams_a_reply(page: Page, log_dir):
    # Every change of the reply's text, as the browser saw it.
    page.evaluate("""() => {
        window.__pieces = [];
        new MutationObserver(() => {
            const m = document.querySelector('.msg.assistant:last-child');
            if (m) window.__pieces.push(m.textContent.length);
        }).observe(document.getElementById('messages'),
                   {childList: true, subtree: true, characterData: true});
    }""")
    page.fill("#system", "You are a helpful assistant.")
    # Long enough to span several network reads even when the tiny model decodes a token in
    # about 2 ms (64 tokens once arrived in a single read, so in one piece); short enough to
    # leave the next test's request room in the 1024-token context (the page sends the
    # whole conversation).
    ask(page, "Tell me about the sea.", max_tokens=300, ignore_eos=True)
    wait_idle(page)
    reply = page.locator(".msg.assistant").last
    expect(reply).not_to_be_empty()
    pieces = page.evaluate("window.__pieces")
    distinct = sorted(set(n for n in pieces if n > 0))
    assert len(distinct) >= 3, f"the reply arrived in {len(distinct)} pieces: {pieces}"
    stats = page.locator("#stats").inner_text()
    assert "prompt" in stats and "reply" in stats and "tok/s" in stats, stats
    expect(page.locator("#error")).to_be_hidden()
    shot(page, log_dir, "02-chat")


def test_expert_view_updates_during_a_request(page: Page, log_dir):
    heat = page.locator("#heat")
    # Let the heat of the previous test fade (the window is 5 s).
    expect(heat).to_have_attribute("data-tokens", "0", timeout=TIMEOUT_MS)
    before = int(heat.get_attribute("data-updates"))
    # Long enough for several frames of the live view (one every 0.5 s): about 3 s in the
    # debug build on a 2-core Zen 3.
    ask(page, "Write a long story about a ship.", max_tokens=600, temperature=0.8,
        ignore_eos=True)
    # A frame drawn during the request, with routed tokens: the previous test's last frame
    # may still be on its way when this one starts (its request can take 0.15 s, a frame
    # comes every 0.5 s), so tokens alone do not show this request's view.
    seen = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        streaming = page.locator(".msg.assistant.streaming").count() > 0
        tokens = int(heat.get_attribute("data-tokens"))
        if streaming and tokens > 0 and int(heat.get_attribute("data-updates")) > before:
            seen = tokens
            break
        time.sleep(0.05)
    assert seen, "the expert view drew no frame with routed tokens while the request ran"
    shot(page, log_dir, "03-experts-during-request")
    assert float(page.locator("#gen-tps").inner_text()) >= 0
    stop_if_running(page)
    wait_idle(page)


def test_rejected_request_shows_the_servers_message(page: Page, server, log_dir):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 0, "stream": True}
    req = urllib.request.Request(server.url + "/v1/chat/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    try:
        urllib.request.urlopen(req)
        raise AssertionError("the server accepted max_tokens 0")
    except urllib.error.HTTPError as e:
        status, message = e.code, json.loads(e.read())["error"]["message"]
    ask(page, "hi", max_tokens=0)
    wait_idle(page)
    error = page.locator("#error")
    expect(error).to_be_visible()
    expect(error).to_contain_text(f"{status}: {message}")
    shot(page, log_dir, "04-rejected")


def test_page_survives_a_server_restart(page: Page, server, log_dir):
    conn = page.locator("#conn")
    expect(conn).to_have_attribute("data-state", "live", timeout=TIMEOUT_MS)
    assert server.stop() == 0, "strata serve exited with an error after SIGTERM"
    expect(conn).to_have_attribute("data-state", "reconnecting", timeout=TIMEOUT_MS)
    shot(page, log_dir, "05-server-down")
    server.start()
    expect(conn).to_have_attribute("data-state", "live", timeout=TIMEOUT_MS)
    ask(page, "Are you back?", max_tokens=16)
    wait_idle(page)
    expect(page.locator("#error")).to_be_hidden()
    expect(page.locator(".msg.assistant").last).not_to_be_empty()
    shot(page, log_dir, "06-reconnected")
