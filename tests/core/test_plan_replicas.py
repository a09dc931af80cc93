"""The planner with ``spec.replicas``: expansion, spread, scale-down order, replicas: 0,
preemption of replicas (above autoscale.min first), and RollingUpdate with and without
surge room. Each case is (desired, observed, inventory) -> the exact actions."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import GI, NOW, desired, entry, inventory, observed, record, ref, view

from controller.core.actions import (
    AnyAction,
    Hold,
    Park,
    Preempt,
    Promote,
    Start,
    Stop,
)
from controller.core.devices.inventory import Device, Inventory
from controller.core.manifest.names import replica_name, replica_of
from controller.core.plan import Desired, plan
from controller.core.state import Observed, Phase, RecordView

GPU3 = inventory("nvidia:0", "nvidia:1", "nvidia:2")
GPU4 = inventory("nvidia:0", "nvidia:1", "nvidia:2", "nvidia:3")
GPU1: dict[str, Any] = {"devices": {"count": 1, "kind": "nvidia"}}


def run(want: Desired, seen: Observed | None = None, inv: Inventory = GPU3) -> list[AnyAction]:
    return plan(want, seen or Observed(), inv, NOW)


def shape(actions: list[AnyAction]) -> list[tuple[str, str]]:
    return [(type(a).__name__, a.name) for a in actions]


def starts(actions: list[AnyAction]) -> dict[str, Start]:
    return {a.name: a for a in actions if isinstance(a, Start)}


def ready(name: str, spec: Any, device: str, port: int, **fields: Any) -> RecordView:
    """A live Ready replica ``name`` of ``spec`` on ``device``."""
    rec = record(name, spec=spec, devices=(device,), port=port, **fields)
    return view(rec, alive=True)


# -- expansion and spread ----------------------------------------------------------------


def test_three_replicas_start_on_three_devices_and_ports() -> None:
    web = entry("web", replicas=3, **GPU1)
    placed = starts(run(desired(web)))
    assert sorted(placed) == ["web", "web@1", "web@2"]
    assert sorted(d for s in placed.values() for d in s.devices) == [
        "nvidia:0",
        "nvidia:1",
        "nvidia:2",
    ]
    assert len({s.port for s in placed.values()}) == 3
    assert "new replica (replicas: 3)" in placed["web@2"].reason


def test_one_replica_is_the_record_of_before() -> None:
    actions = run(desired(entry("web", **GPU1)))
    assert shape(actions) == [("Start", "web")]
    assert actions[0].reason.startswith("new deployment")


def test_replicas_beyond_the_devices_wait_each_on_its_own_record() -> None:
    web = entry("web", replicas=4, **GPU1)
    actions = run(desired(web))
    assert sorted(starts(actions)) == ["web", "web@1", "web@2"]
    (hold,) = [a for a in actions if isinstance(a, Hold)]
    assert hold.name == "web@3" and "no capacity" in hold.reason


def test_shareable_replicas_spread_before_they_stack() -> None:
    web = entry("web", replicas=2, devices={"count": 1, "kind": "nvidia", "shareable": True})
    sibling = ready("web", web, "nvidia:0", 8000)
    placed = starts(run(desired(web), observed(sibling), inventory("nvidia:0", "nvidia:1")))
    assert placed["web@1"].devices == ("nvidia:1",)  # first fit alone would stack on 0


def test_shareable_replicas_stack_when_no_other_device_fits() -> None:
    web = entry("web", replicas=2, devices={"count": 1, "kind": "nvidia", "shareable": True})
    placed = starts(run(desired(web), inv=inventory("nvidia:0")))
    assert [s.devices for s in placed.values()] == [("nvidia:0",), ("nvidia:0",)]


def test_memory_packed_replicas_prefer_distinct_devices() -> None:
    devices = tuple(Device(kind="nvidia", id=str(i), memory=80 * GI) for i in range(2))
    web = entry("web", replicas=2, devices={"count": 1, "kind": "nvidia", "memory": "10Gi"})
    other = entry("other", devices={"count": 1, "kind": "nvidia", "memory": "10Gi"})
    # `other` is Ready on nvidia:0 (a start beside a starting one would wait its turn)
    seen = observed(ready("other", other, "nvidia:0", 8100, memory=10 * GI, ref=ref(100)))
    placed = starts(run(desired(web, other), seen, inv=Inventory(devices, source="static")))
    assert placed["web"].devices == ("nvidia:0",)  # packs best fit beside another deployment
    assert placed["web@1"].devices == ("nvidia:1",)  # best fit alone packs both on 0


# -- scaling -------------------------------------------------------------------------------


def _three(web: Any) -> Observed:
    return observed(
        ready("web", web, "nvidia:0", 8000, ref=ref(101)),
        ready("web@1", web, "nvidia:1", 8001, ref=ref(102)),
        ready("web@2", web, "nvidia:2", 8002, ref=ref(103)),
    )


def test_scale_down_stops_the_highest_replicas_first() -> None:
    web = entry("web", replicas=1, **GPU1)
    actions = run(desired(web), _three(web))
    assert shape(actions) == [("Stop", "web@1"), ("Stop", "web@2")]
    assert all(a.reason == "scaled down to 1" for a in actions)
    # the deployment remains: its remembered count stays (launcher._dropped)
    assert not any(isinstance(a, Stop) and a.undeclared for a in actions)


def test_the_desired_count_comes_from_the_autoscaler_over_the_manifest() -> None:
    web = entry("web", replicas=3, autoscale={"min": 1, "max": 3}, **GPU1)
    actions = run(desired(web, replicas={"web": 2}), _three(web))
    assert shape(actions) == [("Stop", "web@2")]
    assert actions[0].reason == "scaled down to 2"


def test_scale_up_starts_only_the_new_replicas() -> None:
    web = entry("web", replicas=3, **GPU1)
    seen = observed(ready("web", web, "nvidia:1", 8000))
    placed = starts(run(desired(web), seen))
    assert sorted(placed) == ["web@1", "web@2"]  # replica 0 untouched
    assert {d for s in placed.values() for d in s.devices} == {"nvidia:0", "nvidia:2"}


def test_replicas_zero_records_an_idle_deployment() -> None:
    actions = run(desired(entry("web", replicas=0, **GPU1)))
    assert shape(actions) == [("Park", "web")]
    assert "scaled to 0" in actions[0].reason


def test_scaling_to_zero_parks_replica_zero_and_stops_the_rest() -> None:
    web = entry("web", replicas=0, **GPU1)
    actions = run(desired(web), _three(web))
    assert shape(actions) == [("Stop", "web@1"), ("Stop", "web@2"), ("Park", "web")]
    park = actions[-1]
    assert isinstance(park, Park) and "scaled to 0" in park.reason


def test_a_deployment_scaled_to_zero_stays_idle() -> None:
    web = entry("web", replicas=0, **GPU1)
    idle = record(
        "web", spec=web, phase=Phase.IDLE, message="scaled to 0: declared, nothing running"
    )
    assert run(desired(web), observed(view(idle))) == []


def test_an_idle_replica_record_is_placed_under_its_own_name() -> None:
    """An Idle replica without the scale-to-zero words (no record this release writes: an
    older one's, or one edited by hand) is placed as itself. It asked for the deployment's
    own name, so a plan started replica 0, already running, a second time (found by
    tests/core/test_plan.py's property that a plan acts on each instance once)."""
    web = entry("web", replicas=2, **GPU1)
    idle = view(record("web@1", spec=web, phase=Phase.IDLE, port=None, message="idle"))
    seen = observed(ready("web", web, "nvidia:0", 8000), idle)
    assert shape(run(desired(web), seen)) == [("Start", "web@1")]


def test_scaling_up_from_zero_starts_every_replica() -> None:
    web = entry("web", replicas=2, **GPU1)
    idle = record(
        "web", spec=web, phase=Phase.IDLE, message="scaled to 0: declared, nothing running"
    )
    placed = starts(run(desired(web), observed(view(idle))))
    assert sorted(placed) == ["web", "web@1"]
    assert "scaled up to 2" in placed["web"].reason


def test_a_replica_record_of_a_removed_manifest_is_stopped() -> None:
    web = entry("web", replicas=2, **GPU1)
    seen = observed(ready("web", web, "nvidia:0", 8000), ready("web@1", web, "nvidia:1", 8001))
    actions = run(desired(), seen)
    assert shape(actions) == [("Stop", "web"), ("Stop", "web@1")]
    assert all("manifest removed" in a.reason for a in actions)
    # the deployment is gone: its remembered count goes with its records
    assert all(isinstance(a, Stop) and a.undeclared for a in actions)


def test_a_replica_of_a_broken_manifest_keeps_running() -> None:
    web = entry("web", replicas=2, **GPU1)
    seen = observed(ready("web", web, "nvidia:0", 8000), ready("web@1", web, "nvidia:1", 8001))
    actions = run(desired(invalid={"web": "spec.replicas: bad"}), seen)
    assert [type(a).__name__ for a in actions] == ["MarkSpec", "MarkSpec"]  # invariant 4


def test_a_crashed_replica_restarts_alone() -> None:
    web = entry("web", replicas=3, **GPU1)
    seen = _three(web)
    crashed = view(seen.records["web@1"].record, alive=False)
    seen = observed(seen.records["web"], crashed, seen.records["web@2"])
    actions = run(desired(web), seen)
    assert shape(actions) == [("Fail", "web@1")]


# -- preemption -------------------------------------------------------------------------


def test_preemption_counts_replicas_one_by_one_and_spares_the_floor() -> None:
    """``low`` has 3 replicas above autoscale.min 1: a higher priority one stops one
    replica, the most recently started of those above min (never replica 0 here)."""
    low = entry("low", replicas=3, autoscale={"min": 1, "max": 3}, **GPU1)
    seen = observed(
        ready("low", low, "nvidia:0", 8000, started_at=NOW - timedelta(seconds=10)),
        ready("low@1", low, "nvidia:1", 8001, started_at=NOW - timedelta(seconds=30)),
        ready("low@2", low, "nvidia:2", 8002, started_at=NOW - timedelta(seconds=20)),
    )
    high = entry("high", priority=5, **GPU1)
    actions = run(desired(low, high), seen)
    assert shape(actions) == [("Preempt", "low@2"), ("Start", "high")]
    (pre,) = [a for a in actions if isinstance(a, Preempt)]
    assert pre.reason == "preempted by high (priority 5)"


def test_without_autoscale_the_most_recent_replica_goes() -> None:
    low = entry("low", replicas=2, **GPU1)
    seen = observed(
        ready("low", low, "nvidia:0", 8000, started_at=NOW - timedelta(seconds=10)),
        ready("low@1", low, "nvidia:1", 8001, started_at=NOW - timedelta(seconds=30)),
    )
    high = entry("high", priority=5, **GPU1)
    actions = run(desired(low, high), seen, inventory("nvidia:0", "nvidia:1"))
    assert shape(actions) == [("Preempt", "low"), ("Start", "high")]


def test_a_replicated_high_priority_deployment_preempts_per_replica() -> None:
    low = entry("low", replicas=2, **GPU1)
    seen = observed(
        ready("low", low, "nvidia:0", 8000, started_at=NOW - timedelta(seconds=10)),
        ready("low@1", low, "nvidia:1", 8001, started_at=NOW - timedelta(seconds=30)),
    )
    high = entry("high", priority=5, replicas=2, **GPU1)
    actions = run(desired(low, high), seen, inventory("nvidia:0", "nvidia:1"))
    assert sorted(shape(actions)) == [
        ("Preempt", "low"),
        ("Preempt", "low@1"),
        ("Start", "high"),
        ("Start", "high@1"),
    ]


# -- RollingUpdate with replicas ------------------------------------------------------------


def _rolling(**spec: Any) -> Any:
    return entry("web", replicas=3, strategy="RollingUpdate", args=["--v2"], **GPU1, **spec)


def test_rolling_with_surge_room_starts_one_next_beside_ready_olds() -> None:
    old = entry("web", replicas=3, strategy="RollingUpdate", **GPU1)
    actions = run(desired(_rolling()), _three(old), GPU4)
    assert shape(actions) == [("Start", "web@next")]
    (start,) = actions
    assert isinstance(start, Start) and start.devices == ("nvidia:3",)
    assert "surge: up to 1 new beside the old (maxSurge)" in start.reason


def test_rolling_surge_two_starts_two_nexts() -> None:
    old = entry("web", replicas=3, strategy="RollingUpdate", **GPU1)
    new = _rolling(rollingUpdate={"maxSurge": 2})
    five = inventory(*(f"nvidia:{i}" for i in range(5)))
    assert shape(run(desired(new), _three(old), five)) == [
        ("Start", "web@1@next"),
        ("Start", "web@next"),
    ]


def test_rolling_surge_percentage_rounds_up() -> None:
    old = entry("web", replicas=3, strategy="RollingUpdate", **GPU1)
    new = _rolling(rollingUpdate={"maxSurge": "34%"})  # 1.02 -> 2
    five = inventory(*(f"nvidia:{i}" for i in range(5)))
    assert len(starts(run(desired(new), _three(old), five))) == 2


def test_rolling_waits_while_a_next_is_starting() -> None:
    old = entry("web", replicas=3, strategy="RollingUpdate", **GPU1)
    new = _rolling()
    seen = _three(old)
    nxt = record("web@next", spec=new, phase=Phase.STARTING, devices=("nvidia:3",), port=8003)
    seen = observed(*seen.records.values(), view(nxt, alive=True))
    assert run(desired(new), seen, GPU4) == []


def test_a_ready_next_of_a_replica_is_promoted_under_its_name() -> None:
    old = entry("web", replicas=3, strategy="RollingUpdate", **GPU1)
    new = _rolling()
    seen = _three(old)
    nxt = record("web@1@next", spec=new, devices=("nvidia:3",), port=8003)
    seen = observed(*seen.records.values(), view(nxt, alive=True))
    actions = run(desired(new), seen, GPU4)
    assert shape(actions) == [("Promote", "web@1")]
    assert isinstance(actions[0], Promote) and "web@1@next is Ready" in actions[0].reason


def test_rolling_without_surge_room_replaces_one_replica_at_a_time() -> None:
    old = entry("web", replicas=3, strategy="RollingUpdate", **GPU1)
    actions = run(desired(_rolling()), _three(old), GPU3)
    assert shape(actions) == [("Replace", "web")]  # web@1 and web@2 serve
    assert "no room for a surge (no capacity" in actions[0].reason
    assert "replacing one at a time in place, at most 1 down" in actions[0].reason


def test_rolling_in_place_waits_for_the_replaced_replica() -> None:
    old = entry("web", replicas=3, strategy="RollingUpdate", **GPU1)
    new = _rolling()
    seen = _three(old)
    starting = record("web", spec=new, phase=Phase.STARTING, devices=("nvidia:0",), port=8000)
    seen = observed(view(starting, alive=True), seen.records["web@1"], seen.records["web@2"])
    assert run(desired(new), seen, GPU3) == []  # one down already: maxUnavailable 0 -> 1


def test_a_replica_replaced_in_place_gets_the_room_it_freed_before_any_surge() -> None:
    # No room for a surge: `web` was stopped for its new spec, freeing nvidia:0. The next
    # pass starts it there; a surge for `web@1` would take that room and leave `web`
    # Pending "no capacity" (a trial's `reconcile restart` then exited 1, "cannot progress").
    old = entry("web", replicas=3, strategy="RollingUpdate", **GPU1)
    new = _rolling()
    waiting = record("web", spec=new, phase=Phase.PENDING, devices=(), port=None, ref=None)
    seen = _three(old)
    seen = observed(view(waiting), seen.records["web@1"], seen.records["web@2"])
    actions = run(desired(new), seen, GPU3)
    assert shape(actions) == [("Start", "web")]
    assert starts(actions)["web"].devices == ("nvidia:0",)


def test_rolling_max_surge_zero_replaces_up_to_max_unavailable() -> None:
    old = entry("web", replicas=3, strategy="RollingUpdate", **GPU1)
    new = _rolling(rollingUpdate={"maxSurge": 0, "maxUnavailable": 2})
    actions = run(desired(new), _three(old), GPU4)  # room, but maxSurge 0 forbids a surge
    assert shape(actions) == [("Replace", "web"), ("Replace", "web@1")]
    assert all("no surge: up to 2 at a time in place, at most 2 down" in a.reason for a in actions)


def test_rolling_max_unavailable_percentage_rounds_down() -> None:
    old = entry("web", replicas=3, strategy="RollingUpdate", **GPU1)
    new = _rolling(rollingUpdate={"maxSurge": 0, "maxUnavailable": "66%"})  # 1.98 -> 1
    assert shape(run(desired(new), _three(old), GPU3)) == [("Replace", "web")]


@pytest.mark.parametrize(
    ("declared", "drains"),
    [
        pytest.param(True, True, id="spec-changed-again"),
        pytest.param(False, False, id="manifest-removed"),
    ],
)
def test_an_abandoned_ready_next_drains_unless_its_deployment_is_pruned(
    declared: bool, drains: bool
) -> None:
    # A Ready `@next` takes its instance's requests at the gateway: stopped for a newer
    # spec, its answers in flight end first (a trial under load had two streams cut).
    old = entry("web", strategy="RollingUpdate", **GPU1)
    v2 = entry("web", strategy="RollingUpdate", args=["--v2"], **GPU1)
    v3 = entry("web", strategy="RollingUpdate", args=["--v3"], **GPU1)
    seen = observed(ready("web", old, "nvidia:0", 8000), ready("web@next", v2, "nvidia:1", 8001))
    by_name = {a.name: a for a in run(desired(v3) if declared else desired(), seen)}
    stop = by_name["web@next"]
    assert isinstance(stop, Stop) and stop.reason.startswith("rolling update abandoned"), stop
    assert stop.drain is drains


def test_a_next_abandoned_by_a_rename_in_its_file_says_so_and_drains() -> None:
    # `metadata.name: web` edited to `chat` while `web@next` rolls: its file is right there
    # (no "manifest removed"), and the model may be served on by the new name, so the Ready
    # `@next`'s answers in flight end first, as the old instance's do.
    old = entry("web", strategy="RollingUpdate", **GPU1)
    v2 = entry("web", strategy="RollingUpdate", args=["--v2"], **GPU1)
    chat = entry("chat", strategy="RollingUpdate", args=["--v2"], **GPU1)
    seen = observed(ready("web", old, "nvidia:0", 8000), ready("web@next", v2, "nvidia:1", 8001))
    by_name = {a.name: a for a in run(desired(chat), seen)}
    for name in ("web", "web@next"):
        stop = by_name[name]
        assert isinstance(stop, Stop) and stop.drain, stop
        assert "which now declares chat (renamed in place?)" in stop.reason, stop
        assert "manifest removed" not in stop.reason, stop
    assert by_name["web@next"].reason.startswith("rolling update abandoned: removed from")


def test_a_next_of_a_scaled_away_replica_is_abandoned() -> None:
    old = entry("web", replicas=3, strategy="RollingUpdate", **GPU1)
    new = entry("web", replicas=1, strategy="RollingUpdate", args=["--v2"], **GPU1)
    seen = _three(old)
    nxt = record("web@2@next", spec=new, phase=Phase.STARTING, devices=("nvidia:3",), port=8003)
    seen = observed(*seen.records.values(), view(nxt, alive=True))
    actions = run(desired(new), seen, GPU4)
    by_name = {a.name: a for a in actions}
    assert isinstance(by_name["web@2@next"], Stop)
    assert by_name["web@2@next"].reason == "rolling update abandoned: scaled down to 1"
    assert by_name["web@2@next"].drain  # its requests end first, as a scaled-away replica's
    assert by_name["web@2"].reason == "scaled down to 1"
    assert isinstance(by_name["web@1"], Stop)


@pytest.mark.parametrize("replicas", [1, 3])
def test_an_unchanged_replicated_deployment_plans_nothing(replicas: int) -> None:
    web = entry("web", replicas=replicas, **GPU1)
    seen = _three(web) if replicas == 3 else observed(ready("web", web, "nvidia:0", 8000))
    assert run(desired(web), seen) == []


# -- properties --------------------------------------------------------------------------


@given(
    replicas=st.integers(1, 5),
    devices=st.integers(1, 4),
    shareable=st.booleans(),
    held=st.integers(0, 2),
)
def test_property_replicas_share_a_device_only_when_no_other_fits(
    replicas: int, devices: int, shareable: bool, held: int
) -> None:
    """Starting replicas beside ``held`` running siblings: every new one takes a device
    no sibling holds while there is one; only a shareable lease ever stacks."""
    inv = inventory(*(f"nvidia:{i}" for i in range(devices)))
    web = entry("web", replicas=replicas, devices={"count": 1, "shareable": shareable})
    running = [
        ready(replica_name("web", i), web, f"nvidia:{i}", 8000 + i)
        for i in range(min(held, replicas, devices))
    ]
    actions = run(desired(web), observed(*running), inv)
    taken = [v.record.devices[0] for v in running]
    for start in sorted(starts(actions).values(), key=lambda s: replica_of(s.name)):
        (device,) = start.devices
        assert device not in taken or len(set(taken)) == devices, (taken, start)
        assert shareable or device not in taken
        taken.append(device)
    ports = [a.port for a in actions if isinstance(a, Start)]
    assert len(ports) == len(set(ports))
