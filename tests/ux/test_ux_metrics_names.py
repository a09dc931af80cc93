"""Prometheus naming and manners: counters end in _total, build info, a last success
present from the start (0), HEAD /metrics, and promtool's lint where it is installed."""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import missing
import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller import __version__
from controller.core.devices.inventory import Inventory
from controller.core.state import Phase, Record
from controller.daemon import metrics, metricsserver
from controller.store.config import accesstoken

RECORDS = [
    Record(name="web", owner="o", node="n", phase=Phase.READY, restarts=2),
    Record(name="job", owner="o", node="n", phase=Phase.BACKOFF, restarts=1),
]


def _text() -> str:
    figures = metrics.PassFigures(
        records=RECORDS,
        inventory=Inventory(),
        node="n",
        revision="",
        seconds=0.25,
        ok=False,
        now=1000.0,
        last_ok=None,
        manifest_errors=0,
        drained=False,
        passes=7,
        actions={("start", "ok"): 3, ("start", "failed"): 1, ("stop", "ok"): 2},
    )
    return metrics.render(figures)


def _families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_names_types_and_values() -> None:
    families = _families(_text())
    types = {name: f.type for name, f in families.items()}  # type: ignore[attr-defined]
    # the parser names a counter's family without _total
    assert types["reconcile_deployment_restarts"] == "counter"
    assert types["reconcile_passes"] == "counter"
    assert types["reconcile_actions"] == "counter"
    assert types["reconcile_last_pass_duration_seconds"] == "gauge"
    assert types["reconcile_build_info"] == "gauge"
    assert "reconcile_pass_duration_seconds" not in types  # renamed
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in families.values()
        for s in f.samples  # type: ignore[attr-defined]
    }
    assert samples[("reconcile_build_info", (("version", __version__),))] == 1
    assert samples[("reconcile_passes_total", ())] == 7
    failed = ("reconcile_actions_total", (("action", "start"), ("outcome", "failed")))
    assert samples[failed] == 1
    labels = (("deployment", "web"), ("instance", "web"), ("node", "n"))
    web = ("reconcile_deployment_restarts_total", labels)
    assert samples[web] == 2
    assert samples[("reconcile_last_successful_pass_timestamp_seconds", ())] == 0


def test_before_the_first_pass_the_alerting_series_exist() -> None:
    families = _families(metrics.render(metrics.BeforeFirstPass()))
    assert {"reconcile_build_info", "reconcile_passes"} <= set(families)
    assert "reconcile_last_successful_pass_timestamp_seconds" in families


PROMTOOL = os.environ.get("PROMTOOL") or shutil.which("promtool")


@pytest.mark.skipif(
    PROMTOOL is None, reason=missing.reason("promtool", "apt-get install prometheus")
)
@pytest.mark.parametrize("which", ["after-a-pass", "before-the-first"])
def test_promtool_check_metrics_is_clean(which: str) -> None:
    assert PROMTOOL is not None
    text = _text() if which == "after-a-pass" else metrics.render(metrics.BeforeFirstPass())
    check = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0 and not check.stdout.strip(), check.stdout + check.stderr


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[int, str]]:
    """The metrics server on a free port, and the token its state dir made."""
    srv = metricsserver.serve("127.0.0.1", 0, tmp_path)
    try:
        yield srv.server_address[1], accesstoken.read(tmp_path)
    finally:
        srv.shutdown()
        srv.server_close()


def test_head_metrics_answers_without_a_body(server: tuple[int, str]) -> None:
    port, token = server
    url = f"http://127.0.0.1:{port}/metrics?token={token}"
    with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=5) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        assert int(r.headers["Content-Length"]) > 0 and r.read() == b""
    with urllib.request.urlopen(url, timeout=5) as r:
        assert b"reconcile_build_info" in r.read()


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"])
def test_another_method_is_a_405_that_says_get_and_head(
    server: tuple[int, str], method: str
) -> None:
    """It was http.server's HTML 501 page."""
    port, token = server
    status, headers, said = _ask(port, method, f"/metrics?token={token}")
    assert (status, headers["Allow"]) == (405, "GET, HEAD"), said
    assert headers["Content-Type"] == metricsserver.TEXT
    assert said == f"{method} is not allowed: /metrics serves GET, HEAD\n".encode()


def test_a_method_no_one_knows_is_a_plain_501(server: tuple[int, str]) -> None:
    port, _ = server
    status, headers, said = _ask(port, "BREW", "/metrics")
    assert status == 501 and headers["Content-Type"] == metricsserver.TEXT, said
    assert said.startswith(b"501 ") and b"<" not in said, said


def _ask(port: int, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path, body=b"{}" if method in ("POST", "PUT", "PATCH") else None)
        answer = conn.getresponse()
        return answer.status, dict(answer.getheaders()), answer.read()
    finally:
        conn.close()


def _ends(conn: socket.socket) -> bool:
    """The server closed ``conn`` (EOF or a reset) within the socket's timeout."""
    try:
        return conn.recv(1) == b""
    except ConnectionError:
        return True


def test_a_silent_connection_is_closed_and_past_the_cap_a_new_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a trial of the gateway's front door: each connection to /metrics held a
    thread of the daemon's and an fd for good while it said nothing, without a cap (30
    idle ones: 30 threads more); a client could take the fds the daemon's passes need. A
    silent one is closed after ``READ_TIMEOUT`` s, and past ``CONNECTIONS_MAX`` at once a
    new one is closed unanswered; a scrape is served again once one ends."""
    monkeypatch.setattr(metricsserver, "CONNECTIONS_MAX", 2)
    monkeypatch.setattr(metricsserver._Handler, "timeout", 1.0)
    srv = metricsserver.serve("127.0.0.1", 0, tmp_path)
    port = srv.server_address[1]
    held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(2)]
    try:
        began = time.monotonic()
        assert _ends(held[0]) and _ends(held[1])  # silent: closed at READ_TIMEOUT, not never
        assert time.monotonic() - began < 8
        deadline = time.monotonic() + 15  # their threads end and give their slots back
        while srv.slots._value < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        monkeypatch.setattr(metricsserver._Handler, "timeout", 60.0)  # now they hold on
        # Accepted in turn: the first two take the slots, the third finds none.
        held += [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(3)]
        began = time.monotonic()
        assert _ends(held[4]) and time.monotonic() - began < 8  # past the cap: at once
        held[2].close()
        held[3].close()
        token = accesstoken.read(tmp_path)
        deadline = time.monotonic() + 15  # their threads end and give their slots back
        while True:
            try:
                status = _ask(port, "GET", f"/metrics?token={token}")[0]
            except (ConnectionError, http.client.RemoteDisconnected):
                status = 0
            if status == 200 or time.monotonic() > deadline:
                break
        assert status == 200
    finally:
        for conn in held:
            conn.close()
        srv.shutdown()
        srv.server_close()
