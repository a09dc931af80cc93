"""A pytest plugin for the flake tooling: it writes the ids of the tests that failed.

``scripts/rerun-failed`` and ``scripts/flakes`` load it (``-p failedlist``, ``tests/`` on
``PYTHONPATH``). With ``RECONCILE_FAILED_LIST=FILE`` it writes, at the session's end, one
JSON line per test that ran: its id, whether it failed, and the first line of the failure
(setup and teardown errors count). Under pytest-xdist the controller writes it, from its
workers' reports.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

_RAN: dict[str, str] = {}  # test id: "" for a pass or skip, else its first failure


def _first_line(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)  # pytest's one-line summary
    text = crash.message if crash is not None else str(report.longrepr or report.outcome)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0][:200] if lines else report.outcome


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed and not _RAN.get(report.nodeid):
        _RAN[report.nodeid] = f"{report.when}: {_first_line(report)}"
    else:
        _RAN.setdefault(report.nodeid, "")


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get("RECONCILE_FAILED_LIST")
    if not target or hasattr(session.config, "workerinput"):
        return
    rows = [{"id": k, "failed": bool(v), "why": v} for k, v in _RAN.items()]
    Path(target).write_text("".join(json.dumps(row) + "\n" for row in rows))
