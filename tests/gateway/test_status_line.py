"""`reconcile status` says in one line above its table whether a gateway serves (only
`gateway status` said it): real daemons, gateway processes and files.

- a gateway serving: ``gateway: pid N serves HOST:PORT (since ...)``; `status -o json`
  stays the plain list of deployments (as with the git source's line);
- killed while its daemon runs: ``gateway: restarting (pid N at HOST:PORT ended without
  stopping; the daemon starts another)`` until the new one serves;
- killed with no daemon to start it again: ``gateway: none serves (pid N at HOST:PORT
  ended without stopping: reconcile gateway restart)``; once ``down --gateway`` forgot
  it, no line.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from controller.cli.gateway.startlock import stopped
from controller.gateway.lifecycle import registry

WAIT = 40.0


def test_status_says_which_gateway_serves_or_that_none_does(reconcile: Any, gateway: Any) -> None:
    reconcile.write("alpha")
    g = gateway()
    try:
        g.wait_phase("alpha", "Ready")
        first = g.serving()
        shown = reconcile("status", check=0).out.splitlines()
        assert shown[0].startswith(
            f"gateway: pid {first.ref.pid} serves {first.address} (since "
        ), shown
        assert shown[1].split()[0] == "NAME", shown  # the table follows
        listed = reconcile("status", "-o", "json", check=0).json()
        assert isinstance(listed, list) and [i["name"] for i in listed] == ["alpha"], listed

        assert g.stop() == 0  # the daemon ends; its gateway serves on
        os.kill(first.ref.pid, signal.SIGKILL)
        reconcile.wait_for(lambda: g.serving_or_none() is None, timeout=WAIT, what="it gone")
        shown = reconcile("status", check=0).out.splitlines()
        assert shown[0] == (
            f"gateway: none serves (pid {first.ref.pid} at {first.address} ended without "
            "stopping: reconcile gateway restart)"
        ), shown

        reconcile("down", "--gateway", check=0)  # forgets it: nothing to say
        assert not any(line.startswith("gateway:") for line in reconcile("status").out.splitlines())
    finally:
        if g.proc.poll() is None:
            g.stop()
        reconcile.down("--gateway")  # what a failure midway left running


def test_status_says_a_killed_gateway_is_restarting_until_its_successor_serves(
    reconcile: Any, gateway: Any
) -> None:
    """For a second or so after a SIGKILL the daemon forgets the dead gateway's file and
    starts another: `status` showed no gateway line then, as if none were wanted. The
    test holds the start lock, so the restart waits (as a back-off would) while it looks."""
    reconcile.write("alpha")
    g = gateway()
    g.wait_phase("alpha", "Ready")
    first = g.serving()
    said = (
        f"gateway: restarting (pid {first.ref.pid} at {first.address} ended without "
        "stopping; the daemon starts another)"
    )
    with registry.start_lock(reconcile.state).hold(10):
        os.kill(first.ref.pid, signal.SIGKILL)
        # The daemon forgets the dead one's member file, then waits for the lock.
        reconcile.wait_for(
            lambda: not registry.crashed(reconcile.state, first.nonce),
            timeout=WAIT,
            what="the crash forgotten",
        )
        shown = reconcile("status", check=0).out.splitlines()
        assert shown[0] == said, shown
    second = reconcile.wait_for(
        lambda: (s := g.serving_or_none()) is not None and s.ref.pid != first.ref.pid and s,
        timeout=WAIT,
        what="its successor",
    )
    shown = reconcile("status", check=0).out.splitlines()
    assert shown[0].startswith(f"gateway: pid {second.ref.pid} serves "), shown
    g.finish()


def test_a_killed_gateway_whose_daemon_is_stopped_names_the_daemon_not_none(
    reconcile: Any, gateway: Any
) -> None:
    """The daemon SIGSTOPped (a debugger, a paused VM) when its gateway was killed: `gateway
    status` said "no daemon started it again" and `status` "the daemon starts another",
    though a daemon held the lock and nothing would start one until it ran again."""
    reconcile.write("alpha")
    g = gateway()
    g.wait_phase("alpha", "Ready")
    first = g.serving()
    g.proc.send_signal(signal.SIGSTOP)
    try:
        reconcile.wait_for(lambda: stopped(g.proc.pid), what="the daemon stopped")
        os.kill(first.ref.pid, signal.SIGKILL)
        reconcile.wait_for(lambda: g.serving_or_none() is None, timeout=WAIT, what="it gone")
        shown = reconcile("gateway", "status", check=1).out
        line = reconcile("status", check=0).out.splitlines()[0]
    finally:
        g.proc.send_signal(signal.SIGCONT)
    pid = g.proc.pid
    assert f"pid {first.ref.pid} ({first.address}), ended without stopping" in shown, shown
    said = f"the daemon (pid {pid}) that starts it again is stopped (SIGSTOP, a debugger)"
    assert said in shown and f"`kill -CONT {pid}`, and it starts one" in shown, shown
    assert line == (
        f"gateway: none serves (pid {first.ref.pid} at {first.address} ended without "
        f"stopping; the daemon, pid {pid}, is stopped: kill -CONT)"
    ), line
    reconcile.wait_for(  # running again, it starts one
        lambda: (s := g.serving_or_none()) is not None and s.ref.pid != first.ref.pid,
        timeout=WAIT,
        what="its successor",
    )
    g.finish()
