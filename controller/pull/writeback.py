"""The download's bytes pushed to disk as they arrive, on a thread of its own.

Without it the page cache holds every byte until the final fsync: a 40 GB pull piles
up dirty pages until the kernel throttles the writer, the fsync before the rename then
waits for all of them (measured: a quarter of a 200 MB transfer on this box), and a
crash loses a partial file's unsynced tail, which the resume then fetches again. Here
an ``fdatasync`` follows every ``EVERY`` bytes, beside the download, so the last one
has only the tail to write. The fsync before the rename still decides durability.
"""

from __future__ import annotations

import os
import threading

EVERY = 32 << 20  # bytes written between syncs


class Writeback:
    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._due = threading.Event()
        self._ending = False
        self._written = 0
        self._next = EVERY
        self._thread = threading.Thread(target=self._run, name="pull-writeback", daemon=True)
        self._thread.start()

    def wrote(self, n: int) -> None:
        self._written += n
        if self._written >= self._next:
            self._next = self._written + EVERY
            self._due.set()

    def close(self) -> None:
        """Wait for a sync under way (the caller's fsync follows); the thread ends."""
        self._ending = True
        self._due.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            self._due.wait()
            self._due.clear()
            if self._ending:
                return
            try:
                os.fdatasync(self._fd)
            except OSError:
                return  # the final fsync reports what is wrong with the file
