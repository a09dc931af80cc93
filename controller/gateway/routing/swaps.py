"""Swap-aware queueing: OnDemand models that cannot both fit take turns.

When the planner swaps one idle OnDemand engine out for another (their records say
``swapped out for B``), the two are known rivals. A request for a model whose rival has
requests in flight or waiting then waits here, before it wakes its engine, so the
loaded model's queue is served before a swap and the waiting model's requests are
served together after it (A A B A B B: two swaps, not five). Requests for the loaded
model go straight on, unless a rival has waited past ``SWAP_WAIT`` (aging): then the
rival goes first and new requests for the loaded model wait their turn, so nothing
starves. Counted: each time requests were held behind a rival's queue instead of
swapping at once (``reconcile_gateway_swaps_avoided_total``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterable

from controller.core.state import Record

SWAP_WAIT = 10.0  # seconds a request may wait for a rival's queue before it goes first
_SIGNS = ("swapped out for ", "making room: stopping idle ")
_HELD = " — held by "  # a start with no room names who holds the devices (placement.py)


class Turns:
    def __init__(
        self,
        avoided: Callable[[str], None] = lambda name: None,
        max_wait: float = SWAP_WAIT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.on_avoided = avoided  # the metric's counter
        self.max_wait = max_wait
        self.clock = clock
        self.rivals: dict[str, set[str]] = {}
        self.passed: Counter[str] = Counter()  # requests past the gate, not yet ended
        self.aged: Counter[str] = Counter()  # of those, how many went first by aging
        self.held: Counter[str] = Counter()  # requests waiting at the gate now
        self.avoided: Counter[str] = Counter()  # hold episodes: swaps not made at once
        self._seen: object = None
        self._changed = asyncio.Event()

    def learn(self, records: dict[str, Record]) -> None:
        """Rivals from the records' words (a park, or a start making room); once per
        records table (it is replaced whole on each read)."""
        if records is self._seen:
            return
        self._seen = records
        for rec in records.values():
            for other in _named(rec.message):
                other = other.partition("@")[0]  # a replica's deployment
                if other and other != rec.name:
                    self.rivals.setdefault(rec.name, set()).add(other)
                    self.rivals.setdefault(other, set()).add(rec.name)

    def _against(self, names: Iterable[str]) -> set[str]:
        mine = set(names)
        return {r for n in mine for r in self.rivals.get(n, ())} - mine

    async def enter(self, names: tuple[str, ...], loaded: Callable[[], bool]) -> bool:
        """Wait for the turn of ``names`` (a pool's OnDemand deployments); True when it
        came by aging. ``loaded``: the pool has a Ready instance now."""
        rivals = self._against(names)
        began = self.clock()
        aged = False
        holding = False
        try:
            while rivals and any(self.passed[r] for r in rivals):
                if loaded() and not any(self.aged[r] for r in rivals):
                    break  # the loaded model serves its queue first
                left = self.max_wait - (self.clock() - began)
                if left <= 0:
                    aged = True
                    break
                if not holding:
                    holding = True
                    if not any(self.held[n] for n in names):
                        self.avoided[names[0]] += 1  # a new episode: one swap put off
                        self.on_avoided(names[0])
                    for n in names:
                        self.held[n] += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), left)
        finally:
            if holding:
                for n in names:
                    self.held[n] -= 1
        for n in names:
            self.passed[n] += 1
            if aged:
                self.aged[n] += 1
        return aged

    def leave(self, names: tuple[str, ...], aged: bool) -> None:
        for n in names:
            self.passed[n] -= 1
            if aged:
                self.aged[n] -= 1
        # Wake every waiter to look again; the next wait gets a fresh event.
        self._changed.set()
        self._changed = asyncio.Event()


def _named(message: str) -> list[str]:
    """The deployments a record's message says stand in its way."""
    for sign in _SIGNS:
        if message.startswith(sign):
            return message[len(sign) :].split(" ")[0].split(",")[:1]
    if _HELD in message:
        held = message.split(_HELD, 1)[1].split(": ", 1)[0]
        return [part.split(" [")[0] for part in held.split("; ")]
    return []
