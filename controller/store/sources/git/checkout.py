"""The checkout under ``<state>/git/checkout``: its lock (git.lock, and what a wait for it
stops: an orphaned git, a collection a rollback will not wait for), the status it is
read and changed by, the commit it is at, and what a git cut short leaves in it.
``GitSource`` (git/source.py) is this, its fetches (git/fetching.py), its moves
(git/moving.py) and its pins (git/pins.py)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from controller.store import sidefiles
from controller.store.lock import FileLock
from controller.store.sources.git import orphan as gitorphan
from controller.store.sources.git.keep import drop_partial
from controller.store.sources.git.settings import GitSettings
from controller.store.sources.git.status import (
    SourceStatus,
    checkout_dir,
    checkout_lock,
    manifests_dir,
    read_status,
    status_document,
)
from controller.store.statedir import StateDir

MOVE_WAIT = 60.0  # seconds, past the holder's fetch limit, to wait for git.lock (its move)
RETRY_FIRST = 5.0  # seconds before the first retry of a failed fetch, doubling ...
RETRY_MAX = 300.0  # ... up to this (or the interval, when shorter)


@dataclass
class SyncResult:
    revision: str | None  # the source's commit checked out now (None: none of its yet)
    fetched: bool = False
    moved: bool = False
    error: str | None = None
    events: list[str] = field(default_factory=list)
    move_failed: str | None = None  # a move's first failure for its commit: said once
    # A `--once` beside the daemon whose fetches fail (the source is PullFailed, its
    # state), this run's own fetch gone through: why the node is PullFailed, and the move.
    daemon_failing: str | None = None

    def add(self, later: SyncResult) -> None:
        """A later fetch's news after this one's: its error says how fetching goes now."""
        self.fetched |= later.fetched
        self.error = later.error
        self.events += later.events


class Checkout:
    """The checkout's state shared by its roles (their mixins)."""

    def __init__(
        self,
        state_dir: Path,
        s: GitSettings,
        *,
        always_fetch: bool = True,
        identify: gitorphan.Identify | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.settings = s
        # The first sync of a process fetches (a --once, a daemon's start); later ones when
        # due (the interval, a retry's back-off, a webhook): never every pass.
        self.always_fetch = always_fetch
        # A rollback's own pass: it moves to a commit the checkout holds, and fetches
        # nothing (a remote that hangs is no wait: the next --once or daemon fetches).
        self.moves_only = False
        # A `--once` beside a live daemon that follows this source (its pid; set by the
        # CLI): the source's fetch state is the daemon's, one writer as one Argo CD
        # controller owns an app's sync status. This process's failed fetch is said and
        # never kept, its success keeps the daemon's failure: their credentials may differ
        # (a token in the daemon's URL lives in its memory alone), and each wrote over the
        # other's outcome, so the node's notifications flapped PullFailed/Synced.
        self.beside_daemon: int | None = None
        self._failed_aside: str | None = None  # its last fetch's failure, beside the daemon
        self.repo = checkout_dir(state_dir)
        self.marker = StateDir(state_dir).git_moving
        self._fetch_pid: int | None = None  # the fetch's git in flight (its collection's too)
        self._giving_up = False  # the daemon is stopping: no fetch now
        self._making_way = False  # a rollback's move waits: the fetch in flight stops
        # Process identities (host.procs.live_identity): each git started under git.lock is
        # written down, and one a killed reconcile left holding it is stopped. None: neither.
        self.identify = identify
        # What the fetches since the last apply brought (the daemon fetches on a thread of
        # its own: its next pass reports them)
        self._news = SyncResult(revision=None)
        self._news_lock = threading.Lock()

    def _started(self, pid: int, verb: str = "") -> None:
        """A git started under git.lock: written down, to be stopped should we die (or,
        a collection, by a rollback that waits for the checkout)."""
        if self.identify is not None:
            gitorphan.note(self.state_dir, pid, self.identify, verb=verb)

    @contextlib.contextmanager
    def hold(
        self, waiting: Callable[[FileLock], None] | None = None, *, rollback: bool = False
    ) -> Iterator[FileLock]:
        """git.lock, for a fetch or a move (its own descriptor: the daemon's fetch thread
        and its passes each take theirs). Held by a git whose reconcile died (git/orphan.py),
        at once or while we wait, that git is stopped; held by a live reconcile, it is
        waited for, ``waiting`` told so first. ``rollback``: a rollback's pin, which waits
        for no housekeeping: a collection (``git gc``) under the lock, anyone's, is stopped
        too, as the daemon's ``make_way`` stops its own (the next fetch collects again)."""
        lock = self._lock()
        clear = self._make_way_for_rollback if rollback else self._stop_orphan
        if not lock.try_acquire():
            if not clear() and waiting is not None:
                waiting(lock)
            lock.acquire(self.lock_wait, meanwhile=clear)
        try:
            yield lock
        finally:
            lock.release()

    def _lock(self) -> FileLock:
        sidefiles.folder_for_write(StateDir(self.state_dir).git)
        return checkout_lock(self.state_dir)

    def _make_way_for_rollback(self) -> bool:
        if self._stop_orphan():
            return True
        found = (
            None if self.identify is None else gitorphan.housekeeping(self.state_dir, self.identify)
        )
        if found is not None:
            gitorphan.stop_housekeeping(found)
        return found is not None

    def _stop_orphan(self) -> bool:
        """Whether a git a killed reconcile left holding git.lock was found, and stopped."""
        if self.identify is None:
            return False
        found = gitorphan.orphan(self.state_dir, self.identify)
        if found is not None:
            gitorphan.stop(found)
        return found is not None

    @property
    def manifests(self) -> Path:
        return manifests_dir(self.state_dir, self.settings.path)

    @property
    def lock_wait(self) -> float:
        """How long to wait for git.lock: another reconcile's fetch (its limit), then its move."""
        return self.settings.timeout + MOVE_WAIT

    def status(self) -> SourceStatus:
        return self._current(read_status(self.state_dir))

    def _current(self, old: SourceStatus | None) -> SourceStatus:
        fresh = SourceStatus.fresh(self.settings)
        if old is None or old.owner != fresh.owner:
            return fresh  # another source: its history of fetches is not this one's
        if old.names() != fresh.names():
            # Another branch or tag of the same repository and path (the same owner, the
            # same records): what it applied runs on until this ref's commit is fetched,
            # as Flux serves the last artifact while a changed ref is fetched.
            return replace(fresh, applied=old.applied, last_applied_at=old.last_applied_at)
        return replace(
            old,
            interval=fresh.interval,
            owner=fresh.owner,
            timeout=fresh.timeout,
            webhook_secret_file=fresh.webhook_secret_file,
        )

    def change_status(self, change: Callable[[SourceStatus], object]) -> SourceStatus:
        """``source.json`` read, changed and written under its own lock (held for a read
        and a write, never across git): a fetch, a move, a pin and the pass's notes each
        change their own fields, and none loses another's."""

        def changed(old: SourceStatus) -> SourceStatus:
            st = self._current(old)  # a copy: the document writes only what changed
            change(st)
            return st

        fresh = SourceStatus.fresh(self.settings)
        return status_document(self.state_dir).update(changed, fresh, "git source file lock")

    @property
    def current(self) -> bool:
        """The checkout is whole at the commit this source applied (another branch's of
        the same repository and path, until this one's is fetched): a pass may read it.
        Else nothing of it is read (a first start, another url or path than the last, a
        move cut short): the move comes first, and the fetch it may need."""
        st = self.status()
        return st.applied is not None and st.applied == self._head()

    def _head(self) -> str | None:
        from controller.store.sources.git.rev import revision

        if not (self.repo / ".git").is_dir() or self.marker.exists():
            return None
        return revision(self.repo)

    def _unlock(self) -> None:
        """git's own lock files, and the partial download, left by a git we killed (or a
        reconcile killed mid-fetch): ours to remove under git.lock."""
        gitdir = self.repo / ".git"
        drop_partial(gitdir / "objects")
        for name in ("index.lock", "shallow.lock", "HEAD.lock", "packed-refs.lock", "gc.pid"):
            with contextlib.suppress(FileNotFoundError):
                (gitdir / name).unlink()
        refs = gitdir / "refs"
        if refs.is_dir():
            for stale in refs.rglob("*.lock"):
                with contextlib.suppress(FileNotFoundError):
                    stale.unlink()
