"""A daemon stopped (SIGSTOP, a debugger, a paused VM) beside the verbs.

It holds its lock, so to every verb a daemon runs; it acts on nothing until SIGCONT. The
verbs that read return as ever and `status` names it; those that hand work to it say it
is stopped instead of waiting on it, and the work asked is done once it goes on.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from test_daemon_loop import ready_pid, sleeper, started

from controller.cli.common import stopped_daemon
from controller.cli.gateway.startlock import stopped
from controller.failpoints import ENV as FAILPOINTS


def test_verbs_beside_a_stopped_daemon_say_so_and_return(
    reconcile: Any, daemon: Any, finish: Any
) -> None:
    """`restart` said "the daemon restarts it now" and waited its 10 minutes on a daemon
    that could do nothing, `uncordon` said it "starts its deployments now", and `status`
    showed the table as if all were well. Each names the stopped daemon and the move;
    `plan` and `devices` return as ever; the restart asked is done at the SIGCONT."""
    rc = reconcile
    d = started(rc, daemon, "web")
    pid = ready_pid(rc, "web")
    os.kill(d.pid, signal.SIGSTOP)
    try:
        rc.wait_for(lambda: stopped(d.pid), what="the daemon stopped")
        said = stopped_daemon(d.pid)
        status = rc("status", check=0)
        assert f"warning: {said}: no pass runs until it does" in status.err, status
        assert "web" in status.out, status
        assert rc("plan", check=0).code == 0  # in sync: it reads, and waits on no one
        assert "web" in rc("devices", check=0).out
        asked = rc("restart", "web", "--timeout", "20s", check=1)
        then = "it restarts web once it runs again; the request is kept"
        assert f"reconcile: {said}: {then}" in asked.err, asked
        assert f"reconcile: {said}: {then}" in rc("restart", "web", "--no-wait", check=0).err
        rc("drain", check=0)
        uncordoned = rc("uncordon", check=0)
        assert f"{said}: it starts its deployments once it runs again" in uncordoned.out
    finally:
        os.kill(d.pid, signal.SIGCONT)
    d.wait(lambda: (now := ready_pid(rc, "web")) and now != pid, "web restarted at the SIGCONT")
    finish(d)


def test_a_once_beside_a_daemon_stopped_in_its_pass_names_it(
    reconcile: Any, daemon: Any, finish: Any
) -> None:
    """A daemon stopped inside a pass holds the pass lock: a cron `--once` waited its lock
    timeout and said "held by pid N ... wait for it to finish, or stop that process", as
    for a pass at work. It names the stopped holder and `kill -CONT`."""
    rc = reconcile
    rc.write("web", **sleeper())
    d = daemon(env={FAILPOINTS: "reconciler.pass.locked=stop"})  # its first pass holds it
    try:
        rc.wait_for(lambda: stopped(d.pid), what="the daemon stopped in its pass")
        waited = rc("--once", "--lock-timeout", "1", check=1)
        said = (
            f"is held by pid {d.pid}, which is stopped (SIGSTOP, a debugger); gave up after "
            f"1s. `kill -CONT {d.pid}` and it goes on"
        )
        assert said in waited.err, waited
    finally:
        os.kill(d.pid, signal.SIGCONT)
    d.wait(lambda: ready_pid(rc, "web"), "web Ready: the pass went on")
    finish(d)


def test_a_second_daemon_beside_a_stopped_one_says_a_sigterm_waits_for_sigcont(
    reconcile: Any, daemon: Any, finish: Any
) -> None:
    """A second daemon on the state dir of a stopped one said "stop it first (systemctl
    stop reconcile, or kill N)": a plain `kill N` is not acted on until the daemon runs
    again, so the user waited on a daemon that never stopped. It names it stopped, and
    the SIGCONT its SIGTERM needs."""
    rc = reconcile
    d = started(rc, daemon, "web")
    os.kill(d.pid, signal.SIGSTOP)
    try:
        rc.wait_for(lambda: stopped(d.pid), what="the daemon stopped")
        second = rc(check=1)
        assert f"another reconcile daemon (pid {d.pid}) already runs" in second.err, second
        assert "stopped (SIGSTOP, a debugger)" in second.err, second
        assert f"kill {d.pid} && kill -CONT {d.pid}" in second.err, second
    finally:
        os.kill(d.pid, signal.SIGCONT)
    assert "stopped" not in rc(check=1).err  # running again: the usual words
    finish(d)
