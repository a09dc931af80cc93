"""The routing table alone (no daemon): a Ready ``@next`` wins, a retired engine gets
nothing new, ``retire`` waits for its in-flight requests, ``@next`` is no model name."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from controller.core.manifest.names import base_name
from controller.core.state import Drain, Phase, Record
from controller.gateway.routing.table import Table


def rec(name: str, nonce: str, port: int, phase: Phase = Phase.READY) -> Record:
    models = (base_name(name),)  # a `@next` record names its deployment's models
    return Record(
        name=name, owner="o", node="n", nonce=nonce, port=port, phase=phase, models=models
    )


OLD = rec("m", "old", 8000)
NEXT_STARTING = rec("m@next", "new", 8001, Phase.STARTING)
NEXT_READY = rec("m@next", "new", 8001)


def test_a_ready_next_wins_a_starting_one_does_not() -> None:
    async def check() -> None:
        table = Table()
        table.update([OLD, NEXT_STARTING])
        assert table.pools == {"m": ("m",)}  # `m@next` is no routable name
        assert (found := table.target("m")) is not None and found.port == 8000
        table.update([OLD, NEXT_READY])
        assert (found := table.target("m")) is not None and found.port == 8001
        assert found.deployment == "m"  # metrics and limits count the deployment

    asyncio.run(check())


def test_the_table_counts_each_request_from_its_start_to_its_end() -> None:
    """Forwarder._send tells the table; the balancer and retire read its counts."""
    table = Table()
    table.update([OLD])
    table.request_began("old")
    table.request_began("old")
    assert (table.inflight["old"], table.served["old"]) == (2, 2)
    table.request_ended("old")
    table.request_ended("old")
    assert "old" not in table.inflight  # an idle engine leaves no entry behind
    assert table.served["old"] == 2  # the tie-break remembers what each engine was sent
    table.update([NEXT_READY])
    assert "old" not in table.served  # a gone engine's count goes with it


def test_retire_switches_at_once_and_waits_for_in_flight_requests() -> None:
    async def check() -> None:
        table = Table()
        table.update([OLD, NEXT_STARTING])
        table.request_began("old")  # a request the old engine is answering

        async def finish() -> None:
            await asyncio.sleep(0.2)
            table.request_ended("old")

        ending = asyncio.create_task(finish())
        started = time.monotonic()
        retiring = asyncio.create_task(table.retire(OLD, NEXT_READY, timeout=10))
        await asyncio.sleep(0)
        assert (found := table.target("m")) is not None and found.port == 8001  # new ones
        await retiring
        assert time.monotonic() - started >= 0.2  # it waited for the request in flight
        await ending

    asyncio.run(check())


def test_retire_gives_up_after_the_grace_period() -> None:
    async def check() -> None:
        table = Table()
        table.update([OLD])
        table.request_began("old")  # never ends
        started = time.monotonic()
        await table.retire(OLD, None, timeout=0.1)
        assert 0.1 <= time.monotonic() - started < 5
        assert table.target("m") is None  # a recreate: new requests wait for the new engine

    asyncio.run(check())


def test_a_probed_starting_engine_is_routed_to_for_its_nonce_only() -> None:
    async def check() -> None:
        table = Table()
        starting = rec("m", "a", 8000, Phase.STARTING)
        table.update([starting])
        assert table.target("m") is None
        table.probed_ready("a")
        assert table.target("m") is not None
        table.update([rec("m", "b", 8000, Phase.STARTING)])  # restarted meanwhile
        assert table.target("m") is None

    asyncio.run(check())


def test_a_probe_from_before_ready_does_not_route_to_an_engine_back_to_starting() -> None:
    # The namespace cluster's partition (tests/cluster): the gateway probed the engine while
    # it started, the daemon recorded it Ready, then its host was cut and Ray restarted its
    # actor: the record is Starting again, same nonce, the lost address. Routed there on
    # the old probe, requests timed out connecting to the cut host (one was a 502).
    async def check() -> None:
        table = Table()
        table.update([rec("m", "a", 8000, Phase.STARTING)])
        table.probed_ready("a")
        table.update([rec("m", "a", 8000)])
        assert table.target("m") is not None
        table.update([rec("m", "a", 8000, Phase.STARTING)])  # the backend restarting it
        assert table.target("m") is None
        table.probed_ready("a")  # a probe of the engine as it is now counts again
        assert table.target("m") is not None

    asyncio.run(check())


def test_an_old_instance_probed_at_start_does_not_make_a_starting_next_routable() -> None:
    # The gateway probed the old instance while it was Starting (a young gateway), then
    # the deployment rolls: the `next` instance, still Starting, must get nothing yet.
    async def check() -> None:
        table = Table()
        table.update([rec("m", "old", 8000, Phase.STARTING)])
        table.probed_ready("old")
        table.update([OLD, NEXT_STARTING])
        assert (found := table.target("m")) is not None and found.port == 8000
        table.probed_ready("new")  # now its own probe passed
        assert (found := table.target("m")) is not None and found.port == 8001

    asyncio.run(check())


def test_avoid_skips_the_instance_that_dropped_a_request() -> None:
    async def check() -> None:
        table = Table()
        table.update([OLD, NEXT_READY])
        assert (found := table.target("m", avoid="new")) is not None and found.port == 8000
        assert table.target("m", avoid="old") == table.target("m")
        table.update([OLD])
        assert table.target("m", avoid="old") is None

    asyncio.run(check())


def test_a_next_left_alone_routes_as_its_instance() -> None:
    # A daemon killed mid-promotion: the next one finishes the old engine's stop (its
    # record goes) a pass before the rename. The Ready `@next` serves the names meanwhile;
    # a 404 "routable names: none" once answered in that window.
    async def check() -> None:
        table = Table()
        table.update([NEXT_READY])
        assert table.pools == {"m": ("m",)}
        assert (found := table.target("m")) is not None and found.port == 8001
        assert found.deployment == "m" and found.instance == "m"
        table.update([NEXT_STARTING])
        assert table.target("m") is None  # still nothing before it is Ready

    asyncio.run(check())


def test_a_pools_facts_follow_the_records_they_are_kept_between() -> None:
    """The table keeps each pool's facts between updates (each request asks): a pass
    that changes a deployment's affinity, fallbacks or activation is routed by at once; a
    name no pool has is answered, never kept."""

    async def check() -> None:
        table = Table()
        table.update([OLD])
        assert table.affinity("m") == "none" and table.affinity("m") == "none"
        assert table.fallbacks("m") == () and table.on_demand("m") == ()
        table.update([replace(OLD, affinity="prefix")])
        assert table.affinity("m") == "prefix"
        table.update([replace(OLD, affinity="session", fallbacks=("small",), fallback_after=2.0)])
        assert table.affinity("m") == "session"
        assert table.fallbacks("m") == ("small",) and table.fallback_after("m") == 2.0
        table.update([replace(OLD, activation="OnDemand")])
        assert table.on_demand("m") == (base_name(OLD.name),) and table.fallbacks("m") == ()
        assert table.affinity("made-up") == "none" and "made-up" not in table._facts

    asyncio.run(check())


def test_an_engine_moved_to_another_address_leaves_its_ejection_behind() -> None:
    """Ray restarts a lost node's actor on another node under the same nonce: the new
    engine is not the cut-off one, so the old one's ejection no longer holds it out (with
    one replica it answered 503 until the old window ran out)."""

    async def check() -> None:
        table = Table()
        table.update([OLD])
        found = table.target("m")
        assert found is not None
        for _ in range(3):
            table.health.report(found, table.health.sent(found.nonce), "connection refused")
        assert table.target("m") is None and table.ejected("m") is not None
        table.update([OLD])  # a pass that changes nothing keeps the ejection
        assert table.target("m") is None
        table.update([replace(OLD, host="10.0.0.9")])  # the same nonce, another host
        moved = table.target("m")
        assert moved is not None and moved.host == "10.0.0.9", moved
        assert table.ejected("m") is None

    asyncio.run(check())


def test_a_pool_has_ended_only_when_no_instance_can_become_ready() -> None:
    """Every instance Failed or Succeeded, its ``@next`` too: the request is answered at
    once (test_ended.py). One still starting anywhere in the pool keeps it waiting."""

    async def check() -> None:
        table = Table()
        failed = replace(OLD, phase=Phase.FAILED)
        done = rec("m@1", "one", 8002, Phase.SUCCEEDED)
        table.update([failed, done])
        assert [r.name for r in table.ended("m")] == ["m", "m@1"]
        table.update([failed, done, NEXT_STARTING])  # a new instance is on its way
        assert table.ended("m") == ()
        table.update([failed, rec("m@1", "one", 8002, Phase.BACKOFF)])  # restarts itself
        assert table.ended("m") == () and table.ended("nope") == ()

    asyncio.run(check())


DRAIN = Drain.asked(datetime.now(UTC), 3600.0, None, by="alice", reason="swap GPU 1")
OVER = Drain.asked(datetime.now(UTC) - timedelta(hours=2), 3600.0, None, by="alice")


@pytest.mark.parametrize(
    ("phases", "drain", "held"),
    [
        pytest.param((Phase.IDLE,), DRAIN, True, id="idle-on-demand-drained"),
        pytest.param((Phase.PENDING, Phase.BACKOFF), DRAIN, True, id="pending-and-held-backoff"),
        pytest.param((Phase.PENDING, Phase.STARTING), DRAIN, False, id="one-starting-may-serve"),
        pytest.param((Phase.PENDING, Phase.READY), DRAIN, False, id="one-ready-serves"),
        pytest.param((Phase.PULLING,), DRAIN, False, id="a-pull-goes-on"),
        pytest.param((Phase.IDLE,), OVER, False, id="drain-over"),
        pytest.param((Phase.IDLE,), None, False, id="not-drained"),
    ],
)
def test_a_drain_holds_a_pool_none_of_whose_instances_may_start(
    phases: tuple[Phase, ...], drain: Drain | None, held: bool
) -> None:
    """A request waits for nothing the drain keeps from starting (it is answered at once);
    an instance starting, serving or pulling, or a drain run out, is worth the wait."""
    replicas = [
        replace(rec(f"m-{i}", f"n{i}", 8000 + i, p), models=("m",)) for i, p in enumerate(phases)
    ]
    table = Table()
    table.update(replicas, drain)
    assert table.drained("m") is (drain if held else None)
