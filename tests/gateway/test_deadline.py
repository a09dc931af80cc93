"""The gateway holds a request for a starting engine exactly as long as the daemon gives
that engine: the readiness deadline rendered onto the record, never a default of its own.

The gateway once waited its own 600 s for an Ollama engine the daemon had killed at the
recipe's 120 s; both now read ``Record.ready_deadline_seconds``.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from strategies import NODE, OWNER, entry, ref

from controller.core.devices.inventory import Inventory
from controller.core.state import Phase
from controller.gateway.routing.table import Table
from controller.reconciler.leases import RecordMaker
from controller.store.instances.records import RecordStore

# `ollama serve` that never answers: the engine stays Starting until its deadline.
NEVER_READY = """#!{python}
import time
time.sleep(3600)
"""


def test_the_gateway_waits_the_deadline_the_daemon_kills_at(tmp_path: Path) -> None:
    """No readiness in the spec: the Ollama recipe's deadline, on both sides."""
    e = entry("chat", engine="ollama", command=None, model="llama3")
    maker = RecordMaker(
        store=RecordStore(tmp_path), inventory=Inventory(), owner=OWNER, node=NODE, me=ref(1)
    )
    reserved = maker.reservation(e, devices=(), port=8000, extra_ports=()).record
    assert reserved.ready_deadline_at is not None and reserved.reserved_at is not None
    daemon = (reserved.ready_deadline_at - reserved.reserved_at).total_seconds()

    async def deadline() -> float:
        table = Table()
        table.update([replace(reserved, phase=Phase.STARTING)])
        return table.deadline("chat")

    assert asyncio.run(deadline()) == daemon
    assert daemon == reserved.ready_deadline_seconds == 120.0  # ollama.py's recipe
    # A Pending or Idle record (never rendered) states the same deadline.
    assert maker.pending(e, "no capacity").ready_deadline_seconds == daemon


def test_a_request_gives_up_when_the_daemon_does(
    reconcile: Any, gateway: Any, tmp_path: Path
) -> None:
    fake = tmp_path / "ollama"
    fake.write_text(NEVER_READY.format(python=sys.executable))
    fake.chmod(0o755)
    reconcile.write(
        "chat",
        engine="ollama",
        model="llama3",
        command=None,
        executable=str(fake),
        readiness={"deadlineSeconds": 2, "periodSeconds": 0.2},  # the recipe's probe stays
    )
    g = gateway()
    g.wait_phase("chat", "Starting")
    rec = reconcile.record("chat")
    assert rec is not None and rec["ready_deadline_seconds"] == 2.0

    answer = g.post("chat")  # held while the engine starts, then answered
    assert answer.status == 503, answer
    assert answer.headers.get("Retry-After"), answer.headers
    error = answer.json()["error"]
    assert error["code"] == "model_not_ready"
    assert "within its readiness deadline (2s)" in error["message"], error

    # The daemon gave up on the engine at that same deadline.
    def failed() -> bool:
        return any("readiness deadline" in e.get("reason", "") for e in reconcile.events("chat"))

    reconcile.wait_for(failed, timeout=30, what="the daemon's readiness-deadline failure")
    g.finish()
