"""What was written in a folder tree over a window: raw inotify(7), as a watch sees it.

``Writes`` arms a watch on every folder under a root (those there when it starts), then
``taken()`` reads what the kernel queued meanwhile, without a thread: an event count, not
a timing. Each event is (folder relative to the root, file name, kind); a folder's own
change (a chmod of a watched folder) has the name "".
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
from pathlib import Path
from types import TracebackType

# inotify(7)'s bits: what a write does to a folder's watch (never a read or an open).
KINDS = {
    0x2: "modify",
    0x4: "attrib",
    0x8: "close_write",
    0x40: "moved_from",
    0x80: "moved_to",
    0x100: "create",
    0x200: "delete",
}
OVERFLOW = 0x4000
HEADER = struct.Struct("iIII")  # wd, mask, cookie, len

Event = tuple[str, str, str]  # (folder, name, kind)


class Writes:
    """A context manager: inotify watches on ``root`` and every folder below it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self._fd = -1
        self._folders: dict[int, str] = {}

    def __enter__(self) -> Writes:
        self._fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self._fd >= 0, os.strerror(ctypes.get_errno())
        mask = sum(KINDS)
        for folder, _, _ in os.walk(self.root):
            wd = self._libc.inotify_add_watch(self._fd, os.fsencode(folder), mask)
            assert wd >= 0, (folder, os.strerror(ctypes.get_errno()))
            self._folders[wd] = os.path.relpath(folder, self.root)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        os.close(self._fd)

    def taken(self) -> list[Event]:
        """Every event queued since the last call (the kernel's queue: none is lost
        unless it overflowed, which fails here rather than counting short)."""
        found: list[Event] = []
        while True:
            try:
                buf = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                return found
            at = 0
            while at < len(buf):
                wd, mask, _, size = HEADER.unpack_from(buf, at)
                assert not mask & OVERFLOW, "the inotify queue overflowed: events were lost"
                name = buf[at + HEADER.size : at + HEADER.size + size].rstrip(b"\0")
                at += HEADER.size + size
                folder = self._folders.get(wd, "?")
                found += [(folder, os.fsdecode(name), k) for bit, k in KINDS.items() if mask & bit]
