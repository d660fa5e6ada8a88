"""The status page at ``/`` in a real headless Chromium (Debian's, driven by Playwright) against
real daemons on the tiny model: it lists the models, asks for a key when keys are on, its tok/s
chart moves under `mlxd bench run`, and its load/unload buttons change what `mlxd ps` shows.

``MLXD_STATUS_SCREENSHOT=docs/img/status-page.png`` also saves the page as the README shows it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import Daemon, start_daemon, stop_daemon

pytestmark = [pytest.mark.e2e]

CHROMIUM = Path("/usr/bin/chromium")
# The network is closed here: no first-run, sync, component or background requests.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
API_KEY = "sk-alice-status-page"
ADMIN_KEY = "admin-status-page"
CARD = '[data-model="tiny"]'
TPS_CHART = f"{CARD} .chart-tps"
WAIT_MS = 30_000

if not CHROMIUM.exists():
    pytest.skip(
        "Chromium is not installed: scripts/test installs Debian's chromium package (as root)",
        allow_module_level=True,
    )

from playwright.sync_api import BrowserContext, Page, sync_playwright  # noqa: E402


@pytest.fixture(scope="module")
def browser() -> Iterator[BrowserContext]:
    """One Chromium with a fresh profile; each test gets its own tab (its own sessionStorage)."""
    with tempfile.TemporaryDirectory(prefix="mlxd-chromium-") as profile, sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            profile,
            executable_path=str(CHROMIUM),
            headless=True,
            args=FLAGS,
            viewport={"width": 1100, "height": 860},
        )
        yield context
        context.close()


@pytest.fixture
def page(browser: BrowserContext) -> Iterator[Page]:
    tab = browser.new_page()
    yield tab
    tab.close()


@pytest.fixture(scope="module")
def keyed(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon with an API key (named alice) and an admin key."""
    keys = tmp_path_factory.mktemp("keys") / "keys.toml"
    keys.write_text(f'[[keys]]\nname = "alice"\nkey = "{API_KEY}"\n')
    d = start_daemon(
        tiny_model, "--api-keys-file", str(keys), "--admin-key", ADMIN_KEY, "--max-context", "512"
    )
    yield d
    if d.proc.poll() is None:
        stop_daemon(d)


def open_with_key(page: Page, daemon: Daemon) -> None:
    page.goto(daemon.base_url)
    page.wait_for_selector("#key-form:not([hidden])", timeout=WAIT_MS)
    page.fill("#key-input", API_KEY)
    page.click("#key-form button[type=submit]")
    page.wait_for_selector(f'{CARD}[data-state="running"]', timeout=WAIT_MS)


def chart_heights(page: Page) -> list[float]:
    """The tok/s line's y coordinates, one per poll."""
    points = page.get_attribute(f"{TPS_CHART} polyline", "points") or ""
    return [float(point.split(",")[1]) for point in points.split()]


def wait_until(page: Page, check: Callable[[], bool], timeout_s: float = 30) -> None:
    """Poll ``check`` from Python: the page's CSP (no eval) rules out ``wait_for_function``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "the page did not get there in time"
        page.wait_for_timeout(200)


def mlxd_ps(daemon: Daemon) -> dict[str, list[str]]:
    env = {**os.environ, "MLXD_URL": daemon.base_url, "MLXD_ADMIN_KEY": ADMIN_KEY}
    r = subprocess.run(
        [sys.executable, "-m", "mlxd", "ps"], capture_output=True, text=True, timeout=60, env=env
    )
    assert r.returncode == 0, r.stderr
    return {line.split()[0]: line.split() for line in r.stdout.splitlines()[1:]}


def test_loopback_sees_the_models_without_a_key(page: Page, shared_daemon: Daemon) -> None:
    page.goto(shared_daemon.base_url)
    page.wait_for_selector(f'{CARD}[data-state="running"]', timeout=WAIT_MS)
    assert page.is_hidden("#key-form")
    figures = page.inner_text(f"{CARD} .figures")
    assert "weights" in figures and "running rows" in figures and "decode step" in figures
    assert "No cloud backends" in page.inner_text("#backends")
    assert page.inner_text("#health") == "health: ok"  # /health's report, as the page shows it
    assert page.get_attribute("#health", "class") == "ok"


def test_with_keys_the_page_asks_for_one_then_lists_the_models(page: Page, keyed: Daemon) -> None:
    page.goto(keyed.base_url)
    page.wait_for_selector("#key-form:not([hidden])", timeout=WAIT_MS)
    assert page.locator(CARD).count() == 0
    page.fill("#key-input", "wrong-key")
    page.click("#key-form button[type=submit]")
    page.wait_for_selector("#key-form:not([hidden])", timeout=WAIT_MS)  # asked again
    page.fill("#key-input", API_KEY)
    page.click("#key-form button[type=submit]")
    page.wait_for_selector(f'{CARD}[data-state="running"]', timeout=WAIT_MS)
    assert page.evaluate("sessionStorage.getItem('mlxd.key')") == API_KEY
    assert API_KEY not in page.content()


def test_tok_s_chart_moves_while_a_benchmark_runs(
    page: Page, keyed: Daemon, tmp_path: Path
) -> None:
    open_with_key(page, keyed)
    bench = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlxd",
            "bench",
            "run",
            "--url",
            keyed.base_url,
            "--model",
            "tiny",
            "--api-key",
            API_KEY,
            "--concurrency",
            "2",
            "--requests-per-level",
            "400",
            "--prompt-tokens",
            "16",
            "--max-tokens",
            "48",
            "--warmup-tokens",
            "2",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(page, lambda: float(page.get_attribute(TPS_CHART, "data-max") or 0) > 0)
        wait_until(page, lambda: len(set(chart_heights(page))) > 1)  # the line moved
        wait_until(page, lambda: page.locator("#requests tbody tr").count() > 2)
        if os.environ.get("MLXD_STATUS_SCREENSHOT"):  # for the README: a minute of chart
            wait_until(page, lambda: len(chart_heights(page)) >= 60, timeout_s=90)
        screenshot(page, tmp_path)
    finally:
        bench.terminate()
        bench.wait(timeout=30)
    row = page.inner_text("#requests tbody tr")
    assert "tiny" in row and "alice" in row and API_KEY not in page.content()


def test_unload_and_load_from_the_page_change_mlxd_ps(page: Page, keyed: Daemon) -> None:
    open_with_key(page, keyed)
    page.click(f'{CARD} [data-action="unload"]')
    page.wait_for_selector("#key-form:not([hidden])", timeout=WAIT_MS)  # the API key is not enough
    assert "admin key" in page.inner_text("#key-label")
    page.fill("#key-input", ADMIN_KEY)
    page.click("#key-form button[type=submit]")
    page.wait_for_selector(f'{CARD}[data-state="unloaded"]', timeout=WAIT_MS)
    assert mlxd_ps(keyed)["tiny"][1] == "unloaded"
    page.click(f'{CARD} [data-action="load"]')  # the admin key is kept for this tab
    page.wait_for_selector(f'{CARD}[data-state="running"]', timeout=60_000)
    assert mlxd_ps(keyed)["tiny"][1] == "running"


def screenshot(page: Page, tmp_path: Path) -> None:
    """Check the page renders to a PNG; save it for the README when asked to."""
    png = page.screenshot(full_page=True)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    target = os.environ.get("MLXD_STATUS_SCREENSHOT")
    (Path(target) if target else tmp_path / "status-page.png").write_bytes(png)
