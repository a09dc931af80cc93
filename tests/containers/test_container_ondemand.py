"""OnDemand in a container: parked Idle (no container), woken by a request through the
gateway, answering from the container, then Idle again with its container removed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from containers.conftest import ANSWERING, Engine, write
from gateway.conftest import Gateways, gateway  # noqa: F401 (the fixture, as tests/gateway has it)

if TYPE_CHECKING:
    from conftest import Reconcile


def test_an_on_demand_container_is_woken_by_a_request_and_parked_again(
    rc: Reconcile,
    engine: Engine,
    gateway: Gateways,  # noqa: F811
) -> None:
    write(rc, engine, "lazybox", command=ANSWERING, activation="OnDemand", idleTimeout="3s")
    g = gateway()
    g.wait_phase("lazybox", "Idle")
    assert engine.ours(rc.state) == [] and not rc.pids("lazybox")
    answer = g.post("lazybox")
    assert answer.status == 200, answer
    said = answer.json()["choices"][0]["message"]["content"]
    assert said == "hello from a container", answer
    g.wait_phase("lazybox", "Ready", timeout=30)
    record = rc.record("lazybox")
    assert record is not None and record["container"]["runtime"] == engine.name, record
    assert engine.ours(rc.state) == [record["container"]["id"]]
    g.wait_phase("lazybox", "Idle", timeout=60)
    rc.wait_for(lambda: engine.ours(rc.state) == [], what="container removed")
    assert rc.record("lazybox")["port"] is None  # type: ignore[index]  # holds nothing
    g.finish()
