"""The planner with Unhealthy devices (core/devicefaults.py observed): nothing is placed
on one, our records holding one are moved (Replace, the next round's Start elsewhere)
with the fault in the reason; others' records and reservations are left alone. And the
pure step from NVML's facts to device health: which Xids count, ECC rises, --clear."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import (
    NOW,
    OWNER,
    Scenario,
    desired,
    entry,
    inventory,
    memory_scenarios,
    observed,
    record,
    scenarios,
    view,
)

from controller.core.actions import AnyAction, Hold, Replace, Start, Stop
from controller.core.devicefaults import (
    DeviceFault,
    DeviceHealth,
    Reading,
    XidEvent,
    observe,
)
from controller.core.devices.inventory import Device, Inventory
from controller.core.plan import plan
from controller.core.state import Observed, Phase

GPU2 = inventory("nvidia:0", "nvidia:1")
GPU1: dict[str, Any] = {"devices": {"count": 1, "kind": "nvidia"}}
XID79 = DeviceFault("nvidia:1", "Xid 79 (GPU has fallen off the bus)", NOW)
SICK = {"nvidia:1": XID79}


def run(seen: Observed, *entries: Any) -> list[AnyAction]:
    return plan(desired(*entries), seen, GPU2, NOW)


def shape(actions: list[AnyAction]) -> list[tuple[str, str]]:
    return [(type(a).__name__, a.name) for a in actions]


WEB = entry("web", **GPU1)


@pytest.mark.parametrize(
    ("seen", "expected"),
    [
        pytest.param(observed(unhealthy=SICK), [("Start", "web")], id="new-start-avoids-it"),
        pytest.param(
            observed(view(record("web", spec=WEB, devices=("nvidia:1",), port=8000), alive=True)),
            [],
            id="healthy-nothing-to-do",
        ),
        pytest.param(
            observed(
                view(record("web", spec=WEB, devices=("nvidia:1",), port=8000), alive=True),
                unhealthy=SICK,
            ),
            [("Replace", "web")],
            id="ready-on-it-is-moved",
        ),
        pytest.param(
            observed(
                view(
                    record("web", spec=WEB, devices=("nvidia:1",), port=8000, phase=Phase.BACKOFF)
                ),
                unhealthy=SICK,
            ),
            [("Replace", "web")],
            id="backoff-on-it-is-moved",
        ),
        pytest.param(
            observed(
                view(record("web", spec=WEB, devices=("nvidia:0",), port=8000), alive=True),
                unhealthy=SICK,
            ),
            [],
            id="on-a-healthy-device-stays",
        ),
        pytest.param(
            observed(
                view(
                    record("web", owner="other", spec=WEB, devices=("nvidia:1",), port=8000),
                    alive=True,
                ),
                unhealthy=SICK,
            ),
            [("Conflict", "web")],
            id="another-owners-record-is-theirs-to-move",
        ),
    ],
)
def test_unhealthy_devices_in_the_plan(seen: Observed, expected: list[tuple[str, str]]) -> None:
    actions = run(seen, WEB)
    assert shape(actions) == expected
    for action in actions:
        if isinstance(action, Start):
            assert action.devices == ("nvidia:0",)
        if isinstance(action, Replace):
            assert "device nvidia:1 Unhealthy since" in action.reason
            assert "Xid 79 (GPU has fallen off the bus)" in action.reason


def test_the_moved_record_starts_on_the_healthy_device_the_round_after() -> None:
    (start,) = run(observed(unhealthy=SICK), WEB)  # the Replace dropped its record
    assert isinstance(start, Start) and start.devices == ("nvidia:0",)


def test_no_healthy_device_left_holds_with_the_fault_named() -> None:
    both = {"nvidia:0": DeviceFault("nvidia:0", "Xid 48 (double-bit ECC error)", NOW), **SICK}
    (hold,) = run(observed(unhealthy=both), WEB)
    assert isinstance(hold, Hold) and "Unhealthy (Xid 48" in hold.reason, hold.reason


def test_a_record_whose_manifest_is_gone_is_stopped_not_replaced() -> None:
    rec = record("old", devices=("nvidia:1",), port=8000)
    (stop,) = plan(desired(owner=OWNER), observed(view(rec, alive=True), unhealthy=SICK), GPU2, NOW)
    assert type(stop) is Stop and "Unhealthy" in stop.reason


def test_memory_requests_do_not_pack_onto_an_unhealthy_device() -> None:
    packed = entry("small", devices={"count": 1, "kind": "nvidia", "memory": "10Gi"})
    sized = Inventory(tuple(Device(kind="nvidia", id=i, memory=80 << 30) for i in "01"))
    (start,) = plan(desired(packed), observed(unhealthy=SICK), sized, NOW)
    assert isinstance(start, Start) and start.devices == ("nvidia:0",)


# -- NVML's facts -> device health ---------------------------------------------------------

LATER = NOW + timedelta(minutes=1)


@pytest.mark.parametrize(
    ("reading", "before", "reason"),
    [
        pytest.param(Reading(xids=(XidEvent("nvidia:1", 79, NOW),)), {}, "Xid 79", id="xid-79"),
        pytest.param(Reading(xids=(XidEvent("nvidia:1", 95, NOW),)), {}, "Xid 95", id="xid-95"),
        pytest.param(Reading(xids=(XidEvent("nvidia:1", 13, NOW),)), {}, None, id="app-xid-13"),
        pytest.param(Reading(xids=(XidEvent("nvidia:1", 31, NOW),)), {}, None, id="app-xid-31"),
        pytest.param(Reading(ecc={"nvidia:1": 3}), {}, None, id="first-ecc-reading-is-the-base"),
        pytest.param(Reading(ecc={"nvidia:1": 3}), {"nvidia:1": 3}, None, id="ecc-unchanged"),
        pytest.param(Reading(ecc={"nvidia:1": 0}), {"nvidia:1": 3}, None, id="ecc-reset"),
        pytest.param(
            Reading(ecc={"nvidia:1": 4}), {"nvidia:1": 3}, "rose from 3 to 4", id="ecc-rise"
        ),
    ],
)
def test_what_makes_a_device_unhealthy(
    reading: Reading, before: dict[str, int], reason: str | None
) -> None:
    after = observe(DeviceHealth(ecc=before), reading, LATER)
    fault = after.faults.get("nvidia:1")
    if reason is None:
        assert fault is None
    else:
        assert fault is not None and reason in fault.reason
    assert after.ecc == {**before, **reading.ecc}


def test_clear_returns_a_device_and_its_old_xid_is_not_held_against_it_again() -> None:
    xid = Reading(xids=(XidEvent("nvidia:1", 79, NOW),), ecc={"nvidia:1": 5})
    sick = observe(DeviceHealth(), xid, NOW)
    assert sick.faults["nvidia:1"].since == NOW
    cleared = sick.cleared_now("nvidia:1", LATER)
    assert cleared.faults == {} and "nvidia:1" not in cleared.ecc
    assert observe(cleared, xid, LATER).faults == {}  # the same event, from before the clear
    again = Reading(xids=(XidEvent("nvidia:1", 79, LATER + timedelta(seconds=1)),))
    assert "nvidia:1" in observe(cleared, again, LATER).faults


# -- properties over random plans --------------------------------------------------------


@given(st.one_of(scenarios(), memory_scenarios()), st.data())
def test_property_nothing_starts_on_an_unhealthy_device_and_ours_on_one_move(
    scenario: Scenario, data: st.DataObject
) -> None:
    keys = [d.key for d in scenario.inventory.devices]
    sick = data.draw(st.lists(st.sampled_from(keys), unique=True) if keys else st.just([]))
    faults = {k: DeviceFault(k, "Xid 79 (GPU has fallen off the bus)", NOW) for k in sick}
    seen = dataclasses.replace(scenario.observed, unhealthy=faults)
    actions = plan(scenario.desired, seen, scenario.inventory, NOW)
    for action in actions:
        if isinstance(action, Start):
            assert not set(action.devices) & set(sick), action
    moved = {a.name for a in actions if isinstance(a, Stop)}  # Replace is a Stop
    for name, rec in scenario.holders():
        on_sick = rec.holds and set(rec.devices) & set(sick)
        settled = rec.phase not in (Phase.RESERVED, Phase.TERMINATING)
        if on_sick and settled and rec.owner == OWNER and not rec.elsewhere(seen.node):
            assert name in moved, (name, rec.phase, actions)
