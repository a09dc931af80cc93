"""``affinity: session``: consistent hashing with bounded loads (Mirrokni, Thorup and
Zadimoghaddam, 2018).

Each instance of a pool has ``VNODES`` points on a 64-bit ring (hashed from its instance
name, ``web@1``, so a restarted engine or a rolling ``@next`` keeps the place of the
instance it replaces). A new session walks clockwise from its key's hash to the first
instance that holds fewer sessions than the bound: no instance ever holds more than
``BOUND`` x the pool's mean, rounded up to a whole session. A session then stays on its
instance while that instance is in the pool and within the bound; when an instance
leaves, only its sessions move (on to the next instance clockwise), and when one joins,
only the sessions that put an instance past the new bound move. The load is the number
of sessions an instance holds (a session's KV cache is what affinity keeps), remembered
for ``IDLE`` seconds after a session's last request, at most ``MAX_SESSIONS`` per pool
(least recently used go first).
"""

from __future__ import annotations

import bisect
import hashlib
import math
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Iterator

VNODES = 64  # points per instance: the ring's spread is within a few percent
BOUND = 1.25  # the most sessions an instance holds, over the pool's mean
IDLE = 1800.0  # seconds a session is remembered after its last request
MAX_SESSIONS = 100_000  # per pool: memory stays bounded whatever clients send
RINGS_KEPT = 8  # rings of recent member sets (a retry looks without one instance)


def point(text: str) -> int:
    """A stable 64-bit position on the ring (the same in every gateway process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def bound(total: int, members: int, factor: float = BOUND) -> int:
    """The most one of ``members`` instances may hold with ``total`` in all (the new one
    counted): ``factor`` x the mean rounded up, the paper's ceil((1+e) m / n), as brpc
    and HAProxy's hash-balance-factor round it. Rounded down, two replicas with four
    requests allowed only the even share: the holder of a prefix was passed over about
    half the time, each time a cold prefill (`python -m benchmarks --only routing`)."""
    return math.ceil(factor * total / members)


class Ring:
    def __init__(self, members: Collection[str], vnodes: int = VNODES) -> None:
        points = sorted((point(f"{key}#{i}"), key) for key in members for i in range(vnodes))
        self._points = [p for p, _ in points]
        self._keys = [k for _, k in points]
        self.size = len(set(members))

    def walk(self, start: int) -> Iterator[str]:
        """Every member once, clockwise from ``start``."""
        first = bisect.bisect_left(self._points, start)
        seen: set[str] = set()
        for i in range(len(self._keys)):
            key = self._keys[(first + i) % len(self._keys)]
            if key not in seen:
                seen.add(key)
                yield key
                if len(seen) == self.size:
                    return


class Sessions:
    """The sessions of one pool: the instance each is on and how many each instance holds."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        idle: float = IDLE,
        limit: int = MAX_SESSIONS,
    ) -> None:
        self._clock = clock
        self._idle = idle
        self._limit = limit
        # a session key's hash -> (its instance, its last request), oldest first
        self._on: OrderedDict[int, tuple[str, float]] = OrderedDict()
        self.held: Counter[str] = Counter()
        self._rings: dict[frozenset[str], Ring] = {}

    def place(self, session: str, members: Collection[str]) -> str:
        """The instance of ``members`` (instance names, never empty) for ``session`` now."""
        now = self._clock()
        self._expire(now)
        key = point(session)
        was = self._forget(key)
        cap = bound(sum(self.held[m] for m in members) + 1, len(members))
        if was is not None and was in members and self.held[was] < cap:
            chosen = was
        else:
            walk = self._ring(members).walk(key)
            chosen = next(m for m in walk if self.held[m] < cap)
        self._on[key] = (chosen, now)
        self.held[chosen] += 1
        return chosen

    def where(self, session: str) -> str | None:
        """The instance ``session`` was last placed on (None: not remembered)."""
        found = self._on.get(point(session))
        return found[0] if found is not None else None

    def _forget(self, key: int) -> str | None:
        found = self._on.pop(key, None)
        if found is None:
            return None
        self.held[found[0]] -= 1
        if self.held[found[0]] <= 0:
            del self.held[found[0]]
        return found[0]

    def _expire(self, now: float) -> None:
        while self._on:
            key, (_, seen) = next(iter(self._on.items()))
            if now - seen < self._idle and len(self._on) < self._limit:
                return
            self._forget(key)

    def _ring(self, members: Collection[str]) -> Ring:
        which = frozenset(members)
        ring = self._rings.get(which)
        if ring is None:
            if len(self._rings) >= RINGS_KEPT:
                self._rings.clear()
            ring = self._rings[which] = Ring(which)
        return ring
