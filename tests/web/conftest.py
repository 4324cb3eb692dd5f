"""Fixtures of the page's browser tests: a `strata serve` the tests can restart, and one
headless Debian Chromium page on it (driven by Playwright, without its browser download).
Set by run.sh: STRATA_BIN (the binary), STRATA_LOG_DIR (screenshots and the server log),
CHROMIUM (the browser)."""

import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import Page, sync_playwright

MODEL = "strata-tiny-moe"


class Server:
    """`strata serve` on a fixed port, started again on the same port by `restart`."""

    def __init__(self, binary: str, log_dir: Path, extra=(), name: str = "serve",
                 ctx_size: int = 1024):
        self.binary = binary
        self.extra = list(extra)
        self.ctx_size = ctx_size
        self.log = open(log_dir / f"{name}.log", "ab")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "serve", "--host", "127.0.0.1", "--port", str(self.port),
             "--max-batch", "4", "--max-queue", "16", "--ctx-size", str(self.ctx_size),
             *self.extra],
            stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"strata serve exited with {self.proc.returncode}; see {self.log.name}")
            try:
                urllib.request.urlopen(f"{self.url}/health", timeout=1)
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("strata serve did not answer /health in 120 s")

    def stop(self) -> int:
        """SIGTERM, then the exit status; the page's open event stream must not hold the
        graceful shutdown up."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("strata serve did not exit within 20 s of SIGTERM")


@pytest.fixture(scope="session")
def log_dir() -> Path:
    d = Path(os.environ["STRATA_LOG_DIR"])
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="session")
def server(log_dir: Path):
    s = Server(os.environ["STRATA_BIN"], log_dir)
    s.start()
    yield s
    if s.proc.poll() is None:
        assert s.stop() == 0, "strata serve exited with an error after SIGTERM"


@pytest.fixture(scope="session")
def browser():
    exe = os.environ["CHROMIUM"]
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, headless=True)
        yield b
        b.close()


@pytest.fixture(scope="session")
def page(browser, server: Server, log_dir: Path) -> Page:
    pg = browser.new_page(viewport={"width": 1280, "height": 900})
    messages = []
    pg.on("console", lambda m: messages.append(f"{m.type}: {m.text}"))
    pg.on("pageerror", lambda e: messages.append(f"pageerror: {e}"))
    pg.goto(server.url + "/")
    yield pg
    (log_dir / "console.log").write_text("\n".join(messages) + "\n")
    pg.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A screenshot of the page when a test fails, named after the test."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed and "page" in item.funcargs:
        d = Path(os.environ["STRATA_LOG_DIR"])
        item.funcargs["page"].screenshot(path=str(d / f"FAILED-{item.name}.png"), full_page=True)


def stop_if_running(page: Page) -> None:
    """Clicks Stop if the reply is still running, in one step of the page's script: a fast
    build can finish the reply between a check and a click (600 tokens of strata-tiny-moe took
    1.3 s in CI on 2026-12-01), and Stop is disabled then."""
    page.evaluate("() => { const b = document.querySelector('#halt'); if (!b.disabled) b.click(); }")
