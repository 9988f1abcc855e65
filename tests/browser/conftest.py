"""Headless Chromium driven by Selenium, for the dashboard's browser tests.

Chromium and its driver come from Debian's ``chromium`` and ``chromium-driver`` packages
(``.ci/run`` installs them when it runs as root with apt-get). Without them the tests are
skipped, saying why; with ``TRAINYARD_BROWSER_TESTS=required`` (CI) they fail instead.

Both modules drive one local stack (``stack``, started once for the package): a start and a
stop of the whole platform is most of a minute on a loaded machine. Each module keeps to
teams of its own, so neither sees the other's jobs, experiments or models.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainyard_platform.deploy.local.stack import LocalStack

CHROMIUM = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
DRIVER = ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")
WINDOW = (1360, 900)
PRICES = '{"cpu": 36.0}'
"""A price per GPU-hour that makes seconds of CPU cost cents."""
RUNNER_GPUS = 2
"""The one runner's virtual GPUs (flavor ``cpu``): a job asking for more waits for good."""


def _first(paths: tuple[str, ...], name: str) -> str | None:
    found = next((p for p in paths if Path(p).exists()), None)
    return found or shutil.which(name)


def _missing(reason: str) -> None:
    if os.environ.get("TRAINYARD_BROWSER_TESTS") == "required":
        pytest.fail(f"browser tests are required here: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _missing("selenium is not installed (pip install -e '.[dev]')")
    chromium = _first(CHROMIUM, "chromium")
    driver = _first(DRIVER, "chromedriver")
    if chromium is None or driver is None:
        _missing("Chromium or chromedriver is missing (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-dev-shm-usage",
        "--no-proxy-server",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    session = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    session.set_page_load_timeout(30)
    try:
        yield session
    finally:
        session.quit()


@pytest.fixture(scope="package")
def stack() -> Iterator[LocalStack]:
    """The whole platform, one runner of ``RUNNER_GPUS`` virtual GPUs, shared by the modules.

    Job uids of its own, so another local stack on this host (another test run) does not
    hold them."""
    data = Path(tempfile.mkdtemp(prefix="trainyard-browser-"))
    env = {"TRAINYARD_BILLING_PRICES": PRICES, "TRAINYARD_RUNNER_JOB_UID_BASE": "264064"}
    try:
        with LocalStack(
            data / "stack", storage="file", runner_gpus=RUNNER_GPUS, extra_env=env
        ) as running:
            yield running
    finally:
        shutil.rmtree(data, ignore_errors=True)
