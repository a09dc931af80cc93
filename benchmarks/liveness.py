"""How soon a hung engine is replaced (issue 24), through the real daemon and engine.

    python -m benchmarks --only health

One demo engine with ``livenessProbe: {httpGet: /health, periodSeconds: 0.5,
timeoutSeconds: 0.5, failureThreshold: 3}`` and a 1 s grace period. Once it is Ready
it is SIGSTOPped (alive, listening, answering nothing); the figure is the time from the
SIGSTOP to the replacement's spawn (its journal event). Kubernetes' rule of thumb is
failureThreshold x periodSeconds + grace (2.5 s here): the goal. Teardown continues a
stopped engine after its stop signal, so the grace is rarely waited out whole (2.1 s
measured). A fresh daemon and state dir per trial.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from datetime import UTC, datetime

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

SECTION = "11. health"
PERIOD, TIMEOUT, THRESHOLD, GRACE = 0.5, 0.5, 3, 1.0
GOAL_S = THRESHOLD * PERIOD + GRACE  # Kubernetes' rule of thumb, the issue's bound
WAIT = 60.0


def _manifest(base_port: int) -> str:
    doc = {
        "apiVersion": "reconcile/v1",
        "kind": "Deployment",
        "metadata": {"name": "hangs"},
        "spec": {
            "engine": "command",
            "command": [PYTHON, "-m", "controller.demo.engine", "--port", "{port}"],
            "basePort": base_port,
            "readiness": HTTP_READY,
            "livenessProbe": {
                "httpGet": {"path": "/health"},
                "periodSeconds": PERIOD,
                "timeoutSeconds": TIMEOUT,
                "failureThreshold": THRESHOLD,
            },
            "stopGracePeriodSeconds": GRACE,
        },
    }
    return json.dumps(doc)


def _ready_pid(ws: Workspace) -> int | None:
    try:
        rec = json.loads((ws.state / "instances" / "hangs.json").read_text())
    except (OSError, ValueError):
        return None
    ref = rec.get("ref") or {}
    return int(ref["pid"]) if rec.get("phase") == "Ready" and ref.get("pid") else None


def _spawns(ws: Workspace) -> list[datetime]:
    try:
        lines = (ws.state / "events" / "hangs.jsonl").read_text().splitlines()
    except OSError:
        return []
    events = [json.loads(line) for line in lines if line.strip()]
    return [
        datetime.fromisoformat(e["time"])
        for e in events
        if str(e.get("outcome", "")).startswith("spawned pid")
    ]


def _trial() -> float:
    with workspace("liveness") as ws:
        (ws.manifests / "hangs.yaml").write_text(_manifest(free_port_block(4, start=25500)))
        argv = [*reconcile_argv(), "--resync", "1h", *ws.common()]
        with open(ws.root / "daemon.log", "wb") as log:  # its lines: not the table's
            daemon = subprocess.Popen(argv, env=ws.env(), stdin=subprocess.DEVNULL, stderr=log)
        try:
            pid = wait_for(lambda: _ready_pid(ws), WAIT, "the engine Ready", poll=0.02)
            os.kill(pid, signal.SIGSTOP)
            hung = datetime.now(UTC)
            try:
                wait_for(lambda: len(_spawns(ws)) >= 2, WAIT, "the replacement", poll=0.02)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)  # a stopped engine must be able to die
            return (_spawns(ws)[1] - hung).total_seconds()
        finally:
            stop(daemon)
            run([*reconcile_argv(), "down", *ws.common()], env=ws.env())


def bench(trials: int = 3) -> list[Row]:
    took = [_trial() for _ in range(trials)]
    return [
        Row(
            SECTION,
            f"hung engine (SIGSTOP) to its replacement's spawn: liveness every {PERIOD:g} s, "
            f"timeout {TIMEOUT:g} s, {THRESHOLD} failures, grace {GRACE:g} s",
            "s",
            took,
            goal=f"≤ {GOAL_S:g} s",
            met=median(took) <= GOAL_S,
        )
    ]


if __name__ == "__main__":  # pragma: no cover
    for row in bench():
        print(row)
