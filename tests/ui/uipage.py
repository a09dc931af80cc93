"""The page as a test reads it: each look is one script run in the browser (the page
redraws every second, so elements are read at once, never held across a redraw)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from selenium import webdriver

WAIT = 30.0  # a cap for the noisy machine; a healthy run takes a fraction
T = TypeVar("T")

ROWS = """
return [...document.querySelectorAll('#deployments tbody tr')].map((tr) => {
  const cell = (c) => tr.querySelector('td.' + c).textContent;
  return {name: tr.dataset.name, phase: cell('phase'), ready: cell('ready'),
          model: cell('model'), restarts: cell('restarts'), port: cell('port'),
          age: cell('age'), message: cell('message'),
          last_exit: tr.querySelector('td.restarts').title,
          buttons: [...tr.querySelectorAll('button')].map((b) => b.dataset.action)};
});
"""
DEVICES = """
return [...document.querySelectorAll('#devices .device')].map((d) => {
  const bar = d.querySelector('.bar');
  const num = (k) => bar.dataset[k] === 'null' ? null : Number(bar.dataset[k]);
  return {device: d.dataset.device, health: d.dataset.health,
          total: num('total'), requested: num('requested'),
          free: num('free'),
          holders: [...bar.querySelectorAll('.holder')].map((h) => h.textContent)};
});
"""
EVENTS = """
return [...document.querySelectorAll('#events tbody tr')].map((tr) => ({
  deployment: tr.dataset.deployment, action: tr.querySelector('.action').textContent,
  reason: tr.querySelector('.reason').textContent}));
"""
TRAFFIC = """
return Object.fromEntries([...document.querySelectorAll('#traffic .traffic')].map((t) => [
  t.dataset.deployment,
  Object.fromEntries([...t.querySelectorAll('.metric')].map((m) => [
    m.dataset.metric, m.querySelector('.metric-value').textContent]))]));
"""


class Page:
    def __init__(self, driver: webdriver.Chrome, tmp: Path) -> None:
        self.driver = driver
        self.tmp = tmp

    def open(self, url: str) -> None:
        self.driver.get(url)

    def run(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def rows(self) -> dict[str, dict[str, Any]]:
        return {row["name"]: row for row in self.run(ROWS)}

    def devices(self) -> list[dict[str, Any]]:
        return list(self.run(DEVICES))

    def events(self) -> list[dict[str, str]]:
        return list(self.run(EVENTS))

    def traffic(self) -> dict[str, dict[str, str]]:
        return dict(self.run(TRAFFIC))

    def pull_bar(self, name: str) -> dict[str, int] | None:
        """A Pulling deployment's bar: bytes done and total (None: no bar)."""
        found = self.run(
            "const b = document.querySelector(`#deployments tr[data-name='${arguments[0]}'] "
            ".bar.pull`);"
            "return b && {done: Number(b.dataset.done), total: Number(b.dataset.total)};",
            name,
        )
        return dict(found) if found else None

    def shown(self, element_id: str) -> bool:
        return bool(self.run(f"return !document.getElementById('{element_id}').hidden;"))

    def text(self, element_id: str) -> str:
        return str(self.run(f"return document.getElementById('{element_id}').textContent;"))

    def click(self, selector: str) -> None:
        """Click the element now under ``selector`` (found and clicked in one script)."""
        found = self.run(
            "const el = document.querySelector(arguments[0]); if (el) el.click(); return !!el;",
            selector,
        )
        assert found, f"nothing on the page matches {selector!r}"

    def wait(self, look: Callable[[], T | None], what: str, timeout: float = WAIT) -> T:
        """``look()`` until it gives something truthy; the page's state in the failure."""
        deadline = time.monotonic() + timeout
        while True:
            found = look()
            if found:
                return found
            if time.monotonic() > deadline:
                said = self.text("live")
                raise AssertionError(
                    f"page: {what} not seen in {timeout:g}s ({said}): {self.rows()}"
                )
            time.sleep(0.1)

    def console_errors(self) -> list[dict[str, Any]]:
        """What the browser's console logged at error level since the last look."""
        return [e for e in self.driver.get_log("browser") if e.get("level") == "SEVERE"]

    def screenshot(self, name: str) -> Path:
        path = self.tmp / name
        assert self.driver.save_screenshot(str(path)), f"no screenshot written to {path}"
        return path
