"""The daemon never exits because the gateway it is starting went: real daemons and
gateway processes.

- a gateway SIGKILLed as the daemon starts it (before it said ``ready``): the daemon
  said "gateway: it exited with code -9" and exited 1; now it says the gateway ended
  while it started, starts another after a crash's back-off, and serves;
- a `reconcile gateway restart` that takes the port over from it after it said
  ``ready`` and before the daemon looked (the daemon SIGSTOPped meanwhile): the daemon
  said "gateway: ready" and exited 1; now it follows the gateway the restart started.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from procs import GATEWAY_MARKER, marked_pids

WAIT = 40.0


def _kill_gateways(reconcile: Any) -> set[int]:
    """SIGKILL every gateway process of the node found now (the first exists from its
    exec on, long before it imports the HTTP stack and says ``ready``)."""
    found = marked_pids(f"{reconcile.node}/", GATEWAY_MARKER)
    for pid in found:
        os.kill(pid, signal.SIGKILL)
    return found


def _serving_again(g: Any, killed: set[int]) -> Any:
    """The gateway serving now if it is none of ``killed``; the daemon's end is a failure."""
    if g.proc.poll() is not None:
        raise AssertionError(f"daemon exited {g.proc.returncode}:\n{g.text()[-3000:]}")
    info = g.serving_or_none()
    return info if info is not None and info.ref.pid not in killed else None


def test_a_gateway_killed_as_the_daemon_starts_it_is_started_again(
    reconcile: Any, gateway: Any
) -> None:
    reconcile.write("alpha")
    g = gateway(wait=False)
    killed = reconcile.wait_for(
        lambda: _kill_gateways(reconcile), timeout=WAIT, what="the daemon's gateway process"
    )
    try:
        second = reconcile.wait_for(
            lambda: _serving_again(g, killed), timeout=WAIT, what="a gateway started again"
        )
        g.wait_phase("alpha", "Ready")
        assert g.post("alpha").status == 200
        assert g.proc.poll() is None, g.text()[-3000:]
        text = g.text()
        # Killed before it answered (all but always: its imports take far longer than a
        # look), or just after: either way the daemon says it starts another.
        said = [f"gateway pid {pid} was killed (SIGKILL) as it started" for pid in killed]
        before = "gateway ended while it started; restarting it" in text
        assert (before and any(line in text for line in said)) or (
            "gateway exited unexpectedly; restarting it" in text
        ), text[-3000:]
        assert second.port == g.port
    finally:
        g.finish()


def _first_gateway(reconcile: Any) -> int | None:
    found = marked_pids(f"{reconcile.node}/", GATEWAY_MARKER)
    return min(found) if found else None


def test_a_gateway_replaced_before_the_daemon_looked_is_followed(
    reconcile: Any, gateway: Any
) -> None:
    reconcile.write("alpha")
    g = gateway(wait=False)
    stopped = False
    try:
        ours = reconcile.wait_for(
            lambda: _first_gateway(reconcile), timeout=WAIT, what="the daemon's gateway process"
        )
        # The daemon waits for its answer: held there (all but always: the gateway's
        # imports take far longer than a look) until another gateway took the port over.
        os.kill(g.proc.pid, signal.SIGSTOP)
        stopped = True
        reconcile.wait_for(
            lambda: (s := g.serving_or_none()) is not None and s.ref.pid == ours,
            timeout=WAIT,
            what="the daemon's gateway serving",
        )
        took = reconcile("gateway", "restart", check=0)
        assert f"took it over from pid {ours}" in took.out, took
        successor = g.serving()
        os.kill(g.proc.pid, signal.SIGCONT)
        stopped = False
        g.wait_phase("alpha", "Ready")
        assert g.post("alpha").status == 200
        assert g.serving().ref == successor.ref
        text = g.text()
        assert g.proc.poll() is None, text[-3000:]
        # Replaced before it looked, or (hardly ever) just after: either way it follows.
        assert (
            "gateway replaced while it started; following the one serving now" in text
            or "gateway handed over" in text
        ), text[-3000:]
    finally:
        if stopped:
            os.kill(g.proc.pid, signal.SIGCONT)
        g.finish()
