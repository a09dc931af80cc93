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
WIDTH, HEIGHT = 1400, 1000


@pytest.fixture
def gateway(reconcile: Any) -> Iterator[Gateways]:
    gateways = Gateways(reconcile)
    yield gateways
    gateways.kill_all()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    """Headless Chromium, its console kept (``get_log("browser")``), shared by a module's
    tests (a start is seconds on a loaded box; ``page`` gives each test a blank one);
    quit at teardown (the browser and chromedriver end with it)."""
    if CHROMIUM is None or CHROMEDRIVER is None:
        missing.skip("chromium and chromedriver", "apt-get install chromium chromium-driver")
    tmp = tmp_path_factory.mktemp("chromium")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root, where Chromium's sandbox cannot start
        "--disable-dev-shm-usage",
        f"--window-size={WIDTH},{HEIGHT}",
        f"--user-data-dir={tmp / 'profile'}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(CHROMEDRIVER, log_output=str(tmp / "chromedriver.log"))
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def page(browser: webdriver.Chrome, tmp_path: Path) -> Iterator[Page]:
    """The shared browser as a fresh one: a new tab (its own sessionStorage) at the
    default size and colours, its console emptied (an earlier test's page, polling a
    gateway since gone, may have logged)."""
    earlier = browser.window_handles
    browser.switch_to.new_window("tab")
    fresh = browser.current_window_handle
    for handle in earlier:
        browser.switch_to.window(handle)
        browser.close()
    browser.switch_to.window(fresh)
    browser.set_window_size(WIDTH, HEIGHT)
    browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
    browser.get_log("browser")  # read is emptied: console_errors() sees this test's only
    yield Page(browser, tmp_path)
    browser.get("about:blank")  # stops this test's polling before its gateway goes
