"""The hang watch (routing/hangs.py) through the real gateway (in process) and real engine
processes: an engine that answers nothing while it computes (single-threaded) is never
judged hung by the look it cannot answer, and keeps its long request; an engine the
gateway has seen answering a look while busy is judged by the looks, and a SIGSTOP'd one
is ejected (tests/gateway/test_ejection.py: its requests move in seconds)."""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.rawhttp import exchange, request
from procs import free_ports
from test_ejection import ejections, teach
from test_upstream import ready, route

from controller.core.state import ProbeConfig
from controller.gateway.lifecycle.app import Gateway

SERIAL = Path(__file__).with_name("serial_engine.py")
HEALTH = ProbeConfig(http=(("/health", None),))
COMPUTE = 6.0  # seconds of the long request: past the look's verdict (~3 s) with room


def test_a_single_threaded_engine_keeps_its_long_request_and_its_replica_takes_the_next(
    reconcile: Any, inproc: Gateway
) -> None:
    """A single-threaded engine answers no look while it computes: before, the gateway
    judged it hung ~3 s into a long request, ejected it and computed the request again
    on the replica. Never seen answering while busy, it keeps its request, which it
    answers once; a request sent meanwhile goes to the replica, which is free."""
    g = inproc
    ports = [_serial(reconcile, name) for name in ("a", "b")]
    names = zip(("m", "m@1"), ports, strict=True)
    route(g, *(replace(ready(n, f"n{i}", p), probe=HEALTH) for i, (n, p) in enumerate(names)))
    with ThreadPoolExecutor(1) as pool:
        long = pool.submit(_post, g, COMPUTE)
        reconcile.wait_for(lambda: _inflight(g) == 1, what="the long request in flight")
        other = _post(g, 0)
        first = long.result()
    assert first["engine"] != other["engine"], (first, other)
    assert [_posts(p) for p in ports] == [1, 1]  # not computed twice
    assert ejections(g) == 0
    assert g.front is not None
    assert not any(g.front.table.health.answers_busy(n) for n in ("n0", "n1"))


def test_an_engine_seen_answering_while_busy_is_known_so_until_it_restarts(
    reconcile: Any, inproc: Gateway
) -> None:
    """The look it answers while a request waits (and that request still waits a round
    later) teaches the gateway that the engine answers while busy; a restart (a new
    nonce) is another engine, which has to show it again."""
    g = inproc
    _, rec = teach(reconcile, g, "n0")
    assert g.front is not None
    health = g.front.table.health
    route(g, replace(rec, nonce="n0-restarted"))
    reconcile.wait_for(lambda: not health.answers_busy("n0"), what="n0 forgotten")
    assert not health.answers_busy("n0-restarted")


def _serial(reconcile: Any, name: str) -> int:
    """A single-threaded engine named ``name`` on a free port, answering."""
    port = free_ports(1)
    reconcile.spawn([sys.executable, str(SERIAL), "--port", str(port), "--name", name])
    reconcile.wait_for(lambda: _status(port) == 200, what=f"the serial engine {name}")
    return port


def _post(g: Gateway, seconds: float) -> dict[str, Any]:
    body = json.dumps({"model": "m", "seconds": seconds}).encode()
    answer = exchange(g.settings.port, request("POST", "/v1/x", body), timeout=30)
    assert answer.status == 200, answer
    said: dict[str, Any] = answer.json()
    return said


def _posts(port: int) -> int:
    answer = exchange(port, request("GET", "/posts"), timeout=10)
    posts: int = answer.json()["posts"]
    return posts


def _status(port: int) -> int:
    try:
        status: int = exchange(port, request("GET", "/health"), timeout=5).status
    except OSError:
        return 0
    return status


def _inflight(g: Gateway) -> int:
    """Requests the gateway forwards now (its metrics' gauge, all instances)."""
    series = "reconcile_gateway_inflight{"
    lines = [line for line in g.metrics_text().splitlines() if line.startswith(series)]
    return sum(int(float(line.split()[-1])) for line in lines)
