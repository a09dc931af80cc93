"""Preemption through the real daemon, gateway and engines: a deployment of higher
priority takes the only GPU, and the answer the preempted engine is streaming ends whole
first (the engine is drained, as a recreate or a scale-down is), then it stops and waits
Pending for room, saying who won."""

from __future__ import annotations

import os
from typing import Any

from clients import Held

from controller.store.statedir import StateDir

WAIT = 60.0
GPU = {"count": 1, "kind": "nvidia"}


def test_a_preempted_engine_finishes_the_answer_it_streams(
    reconcile: Any, gateway: Any, held: Held
) -> None:
    reconcile.devices = "nvidia:0"
    reconcile.write("low", devices=GPU, command=held.command(), stopGracePeriodSeconds=60)
    g = gateway()
    low = g.wait_phase("low", "Ready")["pid"]
    stream = held.stream(g.port, "low")
    reconcile.wait_for(stream.begun.is_set, timeout=WAIT, what="the answer's first chunk")
    reconcile.write("high", devices=GPU, priority=10, basePort=reconcile.port + 2)
    # low's drain asked (a stop at once instead cut the stream: the engine ends at a
    # SIGTERM): low still runs, and its answer is let end
    retire = StateDir(reconcile.state).retire
    reconcile.wait_for(
        lambda: any(retire.glob("*.json")) or not stream.thread.is_alive(),
        timeout=WAIT,
        what="low's drain asked",
    )
    assert stream.thread.is_alive(), stream.body[-400:]
    os.kill(low, 0)  # ProcessLookupError: low was stopped before its answer ended
    # Meanwhile high waits for low's stop and says so: it said "no capacity: ... remove a
    # manifest or lower devices.count", sending its operator to undo what was under way.
    said = reconcile.wait_for(
        lambda: _pending(reconcile, "high", "which makes room"), timeout=WAIT, what="high's wait"
    )
    assert said == (
        "waiting for low to stop, which makes room (low: preempted by high (priority 10))"
    ), said
    # `plan` beside the daemon says why low goes ("interrupted teardown" alone, before),
    # and exits 2, not 1: high waits for nobody but low's stop, which the pass finishes
    plan = reconcile("plan", check=2).out
    assert "finishing a teardown under way: preempted by high (priority 10)" in plan, plan
    assert stream.thread.is_alive(), stream.body[-400:]  # all the while low's answer ran on
    held.release()
    g.wait_phase("high", "Ready", timeout=WAIT * 2)
    stream.thread.join(timeout=WAIT)
    assert stream.body.rstrip().endswith(b"data: [DONE]"), stream.body[-400:]
    was = reconcile.status()["low"]
    assert was["phase"] == "Pending" and "preempted by high (priority 10)" in was["message"]
    g.finish()


def _pending(rc: Any, name: str, words: str) -> str | None:
    """``name``'s message while it is Pending and says ``words``, else None."""
    item = rc.status().get(name)
    if item is None or item["phase"] != "Pending" or words not in (item["message"] or ""):
        return None
    message: str = item["message"]
    return message


def test_a_request_for_a_deployment_held_from_its_gpu_is_told_why(
    reconcile: Any, gateway: Any
) -> None:
    """An OnDemand model whose only GPU a deployment of higher priority holds cannot
    start: its request waited out the deadline and got `not Ready (Pending) … retry
    later`, nothing of why. The 503 names what holds it, as `status` does."""
    reconcile.devices = "nvidia:0"
    reconcile.write("high", devices=GPU, priority=10)
    reconcile.write(
        "od",
        devices=GPU,
        activation="OnDemand",
        basePort=reconcile.port + 2,
        readiness={"httpGet": {"path": "/health"}, "deadlineSeconds": 2, "periodSeconds": 0.2},
    )
    g = gateway()
    g.wait_phase("high", "Ready")
    answer = g.post("od")
    assert answer.status == 503, answer
    message = answer.json()["error"]["message"]
    assert "is not Ready (Pending: no capacity: " in message, message
    assert "held by high [nvidia:0]" in message and "deadline (2s)" in message, message
    g.finish()
