"""Swap-aware queueing (turns.py): OnDemand rivals on one GPU take turns.

- the gate itself, on a real event loop: rivals learned from a park's words, the loaded
  model's requests go on while the other's wait, the waiting ones go together once the
  loaded model's queue is empty, and aging lets a starved one go first;
- end to end on a one-GPU node (``nvidia:0=80Gi``), two OnDemand deployments of one GPU
  each: requests A A B A B B arriving interleaved are all answered with at most 2 swaps.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from controller.core.state import Phase, Record
from controller.gateway.routing.swaps import Turns

A, B = ("first",), ("second",)


def parked(name: str, other: str) -> dict[str, Record]:
    why = f"swapped out for {other} (idle OnDemand, least recently used)"
    rec = Record(name=name, owner="o", node="n", phase=Phase.IDLE, message=why)
    return {name: rec}


def test_the_loaded_models_queue_goes_first_then_the_others_together() -> None:
    async def scenario() -> list[str]:
        avoided: list[str] = []
        turns = Turns(avoided.append, max_wait=30.0)
        turns.learn(parked("first", "second"))
        assert turns.rivals == {"first": {"second"}, "second": {"first"}}
        order: list[str] = []
        loaded = {"first": True, "second": False}
        await turns.enter(A, lambda: loaded["first"])  # first serves a request
        waiting = [
            asyncio.create_task(_go(turns, B, lambda: loaded["second"], order, "B"))
            for _ in range(2)
        ]
        await asyncio.sleep(0.05)
        assert order == [] and turns.held["second"] == 2  # held behind first's queue
        await turns.enter(A, lambda: loaded["first"])  # the loaded model goes on
        turns.leave(A, False)
        await asyncio.sleep(0.05)
        assert order == []  # first still has one in flight
        turns.leave(A, False)
        loaded.update(first=False, second=True)
        await asyncio.gather(*waiting)
        assert order == ["B", "B"] and avoided == ["second"]  # one episode, one swap
        return order

    asyncio.run(scenario())


async def _go(
    turns: Turns, names: tuple[str, ...], loaded: Any, order: list[str], tag: str
) -> None:
    aged = await turns.enter(names, loaded)
    order.append(tag)
    turns.leave(names, aged)


def test_aging_lets_a_starved_model_go_first() -> None:
    async def scenario() -> None:
        turns = Turns(max_wait=0.2)
        turns.learn(parked("second", "first"))
        await turns.enter(A, lambda: True)  # first is busy for good
        aged = await turns.enter(B, lambda: False)  # waits 0.2 s at most, then goes
        assert aged and turns.aged["second"] == 1
        # Now new requests for the loaded model wait for the aged one to be served.
        later = asyncio.create_task(turns.enter(A, lambda: True))
        await asyncio.sleep(0.05)
        assert not later.done()
        turns.leave(B, aged)
        assert await later is False

    asyncio.run(scenario())


def test_interleaved_requests_for_two_models_on_one_gpu_swap_at_most_twice(
    reconcile: Any, gateway: Any
) -> None:
    reconcile.devices = "nvidia:0=80Gi"
    gpu = {"count": 1, "kind": "nvidia"}
    slow = reconcile.demo_command(chunks="4", chunk_delay="0.1")  # a 0.4 s stream each
    for name in ("first", "second"):
        reconcile.write(name, command=slow, devices=gpu, activation="OnDemand", idleTimeout="10m")
    g = gateway()
    g.wait_phase("first", "Idle")
    g.wait_phase("second", "Idle")
    listed = lambda: len(g.request("GET", "/v1/models").json()["data"]) == 2  # noqa: E731
    reconcile.wait_for(listed, what="both models routable")
    answers: list[Any] = []
    threads = []
    for model in ("first", "first", "second", "first", "second", "second"):
        thread = threading.Thread(
            target=lambda m=model: answers.append(g.post(m, stream=True)), daemon=True
        )
        thread.start()
        threads.append(thread)
        time.sleep(0.15)  # interleaved: each arrives while the others wait or stream
    for thread in threads:
        thread.join(timeout=120)
    assert len(answers) == 6 and all(a.status == 200 for a in answers), answers
    assert all(a.body.endswith(b"data: [DONE]\n\n") for a in answers), answers
    swaps = [
        e
        for name in ("first", "second")
        for e in reconcile.events(name)
        if "swapped out for" in e.get("reason", "")
    ]
    assert len(swaps) <= 2, swaps
    g.finish()
