"""The /proc environment scan behind the marker search, with a memory of unmarked processes.

Reading a process's environment is what a marker scan costs: the kernel copies it
out of that process's memory, for every process on the machine, every pass. Two
facts let a long-lived scanner (the daemon's runtime, or one pass's rounds and
sweeps) skip most of them:

- a process's environment is fixed when it execs, and the marker only ever comes
  in through an exec (an engine is spawned with it, its children inherit it);
- ``/proc/<pid>``'s inode number is new for each process that holds the pid, so
  ``(pid, inode)`` names one process, and ``os.scandir`` hands out the inode free.

So a process read without the marker is not read again while its ``(pid, inode)``
stays. Only a read taken at least ``SETTLE`` seconds after the process was first seen
counts: one caught between fork and exec (with its parent's environment) is read
again until then. Processes that carry the marker are read every time.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

from controller.host import procpsutil

SETTLE = 1.0  # seconds: far longer than any fork -> exec


@dataclass(frozen=True, slots=True)
class _Unmarked:
    inode: int
    first_seen: float
    settled: bool  # read without the marker SETTLE s or more after first seen


class EnvironScan:
    def __init__(self) -> None:
        self._needle = b""
        self._unmarked: dict[int, _Unmarked] = {}

    def __call__(self, needle: bytes) -> Iterator[tuple[int, bytes]]:
        """``(pid, environ)`` of every other process whose environment holds ``needle``."""
        if procpsutil.ACTIVE:  # no inode to remember processes by: read them all
            yield from procpsutil.scan(needle)
            return
        known = self._unmarked if needle == self._needle else {}
        now = time.monotonic()
        me = os.getpid()
        unmarked: dict[int, _Unmarked] = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            pid, inode = int(entry.name), entry.inode()
            seen = known.get(pid)
            if seen is not None and seen.inode != inode:
                seen = None  # the pid belongs to another process now
            if seen is not None and seen.settled:
                unmarked[pid] = seen
                continue
            data = environ(pid)
            if data is None:
                continue
            if needle in data:
                yield pid, data
                continue
            first = now if seen is None else seen.first_seen
            unmarked[pid] = _Unmarked(inode, first, now - first >= SETTLE)
        self._needle, self._unmarked = needle, unmarked


def environ(pid: int) -> bytes | None:
    """A process's environment (``K=V\\0``...), None when gone or not ours to read."""
    try:
        return environ_of(pid)
    except PermissionError:
        return None


def environ_of(pid: int) -> bytes | None:
    """``environ``, but a process this user may not read (EACCES, EPERM: a file-capability
    or setuid program is not dumpable) raises PermissionError: to whoever decides on a
    signal, "not ours to read" is not "gone"."""
    if procpsutil.ACTIVE:
        return procpsutil.environ(pid)
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except PermissionError:
        raise
    except OSError:
        return None  # gone (ENOENT, ESRCH)
