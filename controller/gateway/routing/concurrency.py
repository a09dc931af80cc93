"""Per-deployment concurrency: at most ``max_inflight`` forwarded, a bounded queue, then 429;
and the bytes of request bodies held at once, all deployments together (``Bodies``)."""

from __future__ import annotations

import asyncio
from collections import deque


class _Slots:
    """One deployment's slots: how many are taken, and the requests queued for one, in
    the order they came (each woken with a slot handed over)."""

    __slots__ = ("queue", "taken")

    def __init__(self) -> None:
        self.taken = 0
        self.queue: deque[asyncio.Future[None]] = deque()


class Limiter:
    """A counter and a queue per deployment, not asyncio's Semaphore: a request that finds
    a slot free takes it without a coroutine or a lock's bookkeeping (most requests)."""

    def __init__(self, *, max_inflight: int, max_queue: int, queue_wait: float) -> None:
        self.max_inflight = max_inflight
        self.max_queue = max_queue
        self.queue_wait = queue_wait
        self._slots: dict[str, _Slots] = {}

    def take(self, name: str) -> bool:
        """A slot for ``name`` if one is free now (none is while requests are queued)."""
        slots = self._slots.get(name)
        if slots is None:
            slots = self._slots[name] = _Slots()
        if slots.taken < self.max_inflight and not slots.queue:
            slots.taken += 1
            return True
        return False

    async def acquire(self, name: str) -> bool:
        """A slot for ``name``; False when the queue is full or the wait ran out (429)."""
        if self.take(name):
            return True
        return await self.queued(name)

    async def queued(self, name: str) -> bool:
        """A slot for ``name`` once one is handed over, waited for in the queue (at most
        ``queue_wait`` s); False when the queue is full or the wait ran out."""
        slots = self._slots[name]
        if len(slots.queue) >= self.max_queue:
            return False
        turn = asyncio.get_running_loop().create_future()
        slots.queue.append(turn)
        try:
            async with asyncio.timeout(self.queue_wait):
                await turn
        except (TimeoutError, asyncio.CancelledError) as exc:
            if turn.done() and not turn.cancelled():
                self.release(name)  # handed a slot just as it gave up: the next one's
            elif turn in slots.queue:  # (a cancelled one may be passed over already)
                slots.queue.remove(turn)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return False
        return True

    def release(self, name: str) -> None:
        """A slot given back: the first request queued gets it, else it is free."""
        slots = self._slots[name]
        while slots.queue:
            turn = slots.queue.popleft()
            if not turn.done():
                turn.set_result(None)  # still taken: by the request woken
                return
        slots.taken -= 1

    def full(self, name: str) -> bool:
        """Every slot of ``name`` is taken (a request would queue)."""
        slots = self._slots.get(name)
        return slots is not None and (slots.taken >= self.max_inflight or bool(slots.queue))


class Bodies:
    """The bytes of request bodies the gateway holds at once, all requests together.

    A request whose body has a Content-Length reserves that size before a byte of it is
    read, and gives it back when it ends: the body is kept until then, for a retry on
    another instance. Past ``total`` such a request waits up to ``wait`` seconds for
    others to end, then is refused (503): 20 clients sending 30 MB each at once drove the
    gateway to 1.9 GB before any limit. A body whose size shows only as it arrives
    (chunked, or encoded) reserves what it turns out to take (``Held.cover``): reserved at
    ``--max-body`` up front, four such heads and a byte each held all the room.

    One peer (an API key) holds at most ``share`` of it: heads of sized bodies that send
    a byte now and then hold their size however little they send, and one key's could
    hold all of it; the rest is always left to the others.
    """

    def __init__(self, *, total: int, wait: float, share: int | None = None) -> None:
        self.total = total
        self.wait = wait
        self.share = min(share or total, total)  # what one peer may hold at once
        self.held = 0
        self._peers: dict[str, int] = {}  # bytes held by each peer (kept under a share)
        self._freed = asyncio.Event()
        self._waiting = 0  # requests waiting for room

    def peer_held(self, peer: str) -> int:
        return self._peers.get(peer, 0)

    def _fits(self, size: int, peer: str) -> bool:
        if self.held + size > self.total:
            return False
        return self.share == self.total or self._peers.get(peer, 0) + size <= self.share

    def _add(self, size: int, peer: str) -> None:
        self.held += size
        if self.share < self.total:
            self._peers[peer] = self._peers.get(peer, 0) + size

    async def take(self, size: int, peer: str = "") -> bool:
        """Reserve ``size`` bytes (at most ``share``) for ``peer``; False when the wait
        ran out."""
        size = min(size, self.share)
        if self._fits(size, peer):
            # Room now: no clock, no loop (on Python 3.11 asyncio's lookup of the running
            # loop is a getpid() system call: ~3% of a profile at one client).
            self._add(size, peer)
            return True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait
        self._waiting += 1
        try:
            while not self._fits(size, peer):
                await asyncio.wait_for(self._freed.wait(), deadline - loop.time())
        except TimeoutError:
            return False
        finally:
            self._waiting -= 1
        self._add(size, peer)
        return True

    def grow(self, size: int, peer: str = "") -> bool:
        """Reserve ``size`` bytes more, at once or not at all: a body that waited for room
        while holding part of it could wait on others that wait on it."""
        if not self._fits(size, peer):
            return False
        self._add(size, peer)
        return True

    def give(self, size: int, peer: str = "") -> None:
        size = min(size, self.share)
        self.held -= size
        if self.share < self.total:
            left = self._peers.get(peer, 0) - size
            if left > 0:
                self._peers[peer] = left
            else:
                self._peers.pop(peer, None)
        if self._waiting:
            # Every waiter looks again (each sees what is free now); the next ones wait anew.
            self._freed.set()
            self._freed = asyncio.Event()


class Held:
    """One request's part of ``Bodies``: what it reserved before its body came (for
    ``peer``), grown to what the body turns out to take (``cover``), given back whole
    when its answer ends."""

    __slots__ = ("_bodies", "peer", "size")

    def __init__(self, bodies: Bodies, size: int, peer: str = "") -> None:
        self._bodies = bodies
        self.peer = peer
        self.size = min(size, bodies.share)  # what ``take`` reserved

    def cover(self, size: int) -> bool:
        """Whether ``size`` bytes of body fit this reservation, grown at once if room is
        free; False when it is not (the request is refused: its part stays until then)."""
        if size <= self.size:
            return True
        if not self._bodies.grow(size - self.size, self.peer):
            return False
        self.size = size
        return True

    async def arrived(self, size: int) -> bool:
        """``cover``, but a body that holds no room yet (chunked: its first bytes) waits
        for it, as ``Bodies.take`` does: holding none, it keeps no one else waiting."""
        if self.size or not size:
            return self.cover(size)
        if not await self._bodies.take(size, self.peer):
            return False
        self.size = min(size, self._bodies.share)
        return True

    @property
    def total(self) -> int:
        return self._bodies.total

    @property
    def share(self) -> int:
        return self._bodies.share

    def give(self) -> None:
        self._bodies.give(self.size, self.peer)
        self.size = 0
