"""The git source's fetches, on a thread of their own beside the daemon's loop.

Flux's source-controller fetches and its kustomize-controller applies the last good
artifact; Argo CD's repo-server does the same for its application controller. Here the
fetch takes git.lock alone (``GitSource.fetch``), so while a remote hangs for the fetch's
limit the loop's passes go on, on the commit applied: a crashed engine restarts in its
back-off, probes count, `down` and a cron `--once` of another set get the pass lock. The
fetch's end asks for a pass, which moves the checkout to what it brought.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from controller.errors import ReconcileError
from controller.logsetup import get_logger

if TYPE_CHECKING:  # a daemon that follows no git source never loads it
    from controller.store.sources.git.source import GitSource

log = get_logger("reconcile")

STOP_WAIT = 10.0  # seconds a stopping daemon waits for the fetch it stopped to end


class Fetcher:
    """One fetch at a time; ``done`` (called on the fetch's thread) asks for a pass."""

    def __init__(self, done: Callable[[], None]) -> None:
        self._done = done
        self._thread: threading.Thread | None = None
        self._source: GitSource | None = None
        # In flight: cleared before ``done``, so the pass it asks for arms the next fetch
        # (the thread itself may still be ending then)
        self._busy = False
        # Why the last fetch could not even begin (git.lock not had, the state dir not
        # writable): the next waits a resync, not a loop of tries (None: it began).
        self.failed: str | None = None

    @property
    def busy(self) -> bool:
        return self._busy

    def start(self, source: GitSource) -> None:
        """``source`` fetches now, when it is due and no fetch is in flight."""
        if self._busy:
            return
        self._busy = True
        self._source = source
        self._thread = threading.Thread(target=self._run, args=(source,), name="git fetch")
        self._thread.daemon = True  # a stop kills its git first (give_up): nothing to wait on
        self._thread.start()

    def _run(self, source: GitSource) -> None:
        self.failed = "the fetch thread failed"  # until it ends (a bug: its traceback)
        try:
            source.fetch()
            self.failed = None
        except (ReconcileError, OSError) as exc:
            self.failed = str(exc)
            log.error("git fetch could not start", error=self.failed)
        finally:
            self._busy = False
            self._done()

    def make_way(self) -> None:
        """A rollback's move waits for git.lock: the fetch in flight is stopped (as no
        failure; ``GitSource.make_way`` says why), and its end asks for the pass that moves."""
        if self._busy and self._source is not None:
            self._source.make_way()

    def give_up(self) -> None:
        """The daemon is stopping: the fetch in flight is stopped, and none starts."""
        if self._source is not None:
            self._source.give_up_fetch()

    def close(self) -> None:
        if self._thread is not None:
            self._thread.join(STOP_WAIT)
