"""The gateway's start lock as the verbs take it: real daemons, CLI processes and gateway
processes.

- two `reconcile gateway restart` at once: both said they took the port over from the
  same gateway; the second now waits for the start under way, and each says the truth:
  the second took it over from the gateway the first started;
- a daemon SIGSTOPped inside its own gateway start holds the start lock: `gateway stop`
  waited 25 s for it, then warned and stopped what was registered; it now sees the holder
  stopped, says so (and what that start may still do), and stops what serves at once;
- ... and where that start's gateway had not registered yet, the stop found nothing to
  stop and, once both went on, that gateway served: the stop undone. It stops itself now.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
from typing import Any

import psutil

from controller.gateway.lifecycle import registry

WAIT = 40.0
# sitecustomize for the daemon's processes: a gateway process (its marker) stops itself as
# it begins, once (the file named by HOLD_ENV goes), so a test holds it before it registers.
HOLD_ENV = "RECONCILE_TEST_HOLD_GATEWAY"
HOLD = f"""
import os, signal
hold = os.environ.get({HOLD_ENV!r}, "")
if os.environ.get({registry.MARKER!r}) and hold and os.path.exists(hold):
    os.unlink(hold)
    os.kill(os.getpid(), signal.SIGSTOP)
"""
TOOK = re.compile(r"gateway pid (\d+) serves \S+ \(took it over from pid (\d+),")


def test_two_restarts_at_once_take_the_port_over_one_after_the_other(
    reconcile: Any, gateway: Any
) -> None:
    reconcile.write("alpha")
    g = gateway()
    try:
        g.wait_phase("alpha", "Ready")  # a pass: the daemon's start of its gateway is over
        first = g.serving()
        # Two processes started together: each imports for longer than the other takes
        # to start, so both look at the port before either's gateway serves.
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
        both = [reconcile.popen("gateway", "restart", **pipes) for _ in "ab"]
        # The second may wait out the first's whole start: the lock's wait, then its own.
        said = [b"".join(proc.communicate(timeout=3 * WAIT)).decode() for proc in both]
        assert [proc.returncode for proc in both] == [0, 0], said
        took = [TOOK.search(text) for text in said]
        assert all(took), said
        # Each names the gateway it took the port over from: the one that served, then
        # that one's successor; never both the same.
        chain = dict(m.group(2, 1) for m in took if m)
        assert len(chain) == 2, said
        middle = chain[str(first.ref.pid)]
        assert g.serving().ref.pid == int(chain[middle]), said
        assert g.request("GET", "/healthz").status == 200
    finally:
        g.finish()


def _starting(g: Any) -> bool:
    """The daemon's gateway process runs (it imports, binds) and the daemon holds the
    start lock, waiting for its answer."""
    children = psutil.Process(g.proc.pid).children()
    return _holds_start_lock(g.rc) and any(_is_gateway(child) for child in children)


def _is_gateway(proc: psutil.Process) -> bool:
    try:
        return "controller.gateway" in proc.cmdline()
    except psutil.Error:
        return False


def _holds_start_lock(reconcile: Any) -> bool:
    """Someone holds the start lock (the daemon: nothing else starts a gateway here)."""
    lock = registry.start_lock(reconcile.state)
    try:
        free = lock.try_acquire()
    except FileNotFoundError:  # its folder is not made yet
        return False
    lock.release()
    return not free


def test_a_stop_does_not_wait_for_a_daemon_stopped_in_its_gateway_start(
    reconcile: Any, gateway: Any
) -> None:
    reconcile.write("alpha")
    g = gateway(wait=False)
    stopped = False
    try:
        # The daemon takes the lock, then starts its gateway and waits for its answer:
        # a second of imports at least, against the instant from this look to the SIGSTOP.
        reconcile.wait_for(lambda: _starting(g), timeout=WAIT, what="the daemon's start")
        g.proc.send_signal(signal.SIGSTOP)
        stopped = True
        assert _holds_start_lock(reconcile), "the daemon's start ended before its SIGSTOP"
        serving = reconcile.wait_for(g.serving_or_none, timeout=WAIT, what="its gateway")

        done = reconcile("gateway", "stop", check=0)
        assert f"stopped gateway pid {serving.ref.pid}" in done.out, done
        held = f"is held by pid {g.proc.pid}, which is stopped (SIGSTOP or a debugger;"
        assert held in done.err, done
        assert f"`kill -CONT {g.proc.pid}` resumes it): not waiting for it" in done.err, done
        assert "gave up after" not in done.err, done
        assert not serving.alive()
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", g.port)) != 0  # none serves the port
    finally:
        if stopped:
            g.proc.send_signal(signal.SIGCONT)
        g.finish()


def test_a_stop_wins_over_the_gateway_a_stopped_daemon_was_starting(
    reconcile: Any, gateway: Any
) -> None:
    hooks = reconcile.tmp / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(HOLD)
    hold = reconcile.tmp / "hold"
    hold.touch()
    path = os.pathsep.join(p for p in (str(hooks), os.environ.get("PYTHONPATH")) if p)
    g = gateway(wait=False, env={"PYTHONPATH": path, HOLD_ENV: str(hold)})
    held = reconcile.wait_for(lambda: _held(g), timeout=WAIT, what="its gateway held as it began")
    g.proc.send_signal(signal.SIGSTOP)
    try:
        assert _holds_start_lock(reconcile), "the daemon's start is under way"
        done = reconcile("gateway", "stop", check=0)
        assert "no gateway runs" in done.out, done  # none registered: nothing it could stop
        assert f"is held by pid {g.proc.pid}, which is stopped" in done.err, done
        assert "stops itself, the stop asked first" in done.err, done
    finally:
        held.resume()
        g.proc.send_signal(signal.SIGCONT)
    reconcile.wait_for(lambda: _ended(held), timeout=WAIT, what="the gateway to stop itself")
    assert g.serving_or_none() is None
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", g.port)) != 0  # none serves the port
    status = reconcile("gateway", "status", check=None)
    assert "stopped by `reconcile gateway stop`" in status.out + status.err, status
    g.finish()


def _held(g: Any) -> psutil.Process | None:
    """The daemon's gateway process, stopped by itself as it began (HOLD)."""
    for child in psutil.Process(g.proc.pid).children():
        with contextlib.suppress(psutil.Error):
            if _is_gateway(child) and child.status() == psutil.STATUS_STOPPED:
                return child
    return None


def _ended(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
