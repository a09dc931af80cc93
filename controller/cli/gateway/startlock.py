"""The gateway's start lock (``registry.start_lock``) as the gateway verbs take it.

A start under way (the daemon's keeper, another `gateway restart`) is waited for, so what
a verb then says of the port is true: two restarts at once both said they took the port
over from the same gateway. A holder that is stopped (SIGSTOP, a debugger) is not waited
for: it lets go only once resumed, and the wait held `gateway stop` 25 s for nothing.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from controller.errors import LockTimeout
from controller.gateway.lifecycle import registry
from controller.host import procstat
from controller.store.lock import FileLock


class _HolderStopped(Exception):
    def __init__(self, pid: int) -> None:
        self.pid = pid


@contextlib.contextmanager
def taken(state_dir: Path, *, stopped_means: str) -> Iterator[None]:
    """Held while the body runs, after a start under way (said on stdout as the wait
    begins). Not held when its holder is stopped or hangs past ``START_LOCK_WAIT``: a
    warning says so, ending with ``stopped_means`` (what the verb does meanwhile, and what
    the holder may do once resumed)."""
    lock = registry.start_lock(state_dir)
    # Where no gateway ever ran (no folder), nothing can be starting.
    held = registry.folder(state_dir).is_dir() and _take(lock, stopped_means)
    try:
        yield
    finally:
        if held:
            lock.release()


def _take(lock: FileLock, stopped_means: str) -> bool:
    if lock.try_acquire():
        return True
    try:
        _wait(lock)
    except _HolderStopped as exc:
        print(
            f"warning: the gateway start lock ({lock.path}) is held by pid {exc.pid}, which "
            f"is stopped (SIGSTOP or a debugger; `kill -CONT {exc.pid}` resumes it): not "
            f"waiting for it; {stopped_means}",
            file=sys.stderr,
        )
        return False
    except LockTimeout as exc:  # a start that hangs running: go on without it
        print(f"warning: {exc}; {stopped_means}", file=sys.stderr)
        return False
    return True


def _wait(lock: FileLock) -> None:
    """The lock, once the start holding it ends; _HolderStopped as soon as it is seen
    stopped (now, or at any look of the wait)."""
    holder = _look(lock)
    print(f"a gateway start is under way (pid {holder or '?'}): waiting for it to end", flush=True)
    lock.acquire(registry.START_LOCK_WAIT, meanwhile=lambda: _look(lock))


def _look(lock: FileLock) -> int | None:
    pid = lock.holder()
    if pid is not None and stopped(pid):
        raise _HolderStopped(pid)
    return pid


def stopped(pid: int) -> bool:
    """Stopped by a signal or a tracer (state T or t): it does nothing until resumed."""
    facts = procstat.stat(pid)
    return facts is not None and facts.state in ("T", "t")
