"""The balancer alone (no daemon): least requests in flight, the two-random-choices
tie-break, and the routing table's pools (replicas, several deployments of one model,
a rolling ``@next`` in its instance's place, each ``metadata.name`` its own only)."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Literal

import pytest

from controller.core.manifest.names import base_name
from controller.core.state import Phase, Record
from controller.gateway.routing import balance
from controller.gateway.routing import table as table_module
from controller.gateway.routing.table import Table


@dataclass(frozen=True)
class Engine:
    nonce: str | None


A, B, C = Engine("a"), Engine("b"), Engine("c")


@pytest.mark.parametrize(
    ("inflight", "served", "allowed"),
    [
        ({"a": 3, "b": 1, "c": 2}, {}, {"b"}),  # the least in flight, whatever was served
        ({"a": 0, "b": 5, "c": 5}, {"a": 100}, {"a"}),
        ({}, {"a": 9, "b": 1, "c": 1}, {"b", "c"}),  # all idle: never the most served
        ({"a": 1, "b": 1, "c": 4}, {"a": 7, "b": 2}, {"b"}),  # a tie of two: fewer served
        ({"a": 2, "b": 2, "c": 2}, {"a": 1, "b": 1, "c": 1}, {"a", "b", "c"}),
    ],
)
def test_least_in_flight_then_two_random_choices(
    inflight: dict[str | None, int], served: dict[str | None, int], allowed: set[str]
) -> None:
    rng = random.Random(7)
    picked = {balance.pick([A, B, C], inflight, served, rng).nonce for _ in range(200)}
    assert picked <= allowed
    assert len(picked) == len(allowed)  # every allowed one comes up in 200 draws


def test_one_candidate_and_none() -> None:
    assert balance.pick([B], {"b": 9}, {}, random.Random(1)) is B
    with pytest.raises(ValueError, match="no instance"):
        balance.pick([], {}, {}, random.Random(1))


def test_idle_requests_spread_evenly_by_the_tie_break() -> None:
    # Requests one after the other: every instance is at 0 in flight each time, so only
    # the tie-break spreads them; the served count keeps the spread tight.
    served: Counter[str | None] = Counter()
    rng = random.Random(3)
    for _ in range(60):
        served[balance.pick([A, B, C], {}, served, rng).nonce] += 1
    assert min(served.values()) >= 17 and max(served.values()) <= 23, served


Affinity = Literal["none", "session"]


def rec(
    name: str,
    nonce: str,
    port: int,
    *,
    model: str = "m",
    phase: Phase = Phase.READY,
    affinity: Affinity = "none",
) -> Record:
    models = (base_name(name), model)
    return Record(
        name=name,
        owner="o",
        node="n",
        nonce=nonce,
        port=port,
        phase=phase,
        models=models,
        affinity=affinity,
    )


def table_of(*records: Record) -> Table:
    table = Table(random.Random(5))
    table.update(records)
    return table


def ports(table: Table, name: str, n: int = 60, **kw: str) -> Counter[int]:
    out: Counter[int] = Counter()
    for _ in range(n):
        target = table.target(name, **kw)
        assert target is not None
        out[target.port] += 1
        table.request_began(target.nonce)  # as the gateway's _send counts it
        table.request_ended(target.nonce)
    return out


def busy(table: Table, requests: dict[str, int]) -> None:
    """Requests in flight on these engines (begun, not ended)."""
    for nonce, n in requests.items():
        for _ in range(n):
            table.request_began(nonce)


POOL = (rec("a", "a0", 8000), rec("a@1", "a1", 8001), rec("b", "b0", 8002, model="m"))


def test_a_pool_is_every_instance_of_every_deployment_of_the_model() -> None:
    async def check() -> None:
        table = table_of(*POOL)
        assert table.pools == {"a": ("a",), "b": ("b",), "m": ("a", "b")}
        assert table.instances == {"a": ("a", "a@1"), "b": ("b",)}
        assert set(ports(table, "m")) == {8000, 8001, 8002}
        assert set(ports(table, "a")) == {8000, 8001}  # a's name: a's replicas only
        assert set(ports(table, "b")) == {8002}
        assert table.label("a") == "a" and table.label("m") == "m"
        target = table.target("b")
        assert target is not None and (target.deployment, target.instance) == ("b", "b")

    asyncio.run(check())


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("none", {8000, 8001, 8002}),
        ("a@1 Starting", {8000, 8002}),
        ("a@1@next Ready", {8000, 8003, 8002}),  # the new instance replaces its own
        ("a@1@next Starting", {8000, 8001, 8002}),
        ("a1 retired", {8000, 8002}),
        ("a1 down", {8000, 8002}),
        ("avoid b0", {8000, 8001}),
    ],
)
def test_who_is_in_the_pool(change: str, expected: set[int]) -> None:
    async def check() -> None:
        records = list(POOL)
        avoid = "-"
        if change == "a@1 Starting":
            records[1] = rec("a@1", "a1", 8001, phase=Phase.STARTING)
        elif change.startswith("a@1@next"):
            phase = Phase.READY if change.endswith("Ready") else Phase.STARTING
            records.append(rec("a@1@next", "a1n", 8003, phase=phase))
        table = table_of(*records)
        if change == "a1 retired":
            retiring = asyncio.create_task(table.retire(records[1], None, timeout=0))
            await retiring
        elif change == "a1 down":
            found = [t for t in table.candidates("m") if t.nonce == "a1"]
            table.mark_down(found[0])
        elif change == "avoid b0":
            avoid = "b0"
        assert set(ports(table, "m", avoid=avoid)) == expected

    asyncio.run(check())


def test_an_engine_that_refused_stays_out_until_its_own_record_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another engine's record written meanwhile does not put a refused engine back (it
    has nothing in flight: least in flight would choose it first); its own record
    changing does, and so does the end of ``DOWN_FOR``."""

    async def check() -> None:
        table = table_of(*POOL)
        table.mark_down(next(t for t in table.candidates("m") if t.nonce == "a1"))
        # another record rewritten: a1 stays out
        moved_b = dataclasses.replace(POOL[2], message="probed again")
        table.update([POOL[0], POOL[1], moved_b])
        assert set(ports(table, "m")) == {8000, 8002}
        restarted = dataclasses.replace(POOL[1], restarts=1)  # its own: routed again
        table.update([POOL[0], restarted, moved_b])
        assert set(ports(table, "m")) == {8000, 8001, 8002}
        monkeypatch.setattr(table_module, "DOWN_FOR", 0.0)  # and a mark's time runs out
        table.mark_down(next(t for t in table.candidates("m") if t.nonce == "a1"))
        assert set(ports(table, "m")) == {8000, 8001, 8002}

    asyncio.run(check())


