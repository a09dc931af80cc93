"""Engine exits, seen the moment they happen: one pidfd per engine in the loop's selector.

A pidfd turns readable when its process ends, for any process, not only our
children, so engines adopted from an earlier daemon are covered too. Where pidfds
are missing (not Linux, kernel < 5.3) the daemon falls back to ``check()`` on a
timer. Identity is (pid, start time) as everywhere (invariant 6): the descriptor
is opened first and the identity checked after, so it cannot name a reused pid.
"""

from __future__ import annotations

import contextlib
import os
import selectors
from collections.abc import Callable, Mapping

from controller.backends.base import Backend
from controller.core.state import ProcessRef

FALLBACK_PERIOD = 1.0  # seconds between liveness checks without pidfds

OnExit = Callable[[str, ProcessRef], None]


class ExitWatch:
    def __init__(self, selector: selectors.BaseSelector, runtime: Backend, on_exit: OnExit) -> None:
        self.selector = selector
        self.runtime = runtime
        self.on_exit = on_exit
        self.pidfds = hasattr(os, "pidfd_open")
        self._watched: dict[str, tuple[ProcessRef, int | None]] = {}
        self._reported: set[ProcessRef] = set()

    @property
    def polling(self) -> bool:
        """True when some engine has no pidfd and needs ``check()`` on a timer."""
        return any(fd is None for _, fd in self._watched.values())

    def sync(self, wanted: Mapping[str, ProcessRef]) -> None:
        """Watch exactly these engines; report (once) any that is already gone."""
        for name in list(self._watched):
            if wanted.get(name) != self._watched[name][0]:
                self._forget(name)
        self._reported &= set(wanted.values())  # a ref no record names cannot come back
        for name, ref in wanted.items():
            if name not in self._watched:
                self._watch(name, ref)

    def check(self) -> None:
        """The fallback: a liveness check of every engine watched without a pidfd."""
        for name, (ref, fd) in list(self._watched.items()):
            if fd is None and not self.runtime.alive(ref):
                self._fire(name)

    def close(self) -> None:
        for name in list(self._watched):
            self._forget(name)

    def _watch(self, name: str, ref: ProcessRef) -> None:
        fd = self._open(ref.pid)
        if not self.runtime.alive(ref):
            if fd is not None:
                os.close(fd)
            if ref not in self._reported:
                self._reported.add(ref)
                self.on_exit(name, ref)
            return
        self._watched[name] = (ref, fd)
        if fd is not None:
            self.selector.register(fd, selectors.EVENT_READ, lambda: self._fire(name))

    def _open(self, pid: int) -> int | None:
        if not self.pidfds:
            return None
        try:
            return os.pidfd_open(pid)
        except ProcessLookupError:
            return None  # already gone: the identity check says so
        except OSError:
            self.pidfds = False  # ENOSYS, or a sandbox forbids it: poll instead
            return None

    def _fire(self, name: str) -> None:
        ref = self._forget(name)
        if ref is not None and ref not in self._reported:
            self._reported.add(ref)
            self.on_exit(name, ref)

    def _forget(self, name: str) -> ProcessRef | None:
        entry = self._watched.pop(name, None)
        if entry is None:
            return None
        ref, fd = entry
        if fd is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(fd)
            os.close(fd)
        return ref
