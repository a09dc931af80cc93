"""Named failpoints (etcd's gofail idea): crash or fail exactly there, on request.

A test arms points through the environment, read once at import::

    RECONCILE_FAILPOINTS="executor.spawn.before_record=kill,records.write.before_rename=enospc"

Actions: ``kill`` (SIGKILL this process), ``stop`` (SIGSTOP it: the harness acts
while it is frozen there, then sends SIGCONT), ``enospc`` / ``eio`` (raise ``OSError``
with that errno). ``name=kill@3`` fires at the third hit of the point instead of
the first (each point fires once). When ``RECONCILE_FAILPOINTS_LOG`` names a
file, every firing appends ``<name> <action> <pid>`` to it first, so a harness
can count the faults it injected.

Unarmed, a hit is one call that tests an empty dict: nothing else runs.
"""

from __future__ import annotations

import errno
import os
import signal
import threading

ENV = "RECONCILE_FAILPOINTS"
LOG_ENV = "RECONCILE_FAILPOINTS_LOG"
ACTIONS = ("kill", "stop", "enospc", "eio")

# Every point the code calls, with where it sits: the harness arms each of them.
POINTS = {
    "records.write.before_rename": "a record's tmp file is written and fsynced, not renamed",
    "records.write.before_dir_fsync": "renamed into place, directory not yet fsynced",
    "records.delete.after_unlink": "a record is unlinked, directory not yet fsynced",
    "reconciler.pass.locked": "the pass lock is held, nothing observed yet",
    "reconciler.reserve.after_write": "a reservation is written (placement lock held)",
    "reconciler.reserve.before_release": "all reservations written, placement lock not released",
    "executor.spawn.before_exec": "the reservation is on disk, the engine not yet spawned",
    "runtime.spawn.before_note": "the engine's process is forked, its spawn note not written",
    "executor.spawn.before_record": "the engine runs, its record does not hold the pid yet",
    "executor.spawn.after_record": "the record holds the pid, the event is not appended",
    "executor.stop.after_terminating": "the record says Terminating, no signal sent",
    "runtime.stop.after_signal": "the stop signal went to the group, grace not waited out",
    "executor.stop.after_delete": "the record is deleted, the event not appended",
    "executor.restart.after_sweep": "the old engine is swept, the fresh reservation not written",
    "executor.fail.before_write": "the exited engine is cleaned up, its record not updated",
    "executor.adopt.before_write": "an orphaned engine is about to be adopted",
    "executor.release.before_delete": "a dead reservation is swept, its record not deleted",
    "events.append.before_write": "an event is about to be appended to the journal",
}

# Reached only by a RollingUpdate (full_churn never makes one): tests/gateway/test_rolling.py
# SIGKILLs the daemon at each of them and checks the next pass converges with no leak.
ROLLING_POINTS = {
    "executor.promote.after_terminating": "the old record says Terminating, no signal sent",
    "executor.promote.after_rename": "the new record holds the name, `@next` not deleted",
}

# Reached only with a git source (store/sources/git/source.py): tests/git SIGKILLs the daemon
# at each.
GIT_POINTS = {
    "git.fetch.running": "a git fetch runs (the daemon dies, git finishes or dies alone)",
    "git.move.after_checkout": "the checkout moved, untracked files not yet cleaned",
    "git.pass.moved": "the pass moved the checkout and read it, nothing acted on yet",
}

# Reached only as the daemon ends: tests/daemon/test_daemon_loop.py stops it there and
# sends it a second SIGTERM.
DAEMON_POINTS = {
    "daemon.shutdown.closed": "the daemon's wake-up pipe is closed, its exit not yet said",
}

# Reached only by a torn activation file (store/side/activation.py): tests/integration/
# test_damaged_side_files.py stops the pass there while the gateway writes a request.
SIDE_POINTS = {
    "activation.write_back.before": "a torn activation set aside, its mtime not yet written back",
}

# Reached only by a spec.container engine: tests/containers/test_container_lifecycle.py SIGKILLs the
# pass at each of them (invariant 3 for containers: none left without a record, none doubled).
CONTAINER_POINTS = {
    "container.run.before_wait": "the runtime's `run` is started, the container maybe not yet",
    "container.run.after_start": "the container's main process runs, the pass has not its pid",
}


def _parse(value: str) -> dict[str, tuple[str, int]]:
    armed: dict[str, tuple[str, int]] = {}
    for item in value.split(","):
        name, _, spec = item.strip().partition("=")
        if not name:
            continue
        action, _, nth = spec.partition("@")
        if action not in ACTIONS:
            raise ValueError(f"{ENV}: {item!r}: action must be one of {', '.join(ACTIONS)}")
        armed[name] = (action, int(nth) if nth else 1)
    return armed


_ARMED = _parse(os.environ.get(ENV, ""))
_hits: dict[str, int] = {}
_lock = threading.Lock()


def rearm() -> None:
    """Armed again from this process's environment, as at the import: for a process forked
    from one that had imported this module (the suite's warm CLI, tests/warmcli.py)."""
    global _ARMED
    _ARMED = _parse(os.environ.get(ENV, ""))
    _hits.clear()


def hit(name: str) -> None:
    """A failpoint: free unless armed through ``RECONCILE_FAILPOINTS``."""
    if _ARMED:
        _maybe_fire(name)


def _maybe_fire(name: str) -> None:
    armed = _ARMED.get(name)
    if armed is None:
        return
    action, nth = armed
    with _lock:  # teardowns run in threads: each point fires once
        _hits[name] = count = _hits.get(name, 0) + 1
    if count != nth:
        return
    _note(name, action)
    if action in ("kill", "stop"):
        os.kill(os.getpid(), signal.SIGKILL if action == "kill" else signal.SIGSTOP)
        return  # stopped, and continued: the code goes on from here
    code = errno.ENOSPC if action == "enospc" else errno.EIO
    raise OSError(code, f"{os.strerror(code)} (failpoint {name})")


def _note(name: str, action: str) -> None:
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, f"{name} {action} {os.getpid()}\n".encode())
    finally:
        os.close(fd)
