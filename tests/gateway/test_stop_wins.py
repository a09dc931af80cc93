"""`reconcile gateway stop` wins over the daemon's restart of a crashed gateway, as
`systemctl stop` over a restart policy: real daemon, gateway processes and sockets.

A stop that lands while the daemon waits out a crash's back-off, or while the gateway it
restarts is still starting (not yet registered: the stop once found nothing to stop), leaves
no gateway serving until SIGHUP asks for one again; `gateway status` says it was stopped,
and that SIGHUP to the daemon starts it again. `gateway restart` then starts it (it
said "no gateway runs"), and the daemon watches the new one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from typing import Any

import psutil
import pytest
from procs import GATEWAY_MARKER, marked_pids

WAIT = 40.0
NOT_STARTED = "gateway not started: `reconcile gateway stop` asked it stopped"
STOPPED = "gateway stopped (not a crash)"
FOLLOWED = "gateway started by `reconcile gateway restart`; watching it"


def said(g: Any, event: str) -> int:
    return sum(f'"event": "{event}' in line for line in g.text().splitlines())


def gateway_pids(rc: Any) -> set[int]:
    return marked_pids(f"{rc.node}/", GATEWAY_MARKER)


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def kill_serving(rc: Any, g: Any) -> int:
    pid = g.serving().ref.pid
    os.kill(pid, signal.SIGKILL)
    return pid


def in_back_off(rc: Any, g: Any) -> None:
    """Two crashes in a row: the second restart waits out a back-off (1 s)."""
    first = kill_serving(rc, g)
    rc.wait_for(
        lambda: (i := g.serving_or_none()) is not None and i.ref.pid != first,
        timeout=WAIT,
        what="the gateway restarted",
    )
    kill_serving(rc, g)
    # Its crash, or its death before it said it serves: either restart waits out 1 s.
    rc.wait_for(lambda: crashes(g) == 2, timeout=WAIT, what="the second crash seen")


def crashes(g: Any) -> int:
    return said(g, "gateway exited unexpectedly") + said(g, "gateway ended while it started")


def while_starting(rc: Any, g: Any) -> None:
    """The restarted gateway's process runs (it imports, binds, registers): seen among the
    daemon's children, a cheaper look than a scan of every process's environment."""
    killed = kill_serving(rc, g)
    rc.wait_for(lambda: starting(g, killed), timeout=WAIT, what="a new gateway process")


def starting(g: Any, killed: int) -> bool:
    for child in psutil.Process(g.proc.pid).children():
        with contextlib.suppress(psutil.Error):
            if child.pid != killed and "controller.gateway" in child.cmdline():
                return True
    return False


@pytest.mark.parametrize("crash", [in_back_off, while_starting], ids=["back-off", "starting"])
def test_a_stop_during_a_crash_restart_wins_until_sighup(
    reconcile: Any, gateway: Any, crash: Any
) -> None:
    reconcile.write("alpha")
    g = gateway()
    g.wait_phase("alpha", "Ready")
    try:
        crash(reconcile, g)
        reconcile("gateway", "stop", check=0)
        # The keeper settles: it started none, or the one it was starting was stopped.
        reconcile.wait_for(
            lambda: said(g, NOT_STARTED) or said(g, STOPPED), timeout=WAIT, what="its look"
        )
        assert gateway_pids(reconcile) == set(), g.text()[-3000:]
        assert refused(g.port)
        # `gateway status` says why none runs, and what starts it again.
        said_now = reconcile("gateway", check=1).out
        assert "stopped by `reconcile gateway stop` at " in said_now, said_now
        assert "SIGHUP (`kill -HUP` the daemon) or its next start" in said_now, said_now
        # SIGHUP asks for it again.
        g.proc.send_signal(signal.SIGHUP)
        reconcile.wait_for(g.serving_or_none, timeout=WAIT, what="the gateway started on SIGHUP")
        assert g.post("alpha").status == 200
    finally:
        g.finish()


def test_a_restart_after_a_stop_starts_it_and_the_daemon_watches_it(
    reconcile: Any, gateway: Any
) -> None:
    """`reconcile gateway restart` after `gateway stop` starts the gateway again with the
    stopped one's settings, as `systemctl restart` starts a stopped unit (it said "no
    gateway runs"), and the daemon that left it stopped watches the new one: its crash is
    restarted."""
    reconcile.write("alpha")
    g = gateway()
    try:
        g.wait_phase("alpha", "Ready")
        first = g.serving()
        reconcile("gateway", "stop", check=0)
        reconcile.wait_for(lambda: said(g, STOPPED), timeout=WAIT, what="the stop seen")
        started = reconcile("gateway", "restart", check=0)
        how = f"started again: pid {first.ref.pid} was stopped by `reconcile gateway stop`"
        assert how in started.out, started
        second = g.serving()
        assert g.post("alpha").status == 200
        reconcile.wait_for(lambda: said(g, FOLLOWED), timeout=WAIT, what="the daemon's watch")
        os.kill(second.ref.pid, signal.SIGKILL)
        reconcile.wait_for(
            lambda: (i := g.serving_or_none()) is not None and i.ref.pid != second.ref.pid,
            timeout=WAIT,
            what="the crash restarted by the daemon",
        )
        assert g.post("alpha").status == 200
    finally:
        g.finish()
