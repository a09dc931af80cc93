"""Per-deployment concurrency: at most ``max_inflight`` forwarded, a bounded queue, then 429;
and the bytes of request bodies held at once, all deployments together (``Bodies``)."""

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

    def full(self, name: str) -> bool:
        """Every slot of ``name`` is taken (a request would queue)."""
        slot = self._slots.get(name)
        return slot is not None and slot.locked()


class Bodies:
    """The bytes of request bodies the gateway holds at once, all requests together.

    A request reserves its body's size before a byte of it is read (its Content-Length;
    ``--max-body`` when it may grow past that: chunked, or encoded) and gives it back when
    it ends: the body is kept until then, for a retry on another instance. Past ``total``
    a request waits up to ``wait`` seconds for others to end, then is refused (503): 20
    clients sending 30 MB each at once drove the gateway to 1.9 GB before any limit.
    """

    def __init__(self, *, total: int, wait: float) -> None:
        self.total = total
        self.wait = wait
        self.held = 0
        self._freed = asyncio.Event()

    async def take(self, size: int) -> bool:
        """Reserve ``size`` bytes (at most ``total``); False when the wait ran out."""
        size = min(size, self.total)
        if self.held + size <= self.total:
            # Room now: no clock, no loop (on Python 3.11 asyncio's lookup of the running
            # loop is a getpid() system call: ~3% of a profile at one client).
            self.held += size
            return True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait
        while self.held + size > self.total:
            try:
                await asyncio.wait_for(self._freed.wait(), deadline - loop.time())
            except TimeoutError:
                return False
        self.held += size
        return True

    def give(self, size: int) -> None:
        self.held -= min(size, self.total)
        # Every waiter looks again (each sees what is free now); the next ones wait anew.
        self._freed.set()
        self._freed = asyncio.Event()
