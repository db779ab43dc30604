"""Helpers of the MLflow UI tests: Debian's Chromium (installed when missing), the MLflow server
on loopback, and Playwright driving the browser headless.

Chromium is Debian's ``chromium`` package at ``/usr/bin/chromium``, never a browser downloaded
by Playwright (``playwright install`` fails on machines without general internet access).
The flags are those known to work on this project's machines: without the background-networking
ones Chromium keeps trying (and failing) to reach Google's hosts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
#: Where the tests leave their screenshots (gitignored)
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts" / "ui"


def ensure_chromium() -> str:
    """The path of Debian's Chromium, installing the ``chromium`` package when it is missing (as root).

    Skips where it cannot be installed (no apt-get, not root); fails when the install itself fails.
    """
    if Path(CHROMIUM).is_file():
        return CHROMIUM
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        pytest.skip(f"{CHROMIUM} is missing and cannot be installed here (needs apt-get as root)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "chromium"]):
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
        if done.returncode != 0:
            pytest.fail(f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-2000:]}")
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"the chromium package did not install {CHROMIUM}")
    return CHROMIUM


def wait_for_http(url: str, process: subprocess.Popen, log: Path, timeout_s: float) -> None:
    """Poll ``url`` until it answers 200; fail with the log's tail if the process exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log.is_file() else ""
            pytest.fail(f"{url} did not come up (exit status {process.poll()}); log tail:\n{tail}")
        time.sleep(1.0)


@contextlib.contextmanager
def running_server(command: list[str], health_url: str, log: Path, timeout_s: float = 240.0) -> Iterator[Callable[[], None]]:
    """Run ``command`` (a server) in its own session until the block ends.

    Yields ``ready()``, which blocks until ``health_url`` answers (so the server can start while
    the caller does other work). Stops it with SIGTERM to its process group (the server's
    workers with it), then SIGKILL.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    up = False

    def ready() -> None:
        nonlocal up
        if not up:
            wait_for_http(health_url, process, log, max(deadline - time.monotonic(), 1.0))
            up = True

    try:
        yield ready
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=20)


@contextlib.contextmanager
def headless_chromium() -> Iterator[object]:
    """A Playwright ``Browser``: Debian's Chromium, headless (Playwright gives it a fresh, empty
    profile directory of its own: ``--user-data-dir`` is its to set)."""
    from playwright.sync_api import sync_playwright

    executable = ensure_chromium()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()


_VIRTUALIZED_CELLS = """() => Array.from(document.querySelectorAll('.ReactVirtualized__Grid')).map(grid => {
  const inner = grid.querySelector('.ReactVirtualized__Grid__innerScrollContainer');
  return {height: grid.scrollHeight, view: grid.clientHeight,
          cells: inner ? Array.from(inner.children).map(c => [c.style.top, parseFloat(c.style.left) || 0, c.innerText]) : []};
})"""


def compare_view_metrics(page) -> dict[str, list[str]]:
    """The metrics table of MLflow's compare view: ``{metric: [value shown per run, in column order]}``.

    The table is two virtualized grids (names; values, one column per run) that render only the
    rows in view: both are scrolled through together and rows are matched by their offset.
    """
    rows: dict[str, list[str]] = {}
    offset = 0
    while True:
        grids = page.evaluate(_VIRTUALIZED_CELLS)
        if len(grids) < 2:
            raise AssertionError(f"expected the compare view's metric grids (names, values), found {len(grids)} grid(s)")
        names, values = grids[0], grids[1]
        by_top: dict[str, list[tuple[float, str]]] = {}
        for top, left, text in values["cells"]:
            by_top.setdefault(top, []).append((left, text.strip()))
        for top, _, name in names["cells"]:
            if top in by_top:
                rows[name.strip()] = [text for _, text in sorted(by_top[top])]
        if offset + names["view"] >= names["height"]:
            return rows
        offset += max(names["view"] // 2, 1)
        page.evaluate("y => document.querySelectorAll('.ReactVirtualized__Grid').forEach(g => { g.scrollTop = y; })", offset)
        page.wait_for_timeout(300)
