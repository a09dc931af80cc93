"""Progress of one pull: bytes done and total, a recent rate, written to progress.json.

Written at most every ``EVERY`` seconds (and at the end), so a fast download spends
its time on bytes, not on rewriting a file ``status`` reads; while :meth:`ProgressMeter.ticking`
a thread writes the last figure too, so a download that stalls mid-way shows where it
stands (and its rate falling) instead of the figure of its last fast read. Each write
looks first at the state dir (``StateWatch``): swapped, it writes nothing, the ticker
ends and the download's own next figure raises ``Swapped``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

from controller.core.pulls import PullProgress
from controller.pull.statewatch import StateWatch, Swapped
from controller.store.models.modelcache import CacheEntry, utcnow

EVERY = 0.5  # seconds between progress writes
WINDOW = 5.0  # seconds the rate is measured over


class ProgressMeter:
    def __init__(self, entry: CacheEntry, watch: StateWatch | None = None) -> None:
        self.entry = entry
        self.watch = watch or StateWatch.none()
        self.done = 0
        self.total: int | None = None
        self.started_at = utcnow()
        self._samples: deque[tuple[float, int]] = deque()
        self._written = 0.0
        self._lock = threading.Lock()  # the fetch and the ticker both write

    def set(self, done: int, total: int | None = None) -> None:
        """The bytes there now (and the whole size, once known)."""
        self.done = done
        known = total is not None and total != self.total
        if total is not None:
            self.total = total
        self.flush(force=known)  # the first sight of the total is shown at once

    def start_at(self, done: int, total: int | None) -> None:
        """Where this download's body starts (a resume's partial, else 0), and the size:
        shown at once, but not counted in the rate. Those bytes came before this
        process, so a resume from 8 MB read at first as 400 MB/s, ETA 0s."""
        with self._lock:
            self.done = done
            if total is not None:
                self.total = total
            self._samples.clear()
            self._flush(force=True)

    def restart_from(self, done: int) -> None:
        """A failed pull: the bytes a retry starts from, written at once (its rate none)."""
        with self._lock:
            self.done = done
            self._samples.clear()
            self._flush(force=True)

    def advance(self, n: int) -> None:
        self.done += n
        self.flush()

    @contextmanager
    def ticking(self) -> Iterator[None]:
        """While the block runs, the figure is written every EVERY seconds regardless."""
        stop = threading.Event()

        def tick() -> None:
            with contextlib.suppress(Swapped):  # the download's next figure raises it
                while not stop.wait(EVERY):
                    self.flush()

        ticker = threading.Thread(target=tick, name="pull-meter", daemon=True)
        ticker.start()
        try:
            yield
        finally:
            stop.set()
            ticker.join()

    def flush(self, *, force: bool = False) -> None:
        with self._lock:
            self._flush(force)

    def _flush(self, force: bool) -> None:
        now = time.monotonic()
        if not force and now - self._written < EVERY:
            return
        self.watch.check()
        self._samples.append((now, self.done))
        while len(self._samples) > 2 and now - self._samples[0][0] > WINDOW:
            self._samples.popleft()
        self._written = now
        self.entry.write_progress(
            PullProgress(
                bytes_done=self.done,
                bytes_total=self.total,
                rate=self._rate(),
                started_at=self.started_at,
                pid=os.getpid(),
            )
        )

    def _rate(self) -> float:
        (t0, b0), (t1, b1) = self._samples[0], self._samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0
