"""sha256 on a thread of its own, beside the download.

hashlib releases the GIL on large buffers, so hashing chunk N while the socket read
and the file write of chunk N+1 go on keeps the pull near the speed of the slower of
the two instead of their sum (measured: hashing cost as much as the write itself).
The queue is bounded: a slow hash holds the download back, never fills memory.
"""

from __future__ import annotations

import hashlib
import queue
import threading
from pathlib import Path

DEPTH = 32  # chunks in flight (1 MiB each at most)
BLOCK = 1 << 20


class Hasher:
    def __init__(self) -> None:
        self._h = hashlib.sha256()
        self._q: queue.Queue[bytes | None] = queue.Queue(DEPTH)
        self._thread = threading.Thread(target=self._run, name="pull-sha256", daemon=True)
        self._thread.start()
        self._digest: str | None = None

    def feed(self, chunk: bytes) -> None:
        self._q.put(chunk)

    def feed_file(self, path: Path) -> None:
        """What a partial file already holds (a resume hashes it before the new bytes)."""
        with path.open("rb") as f:
            while block := f.read(BLOCK):
                self.feed(block)

    def hexdigest(self) -> str:
        """Everything fed so far, hashed (the thread ends here)."""
        if self._digest is None:
            self._q.put(None)
            self._thread.join()
            self._digest = self._h.hexdigest()
        return self._digest

    def close(self) -> None:
        """End the thread whatever happened (a failed download)."""
        self.hexdigest()

    def _run(self) -> None:
        while (chunk := self._q.get()) is not None:
            self._h.update(chunk)
