"""Named one-shot timers on the monotonic clock: a heap with lazy cancellation.

The daemon sleeps until the nearest one (debounce, resync, a probe due, a
deadline or back-off expiring, a watchdog ping) instead of polling.
"""

from __future__ import annotations

import heapq
import time


class Timers:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, str]] = []
        self._live: dict[str, tuple[float, int, str]] = {}  # key -> (when, seq, label)
        self._seq = 0

    def set(self, key: str, when: float, label: str = "") -> None:
        """Arm ``key`` to fire at monotonic time ``when`` (replacing any earlier arming)."""
        self._seq += 1
        self._live[key] = (when, self._seq, label or key)
        heapq.heappush(self._heap, (when, self._seq, key))

    def after(self, key: str, delay: float, label: str = "") -> None:
        self.set(key, time.monotonic() + max(delay, 0.0), label)

    def cancel(self, key: str) -> None:
        self._live.pop(key, None)

    def cancel_prefix(self, prefix: str) -> None:
        for key in [k for k in self._live if k.startswith(prefix)]:
            del self._live[key]

    def armed(self, key: str) -> bool:
        return key in self._live

    def when(self, key: str) -> float | None:
        """When ``key`` fires, or None when it is not armed."""
        live = self._live.get(key)
        return None if live is None else live[0]

    def timeout(self, now: float) -> float | None:
        """Seconds until the nearest timer (0 when one is due), None when none is armed."""
        self._drop_stale()
        return max(self._heap[0][0] - now, 0.0) if self._heap else None

    def pop_due(self, now: float) -> list[tuple[str, str]]:
        """Disarm and return ``(key, label)`` of every timer due at ``now``."""
        due = []
        self._drop_stale()
        while self._heap and self._heap[0][0] <= now:
            _, _, key = heapq.heappop(self._heap)
            _, _, label = self._live.pop(key)
            due.append((key, label))
            self._drop_stale()
        return due

    def _drop_stale(self) -> None:
        while self._heap:
            _, seq, key = self._heap[0]
            live = self._live.get(key)
            if live is not None and live[1] == seq:
                return
            heapq.heappop(self._heap)


def debounce_until(
    now: float, delay: float, pending: float | None, since: float, cap: float
) -> float:
    """When a debounced pass fires after an event asking ``delay`` seconds of quiet.

    Debounces only move later: a file that settled quickly never pulls in the wait an
    earlier event asked for (a deletion mid-checkout, then another file closed). A
    steady stream of events still gets a pass ``cap`` seconds after the first one.
    """
    return min(max(now + delay, pending or 0.0), since + cap)


# A file seen written and not yet closed holds the passes: a pass would read its prefix
# (a writer that pauses between its truncate and its close: a slow copy, a script writing
# document by document), valid YAML with fewer deployments at a document boundary. Its
# close ends the hold; these bounds end it for a writer whose close never comes to us (a
# truncate(2) by path, a kernel queue that overflowed, a writer that keeps it open).
WRITE_QUIET = 5.0  # seconds with no further write to it
WRITE_HOLD_MAX = 30.0  # seconds since the first write seen: a file written on and on


class Settling:
    """Which folder changes are still in motion, between two passes.

    A file created, or written, and not yet closed (or renamed into place) is in
    motion; once every such file is whole, the pass may run at once. One written holds
    every pass (``held``); one only created does not: nothing written, it reads empty,
    and an emptied file's deployments are left be (a link made, ``ln -s``, is never
    closed). A deletion, or a folder coming and going, waits out the full debounce
    whatever follows: ``git checkout`` and some editors delete a file just before writing
    it again, and a deletion stops engines. Kinds, from daemon/folders.py: ``begun``,
    ``writing``, ``settled``, ``deleted``.
    """

    def __init__(self) -> None:
        self.begun: set[str] = set()
        # path -> (first, last) write seen, on the monotonic clock
        self.writing: dict[str, tuple[float, float]] = {}
        self.waiting = False
        self.touched: set[str] = set()  # every path an event named

    def note(self, kind: str, path: str, now: float | None = None) -> None:
        self.touched.add(path)
        if kind == "begun":
            self.begun.add(path)
            return
        self.begun.discard(path)
        if kind == "writing":
            at = time.monotonic() if now is None else now
            self.writing[path] = (self.writing.get(path, (at, at))[0], at)
            return
        self.writing.pop(path, None)  # closed, renamed into place, or gone
        if kind != "settled":
            self.waiting = True

    def suspect(self, path: str, now: float | None = None) -> None:
        """``path`` changed under a pass, seen by its stamps: held as written until its
        events come (its close ends the hold), unless they came already."""
        if path not in self.touched:
            self.note("writing", path, now)

    @property
    def whole(self) -> bool:
        """Nothing in motion and no deletion waiting: the pass need not wait."""
        return not self.begun and not self.writing and not self.waiting

    def held(self, now: float) -> tuple[str, float] | None:
        """The file still being written that holds the passes longest, and until when
        (its close ends it sooner); None when no file holds them."""
        ends = [
            (min(last + WRITE_QUIET, first + WRITE_HOLD_MAX), path)
            for path, (first, last) in self.writing.items()
        ]
        until, path = max(ends, default=(now, ""))
        return (path, until) if until > now else None
