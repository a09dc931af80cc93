"""The web page under test: the real daemon and gateway (tests/gateway's fixture), real
engines, and a real headless Chromium driven by selenium through chromedriver.

The browser is the distribution's (Debian's ``chromium`` and ``chromium-driver``: one
package version, so the driver always matches the browser; .ci/run installs them).
Without them every test here is skipped, saying so; with them nothing is.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import missing
import pytest
from gateway.conftest import Gateways  # the daemon with --listen, as tests/gateway runs it
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from uipage import Page

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture
def gateway(reconcile: Any) -> Iterator[Gateways]:
    gateways = Gateways(reconcile)
    yield gateways
    gateways.kill_all()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    """Headless Chromium, its console kept (``get_log("browser")``); quit at teardown
    (the browser and chromedriver end with it)."""
    if CHROMIUM is None or CHROMEDRIVER is None:
        missing.skip("chromium and chromedriver", "apt-get install chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root, where Chromium's sandbox cannot start
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        f"--user-data-dir={tmp_path / 'chromium'}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def page(browser: webdriver.Chrome, tmp_path: Path) -> Page:
    return Page(browser, tmp_path)
