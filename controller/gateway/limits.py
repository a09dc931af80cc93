"""Per-deployment concurrency: at most ``max_inflight`` forwarded, a bounded queue, then 429."""

from __future__ import annotations

import asyncio
from collections import defaultdict


class Limiter:
    def __init__(self, *, max_inflight: int, max_queue: int, queue_wait: float) -> None:
        self.max_inflight = max_inflight
        self.max_queue = max_queue
        self.queue_wait = queue_wait
        self._slots: dict[str, asyncio.Semaphore] = {}
        self._queued: defaultdict[str, int] = defaultdict(int)

    async def acquire(self, name: str) -> bool:
        """A slot for ``name``; False when the queue is full or the wait ran out (429)."""
        slot = self._slots.get(name)
        if slot is None:
            slot = self._slots[name] = asyncio.Semaphore(self.max_inflight)
        if not slot.locked():
            await slot.acquire()
            return True
        if self._queued[name] >= self.max_queue:
            return False
        self._queued[name] += 1
        try:
            await asyncio.wait_for(slot.acquire(), self.queue_wait)
        except TimeoutError:
            return False
        finally:
            self._queued[name] -= 1
        return True

    def release(self, name: str) -> None:
        self._slots[name].release()
