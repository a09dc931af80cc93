"""The autoscaler's reaction time (issue 21), through the real daemon, gateway and engines.

    python -m benchmarks --only autoscale

One deployment of the demo engine (a streamed answer takes 2 s; 2 at once, the others
wait: ``--slots 2``) with ``autoscale: {min: 1, max: 2}`` behind ``reconcile
--listen``. At the load step 8 clients start streaming; the figure is the time from the
step to the second replica Ready, minus that replica's own start (its record's
``started_at`` to ``ready_at``): what the autoscaler adds. Twice (issue 41):

- ``metric: inflight`` (``targetInflight: 2``): the gateway's in-flight figures, written
  once a second, the daemon's look every 0.5 s, the pass. Goal: at most 2 s.
- ``metric: waiting`` (``target: 2``): the engine's own queue (6 wait), as the gateway
  reads it from the engine's ``/metrics`` every 5 s (enginemetrics.py), then the same
  path. No goal: the read interval is its cost, and what it buys is a signal that says
  the engine is saturated, which an in-flight count cannot (a batch of 256 is not
  loaded at 2 in flight).

A fresh daemon and state dir per trial.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import datetime

from benchmarks.common import (
    HTTP_READY,
    PYTHON,
    Row,
    Workspace,
    free_port_block,
    median,
    reconcile_argv,
    run,
    stop,
    wait_for,
    workspace,
)

SECTION = "9. replicas"
CLIENTS = 8
WAIT = 60.0
GOAL_S = 2.0


def _manifest(base_port: int, metric: str) -> str:
    engine = [PYTHON, "-m", "controller.demo.engine", "--port", "{port}", "--slots", "2"]
    scale: dict[str, object] = {"min": 1, "max": 2, "scaleDownDelay": "1h"}
    scale.update({"targetInflight": 2} if metric == "inflight" else {"metric": metric, "target": 2})
    doc = {
        "apiVersion": "reconcile/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "engine": "command",
            "command": [*engine, "--chunks", "20", "--chunk-delay", "0.1"],
            "basePort": base_port,
            "readiness": HTTP_READY,
            "stopGracePeriodSeconds": 2,
            "autoscale": scale,
        },
    }
    return json.dumps(doc)


def _record(ws: Workspace, name: str) -> dict[str, object] | None:
    with contextlib.suppress(OSError, ValueError):
        data: dict[str, object] = json.loads((ws.state / "instances" / f"{name}.json").read_text())
        return data
    return None


def _ready(ws: Workspace, name: str) -> dict[str, object] | None:
    rec = _record(ws, name)
    return rec if rec is not None and rec.get("phase") == "Ready" else None


class _Clients:
    """The load's streaming clients, and their open connections: at the end of the load
    those are shut down, so no client waits out its answer (queued behind the others',
    2 s each, ~6 s in all) once the figure is taken."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._open: set[http.client.HTTPConnection] = set()

    def stream(self, port: int) -> None:
        body = json.dumps({"model": "web", "stream": True, "messages": []})
        while not self.stopping.is_set():
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
            try:
                conn.connect()
                with self._lock:  # registered, or stopping seen: no connection missed
                    if self.stopping.is_set():
                        break
                    self._open.add(conn)
                conn.request(
                    "POST", "/v1/chat/completions", body, {"content-type": "application/json"}
                )
                conn.getresponse().read()
            except (OSError, http.client.HTTPException):
                time.sleep(0.05)
            finally:
                with self._lock:
                    self._open.discard(conn)
                conn.close()

    def stop(self) -> None:
        with self._lock:
            self.stopping.set()
            for conn in self._open:
                if conn.sock is not None:
                    with contextlib.suppress(OSError):
                        conn.sock.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def _load(port: int) -> Iterator[float]:
    clients = _Clients()
    threads = [
        threading.Thread(target=clients.stream, args=(port,), daemon=True) for _ in range(CLIENTS)
    ]
    step = time.time()
    for thread in threads:
        thread.start()
    try:
        yield step
    finally:
        clients.stop()
        for thread in threads:
            thread.join(timeout=WAIT)


def _seconds(rec: dict[str, object], field: str) -> float:
    return datetime.fromisoformat(str(rec[field])).timestamp()


def _trial(metric: str) -> float:
    with workspace("autoscale") as ws:
        base = free_port_block(8, start=24500)
        (ws.manifests / "web.yaml").write_text(_manifest(base + 1, metric))
        argv = [*reconcile_argv(), "--listen", str(base), "--resync", "1h", *ws.common()]
        with open(ws.root / "daemon.log", "wb") as log:  # its lines: not the table's
            daemon = subprocess.Popen(argv, env=ws.env(), stdin=subprocess.DEVNULL, stderr=log)
        try:
            wait_for(lambda: _ready(ws, "web"), WAIT, "replica 0 Ready", poll=0.05)
            with _load(base) as step:
                second = wait_for(lambda: _ready(ws, "web@1"), WAIT, "replica 1", poll=0.02)
            own = _seconds(second, "ready_at") - _seconds(second, "started_at")
            return _seconds(second, "ready_at") - step - own
        finally:
            stop(daemon)
            run([*reconcile_argv(), "down", "--gateway", *ws.common()], env=ws.env())


def bench(trials: int = 3) -> list[Row]:
    inflight: list[float] = []
    waiting: list[float] = []
    for _ in range(trials):  # alternated: the box's load falls on both alike
        inflight.append(_trial("inflight"))
        waiting.append(_trial("waiting"))
    what = f"load step ({CLIENTS} streams, 2 at once a replica, target 2) to the new replica"
    return [
        Row(
            SECTION,
            f"autoscaler reaction, metric inflight: {what} Ready, minus that replica's own start",
            "s",
            inflight,
            goal=f"≤ {GOAL_S:g} s",
            met=median(inflight) <= GOAL_S,
        ),
        Row(
            SECTION,
            f"autoscaler reaction, metric waiting (the engine's own queue): {what} Ready",
            "s",
            waiting,
            theirs=inflight,
            alt="metric inflight",
        ),
    ]


if __name__ == "__main__":  # pragma: no cover
    for row in bench():
        print(row)
