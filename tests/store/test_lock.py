"""The placement lock: flock with a timeout; a dead holder never blocks anyone (invariant 7)."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from fsevents import Writes

from controller.errors import LockTimeout, ReconcileError
from controller.store.lock import FileLock

HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
os.pwrite(fd, f"{os.getpid()}\\n".ljust(12).encode(), 0)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "placement.lock"


@pytest.fixture
def holder(path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the lock (for up to a minute)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), "60"], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    yield proc
    proc.kill()
    proc.wait()
    proc.stdout.close()


def test_acquire_and_release(path: Path) -> None:
    lock = FileLock(path)
    with lock.hold(timeout=1):
        assert lock.held
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert lock.holder() == os.getpid()
    assert not lock.held
    with lock.hold(timeout=0):  # free again at once
        pass


def test_a_lock_that_names_its_taker_already_is_taken_without_a_write(path: Path) -> None:
    """The daemon takes pass.lock every pass, in the folder the gateway watches: a
    pwrite of the same pid, and a descriptor open for writing, each woke that watch."""
    lock = FileLock(path)
    with lock.hold(timeout=1):
        pass
    with Writes(path.parent) as writes:
        with lock.hold(timeout=1):
            assert lock.holder() == os.getpid()
        assert writes.taken() == []  # before: modify, close_write
    path.write_text("1\n")  # another taker's name, left behind
    with lock.hold(timeout=1):
        assert lock.holder() == os.getpid()


def test_busy_lock_times_out_naming_the_holder(path: Path, holder: subprocess.Popen[str]) -> None:
    lock = FileLock(path, what="placement lock")
    with pytest.raises(LockTimeout) as info:
        lock.acquire(timeout=0.2)
    message = str(info.value)
    assert f"the placement lock ({path}) is held by pid {holder.pid}" in message
    assert "gave up after 0.2s" in message and "a dead holder releases it at once" in message
    assert not lock.held
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, ReconcileError)


ORPHANING = """
import fcntl, os, subprocess, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
os.pwrite(fd, f"{os.getpid()}\\n".ljust(12).encode(), 0)
child = subprocess.Popen(
    ["sleep", "60"], pass_fds=(fd,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
)
print(child.pid, flush=True)
"""


def test_a_lock_kept_by_a_dead_holder_s_child_says_so(path: Path) -> None:
    """A git that outlived its reconcile holds git.lock through the descriptor it
    inherited: the message named the dead pid and said a dead holder releases it at once."""
    proc = subprocess.run(
        [sys.executable, "-c", ORPHANING, str(path)], capture_output=True, text=True, timeout=30
    )
    child, dead = int(proc.stdout), int(path.read_text().strip())
    try:
        with pytest.raises(LockTimeout) as info:
            FileLock(path, what="git checkout lock").acquire(timeout=0.2)
        message = str(info.value)
        assert "dead holder releases it at once" not in message, message
        assert f"a process that pid {dead} left behind (pid {dead} has exited)" in message
        assert f"`fuser -v {path}` names it" in message, message
    finally:
        os.kill(child, signal.SIGKILL)
        _reap(child)
    FileLock(path).acquire(timeout=10)  # free once the child is gone


def _reap(pid: int) -> None:
    """The orphan is init's child now: wait until it is gone (a deadline, no sleep)."""
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(pid).wait(timeout=10)


def test_try_acquire(path: Path, holder: subprocess.Popen[str]) -> None:
    assert not FileLock(path).try_acquire()


def test_a_holder_killed_by_sigkill_releases_the_lock(
    path: Path, holder: subprocess.Popen[str]
) -> None:
    lock = FileLock(path)
    assert not lock.try_acquire()
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    lock.acquire(timeout=10)  # the kernel dropped the dead holder's flock
    lock.release()


def test_a_waiter_gets_the_lock_when_the_holder_lets_go(path: Path) -> None:
    first, second = FileLock(path), FileLock(path)
    first.acquire(timeout=0)
    got = threading.Event()

    def wait() -> None:
        second.acquire(timeout=30)
        got.set()

    thread = threading.Thread(target=wait)
    thread.start()
    assert not got.wait(0.2)  # blocked while held
    first.release()
    thread.join(timeout=30)
    assert got.is_set() and second.held
    second.release()


def test_a_waiter_that_gave_up_does_not_keep_a_late_grant(path: Path) -> None:
    before = set(threading.enumerate())
    first = FileLock(path)
    first.acquire(timeout=0)
    with pytest.raises(LockTimeout):
        FileLock(path).acquire(timeout=0.1)  # its helper thread still waits in the kernel
    helpers = [t for t in threading.enumerate() if t not in before and t.name == "flock-wait"]
    assert len(helpers) == 1 and helpers[0].is_alive()  # the late grant is still to come
    first.release()  # the helper gets the grant and must hand it straight back
    helpers[0].join(timeout=10)
    assert not helpers[0].is_alive(), "the abandoned waiter never got the grant"
    # The grant has come and gone: the lock is free NOW (a waiting acquire would hide a
    # grant kept for a while, or race the helper for it and win).
    third = FileLock(path)
    assert third.try_acquire(), "the abandoned waiter kept the grant"
    third.release()


def test_lock_file_content_is_advisory_only(path: Path) -> None:
    path.write_text("99999999\n")
    with FileLock(path).hold(timeout=0):
        pass


def test_a_wait_cut_short_by_its_meanwhile_leaves_no_claim_behind(
    path: Path, holder: subprocess.Popen[str]
) -> None:
    """``acquire(meanwhile=)`` looks between waits (git.lock's orphaned git): a look that
    raises ends the wait, and the kernel wait behind it must let go too, or it takes the
    lock when the holder ends and keeps it for good in this process."""
    looks: list[int] = []

    def look() -> None:
        looks.append(1)
        raise RuntimeError("cannot look")

    with pytest.raises(RuntimeError, match="cannot look"):
        FileLock(path).acquire(timeout=30, meanwhile=look)
    assert looks == [1]
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    FileLock(path).acquire(timeout=10)  # free: nothing of the cut-short wait holds it


def test_meanwhile_is_looked_at_while_the_holder_holds(
    path: Path, holder: subprocess.Popen[str]
) -> None:
    """The look is what may free the lock (it stops a git it proves orphaned): here it
    ends the holder, and the wait gets the lock."""

    def look() -> None:
        os.kill(holder.pid, signal.SIGKILL)

    lock = FileLock(path)
    lock.acquire(timeout=30, meanwhile=look)
    assert lock.held
    lock.release()
