"""File locks on ``flock``: the kernel releases them when the holder dies (invariant 7).

The fast path is one non-blocking ``flock``. When the lock is busy, a helper
thread blocks in the kernel (woken the instant the holder lets go, no polling)
while the caller waits with a timeout; a late grant is handed straight back.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from controller.errors import LockTimeout


def _open(path: Path) -> int:
    """The lock file, read-only where it exists (``flock`` needs no more): a descriptor
    open for writing makes its close an event in a watch of the folder (``pass.lock`` is
    in the state dir's top folder, which the gateway watches, and is taken every pass)."""
    try:
        return os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o600)


def _name_holder(path: Path, fd: int) -> None:
    """Name ourselves for the next waiter's error message, unless the file already does
    (the daemon's next pass). The content is advisory only: the flock alone decides who
    holds it."""
    mark = f"{os.getpid()}\n".ljust(12).encode()
    if os.pread(fd, len(mark), 0) == mark:
        return
    with contextlib.suppress(FileNotFoundError):  # removed since: it names nobody
        writer = os.open(path, os.O_WRONLY)
        try:
            os.pwrite(writer, mark, 0)
        finally:
            os.close(writer)


class FileLock:
    def __init__(self, path: Path, *, what: str = "lock") -> None:
        self.path = path
        self.what = what
        self._fd: int | None = None

    def acquire(
        self, timeout: float | None = 30.0, *, meanwhile: Callable[[], object] | None = None
    ) -> None:
        """``meanwhile``: called every MEANWHILE_EVERY seconds of a wait (git.lock's looks
        for a holder it may stop: store/sources/git/orphan.py)."""
        fd = _open(self.path)
        try:
            if not _try(fd) and not _wait(fd, timeout, meanwhile):
                raise LockTimeout(self._busy_message(timeout))
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        try:
            _name_holder(self.path, fd)
        except OSError as exc:  # a full disk: pwrite's error names no file, so say which
            self.release()
            raise OSError(exc.errno, exc.strerror, str(self.path)) from exc

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing drops the flock

    @property
    def fileno(self) -> int | None:
        """The locked descriptor: a child that inherits it holds the lock until it exits
        (store/sources/git/source.py hands it to git, so an orphaned git still holds its
        checkout)."""
        return self._fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def still_at_path(self) -> bool:
        """The file held is still the one at ``path``: False once the path is gone or names
        another file (its folder removed and made again, another disk mounted over it), where
        another process takes the lock on that file while this one holds its own."""
        if self._fd is None:
            return False
        try:
            there = os.stat(self.path)
        except OSError:
            return False
        held = os.fstat(self._fd)
        return (there.st_dev, there.st_ino) == (held.st_dev, held.st_ino)

    def holder(self) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            return int(self.path.read_text().strip() or "x")
        return None

    def _busy_message(self, timeout: float | None) -> str:
        pid = self.holder()
        if pid and not pid_alive(pid):  # a child inherited the descriptor (git: fileno's doc)
            return (
                f"the {self.what} ({self.path}) is held by a process that pid {pid} left "
                f"behind (pid {pid} has exited); gave up after {timeout:g}s. "
                f"`fuser -v {self.path}` names it: stop it, and the lock is free at once"
            )
        if pid and _stopped(pid):  # waiting longer changes nothing: say so, and the move
            return (
                f"the {self.what} ({self.path}) is held by pid {pid}, which is stopped "
                f"(SIGSTOP, a debugger); gave up after {timeout:g}s. `kill -CONT {pid}` and "
                "it goes on, then releases it"
            )
        who = f"pid {pid}" if pid else "another process"
        return (
            f"the {self.what} ({self.path}) is held by {who}; gave up after {timeout:g}s. "
            "Wait for it to finish, or stop that process (a dead holder releases it at once)"
        )

    @contextlib.contextmanager
    def hold(self, timeout: float | None = 30.0) -> Iterator[None]:
        self.acquire(timeout)
        try:
            yield
        finally:
            self.release()

    def try_acquire(self) -> bool:
        try:
            self.acquire(timeout=0)
        except LockTimeout:
            return False
        return True

    def take_again(self) -> bool:
        """Hold the file now at ``path`` (its folder replaced since) in place of the one
        held, if it is free; False, the old one still held, if it is not or cannot be."""
        fresh = FileLock(self.path, what=self.what)
        try:
            if not fresh.try_acquire():
                return False
        except OSError:  # no folder there (yet), or not ours to write
            return False
        self.release()
        self._fd, fresh._fd = fresh._fd, None
        return True


def pid_alive(pid: int) -> bool:
    """A process of that pid exists (another user's too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    return True


def _stopped(pid: int) -> bool:
    """Stopped by a signal or a tracer (state T or t in /proc: ``host.procstat``'s, read
    here, as store may not import host)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state in ("T", "t")


def _try(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


MEANWHILE_EVERY = 2.0  # seconds between a waiter's looks (acquire's ``meanwhile``)


def _wait(fd: int, timeout: float | None, meanwhile: Callable[[], object] | None = None) -> bool:
    if timeout is not None and timeout <= 0:
        return False
    # The waiter blocks on a dup of our descriptor (same open file, so a grant is
    # ours). If we give up first, the waiter closes its dup when the grant comes;
    # we have closed ours by then, so the lock drops at once.
    waiter_fd = os.dup(fd)
    decided = threading.Lock()
    granted = threading.Event()
    abandoned = False

    def wait() -> None:
        fcntl.flock(waiter_fd, fcntl.LOCK_EX)
        with decided:
            if abandoned:
                os.close(waiter_fd)
                return
            granted.set()

    threading.Thread(target=wait, name="flock-wait", daemon=True).start()
    try:
        _until(granted, timeout, meanwhile)
    finally:  # given up, or cut short (``meanwhile`` raised, Ctrl-C): the waiter lets go
        with decided:
            abandoned = not granted.is_set()
        if not abandoned:
            os.close(waiter_fd)
    return not abandoned


def _until(
    granted: threading.Event, timeout: float | None, meanwhile: Callable[[], object] | None
) -> None:
    """Wait for the grant, up to ``timeout``; ``meanwhile()`` between looks."""
    if meanwhile is None:
        granted.wait(timeout)
        return
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return
        if granted.wait(MEANWHILE_EVERY if left is None else min(left, MEANWHILE_EVERY)):
            return
        meanwhile()