def test_a_request_waiting_for_the_only_engine_marked_down_gets_it_when_the_mark_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No record change announces a mark's end: the wait ends then too, not at the
    request's deadline."""
    monkeypatch.setattr(table_module, "DOWN_FOR", 0.2)

    async def check() -> None:
        table = table_of(rec("solo", "s0", 8000))
        table.mark_down(table.candidates("solo")[0])
        began = time.monotonic()
        found = await table.wait_target("solo", 30.0)
        assert found is not None and found.nonce == "s0"
        assert time.monotonic() - began < 10.0  # the mark's 0.2 s, not the 30 s deadline

    asyncio.run(check())


def test_least_in_flight_across_the_pool() -> None:
    async def check() -> None:
        table = table_of(*POOL)
        busy(table, {"a0": 2, "a1": 1, "b0": 3})
        assert {ports(table, "m", 20).most_common(1)[0][0]} == {8001}
        busy(table, {"a1": 4})  # 5 in flight
        assert set(ports(table, "m", 20)) == {8000}

    asyncio.run(check())


def test_deadline_phases_and_on_demand_cover_the_pool() -> None:
    async def check() -> None:
        slow = Record(
            name="b",
            owner="o",
            node="n",
            models=("b", "m"),
            port=8009,
            phase=Phase.STARTING,
            ready_deadline_seconds=90.0,
            activation="OnDemand",
        )
        table = table_of(rec("a", "a0", 8000), slow)
        assert table.deadline("m") == 90.0 and table.deadline("a") == 0.0
        assert table.phases("m") == "Ready, Starting" and table.phases("nope") == "gone"
        assert table.on_demand("m") == ("b",) and table.on_demand("a") == ()
        assert [r.name for r in table.starting("m")] == ["b"] and table.starting("a") == []

    asyncio.run(check())


def test_session_affinity_through_the_table() -> None:
    async def check() -> None:
        records = [
            rec(f"a@{i}" if i else "a", f"n{i}", 8000 + i, affinity="session") for i in range(4)
        ]
        table = table_of(*records)
        where = {}
        for i in range(100):
            target = table.target("m", session=f"user-{i}")
            assert target is not None
            where[i] = target.port
        for _ in range(3):  # every session again: the same instance each time
            for i in range(100):
                target = table.target("m", session=f"user-{i}")
                assert target is not None and target.port == where[i]
        spread = Counter(where.values())
        assert len(spread) == 4 and max(spread.values()) <= 1.25 * 25, spread
        # No session key: balanced as usual.
        assert len(ports(table, "m", 40)) == 4

    asyncio.run(check())
