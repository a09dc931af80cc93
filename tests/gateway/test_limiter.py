"""``routing/concurrency.py``'s Limiter: a deployment's slots and its queue (``--max-inflight``,
``--max-queue``, ``--queue-wait``), on a real event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from controller.gateway.routing.concurrency import Limiter


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(test())


def test_queued_requests_get_the_slots_given_back_in_the_order_they_came() -> None:
    async def test() -> None:
        limiter = Limiter(max_inflight=2, max_queue=3, queue_wait=5.0)
        assert limiter.take("m") and limiter.take("m")
        assert not limiter.take("m") and limiter.full("m")
        got: list[int] = []

        async def queued(n: int) -> None:
            assert await limiter.acquire("m")
            got.append(n)

        waiting = [asyncio.create_task(queued(n)) for n in range(3)]
        await asyncio.sleep(0)
        assert not await limiter.acquire("m")  # a fourth: the queue is full, a 429
        limiter.release("m")
        limiter.release("m")
        await asyncio.sleep(0)
        assert got == [0, 1]  # handed over, in order: still two taken
        assert not limiter.take("m")
        limiter.release("m")
        await asyncio.gather(*waiting)
        assert got == [0, 1, 2]
        for _ in range(2):
            limiter.release("m")
        assert not limiter.full("m") and limiter.take("m") and limiter.take("m")

    run(test)


def test_a_wait_that_runs_out_or_is_cancelled_leaves_the_queue_and_holds_no_slot() -> None:
    async def test() -> None:
        limiter = Limiter(max_inflight=1, max_queue=2, queue_wait=0.05)
        assert limiter.take("m")
        assert not await limiter.acquire("m")  # the wait ran out: a 429
        gone = asyncio.create_task(limiter.acquire("m"))
        await asyncio.sleep(0)
        gone.cancel()  # its client went away while it was queued
        await asyncio.gather(gone, return_exceptions=True)
        limiter.release("m")
        assert not limiter.full("m") and limiter.take("m")  # the slot is free again

    run(test)


def test_a_slot_handed_to_a_request_that_gives_up_at_once_goes_to_the_next() -> None:
    async def test() -> None:
        limiter = Limiter(max_inflight=1, max_queue=2, queue_wait=5.0)
        assert limiter.take("m")
        first = asyncio.create_task(limiter.acquire("m"))
        second = asyncio.create_task(limiter.acquire("m"))
        await asyncio.sleep(0)
        limiter.release("m")  # handed to the first...
        first.cancel()  # ... which is cancelled before it runs again
        await asyncio.gather(first, return_exceptions=True)
        assert await asyncio.wait_for(second, 30)  # the slot went on to the second
        assert limiter.full("m")
        limiter.release("m")
        assert not limiter.full("m")

    run(test)
