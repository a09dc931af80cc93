"""A test that needs what this machine lacks skips, naming the package and the command
that installs it (``scripts/system-packages`` installs them all as root). With ``CI=true``
tests/conftest.py turns such a skip into a failure: nothing is silently left out in CI."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import NoReturn

import pytest

PREFIX = "missing:"


def reason(what: str, install: str) -> str:
    """The skip's reason (for ``skipif``): what is missing and how to get it."""
    return f"{PREFIX} {what} (install: {install})"


def skip(what: str, install: str) -> NoReturn:
    pytest.skip(reason(what, install))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """The hook tests/conftest.py takes: with CI=true, a skip of ours fails."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    longrepr = report.longrepr
    ours = isinstance(longrepr, tuple) and PREFIX in str(longrepr[-1])
    if os.environ.get("CI") == "true" and report.skipped and ours:
        report.outcome = "failed"
        report.longrepr = f"CI=true: a needed tool is missing. {longrepr[-1]}"
