"""A daemon's stop while a start waits for GPU memory (reconciler/memwait.py): the wait
ends at once, the daemon exits 0, and the start is given up as if never begun: Pending,
its lease given back, nothing failed, no restart counted; the next run starts it. The
free memory comes from the fake NVML file (``RECONCILE_FAKE_NVML``'s ``free`` lines)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

GI = 1 << 30
# The gate waits 30 s (memwait.DEFAULT_WAIT): an exit within this proves the stop ended
# it (0.5 s here, the gate's poll), with room for a loaded box's shutdown. Were it late,
# the record says so too: the old wait's end backed the start off, holding its lease.
STOP_WITHIN = 15.0


def test_a_sigterm_ends_a_start_waiting_for_gpu_memory_at_once(reconcile: Any, daemon: Any) -> None:
    fake = _one_gpu(reconcile, free=1 * GI)
    d = daemon()
    d.wait(lambda: _waiting(reconcile), "the start's 'waiting up to' event")

    _stopped_at_once(d)

    record = reconcile.record("web")
    assert record is not None
    assert record["phase"] == "Pending", record
    assert not record["devices"] and record["port"] is None and record["nonce"] is None, record
    assert record["restarts"] == 0 and record["ref"] is None, record
    assert "stopped while the start waited for GPU memory" in record["message"], record
    outcomes = [e.get("outcome") for e in reconcile.events("web")]
    assert "failed" not in outcomes and "not started" not in outcomes, outcomes
    assert not reconcile.pids("web")

    # The next run starts it, once the memory is free.
    _free(fake, 80 * GI)
    reconcile.converge()
    assert reconcile.status("web")["web"]["phase"] == "Ready"
    reconcile.down()


def _one_gpu(reconcile: Any, free: int) -> Path:
    """``web`` wanting 20 GiB of ``nvidia:0``, whose fake NVML says ``free``; the file."""
    reconcile.devices = "nvidia:0=80Gi"
    fake: Path = reconcile.tmp / "nvml.jsonl"
    _free(fake, free)
    reconcile.env["RECONCILE_FAKE_NVML"] = str(fake)
    reconcile.write("web", devices={"count": 1, "kind": "nvidia", "memory": "20Gi"})
    return fake


def _free(fake: Path, free: int) -> None:
    fake.write_text(json.dumps({"device": "nvidia:0", "free": free}) + "\n")


def _stopped_at_once(d: Any) -> None:
    began = time.monotonic()
    code = d.stop()
    took = time.monotonic() - began
    assert code == 0, d.tail()
    assert took < STOP_WITHIN, f"the daemon took {took:.1f}s to stop:\n{d.tail()}"


def _waiting(reconcile: Any, action: str = "start") -> bool:
    events = reconcile.events("web")
    return any(e["action"] == action and "waiting up to" in e["reason"] for e in events)


def test_a_sigterm_ends_a_restart_waiting_for_gpu_memory_counting_no_restart(
    reconcile: Any, daemon: Any, finish: Any
) -> None:
    fake = _one_gpu(reconcile, free=80 * GI)
    d = daemon()
    first = d.wait(lambda: _ready(reconcile), "web Ready")
    _free(fake, 1 * GI)
    os.kill(first["pid"], signal.SIGKILL)  # its restart waits for the memory
    d.wait(lambda: _waiting(reconcile, "restart"), "the restart's 'waiting up to' event")

    _stopped_at_once(d)
    record = reconcile.record("web")
    assert record is not None and record["phase"] == "Pending", record
    assert not record["devices"] and record["port"] is None and record["nonce"] is None, record
    assert record["restarts"] == 0, record  # the restart never ran: not counted
    assert record["last_exit"] is not None, record  # the exit that was, kept
    assert not reconcile.pids("web")

    _free(fake, 80 * GI)
    again = daemon()
    again.wait(lambda: _ready(reconcile), "web Ready again")
    finish(again)


def _ready(reconcile: Any) -> dict[str, Any] | None:
    item: dict[str, Any] | None = reconcile.status("web").get("web")
    return item if item is not None and item["phase"] == "Ready" else None
