"""The node's maxInstances limits and priority: a limit is room like a device's.

A higher-priority deployment kept out only by ``--max-instances`` (or a per-kind limit)
waited forever beside a running lower-priority one, where a GPU shortage preempted it.
Kubernetes' scheduler preempts for a node's pod count as for any resource: so does the
planner now, under the same rules (strictly lower, fewest, lowest; within one manifest
set). An OnDemand start swaps idle OnDemand engines out for a limit too. Table-driven,
with properties: no device double-booked, no limit passed by a start, and preemption only
ever downwards.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import NOW, Scenario, desired, entry, memory_scenarios, observed, record, view

from controller.core.actions import Action, Hold, Park, Preempt, Start, Stop
from controller.core.devices.capacity import Limits
from controller.core.devices.inventory import parse_static
from controller.core.plan import plan
from controller.core.state import Activation, Phase, RecordView

INV = parse_static("nvidia:0=80Gi,nvidia:1=80Gi,amd:0=64Gi")
GPU = {"count": 1, "kind": "nvidia"}
NONE = {"count": 0}


def running(name: str, priority: int, devices: dict[str, Any], *held: str, **spec: Any) -> Any:
    """``name``'s entry and its Ready record on ``held`` (port by name: never shared)."""
    e = entry(name, devices=devices, priority=priority, **spec)
    rec = record(
        name,
        spec=e,
        devices=held,
        priority=priority,
        port=9000 + sum(map(ord, name)) % 500,
        started_at=NOW - timedelta(seconds=60 + len(name)),
    )
    return e, view(rec, alive=True)


def steps(actions: Sequence[Action]) -> list[tuple[str, str]]:
    return [(type(a).__name__, a.name) for a in actions]


LOW = running("low", 0, GPU, "nvidia:0")
MID = running("mid", 5, GPU, "nvidia:1")
CPU_LOW = running("cpu-low", 0, NONE)

CASES = [
    pytest.param(
        [LOW],
        entry("high", devices=GPU, priority=10),
        Limits(max_instances=1),
        [("Preempt", "low"), ("Start", "high")],
        "preempting low",
        id="node-wide-limit-preempts-the-lower",
    ),
    pytest.param(
        [LOW],
        entry("same", devices=GPU, priority=0),
        Limits(max_instances=1),
        [("Hold", "same")],
        "node limit maxInstances=1 reached (running: low)",
        id="equal-priority-waits-on-the-limit",
    ),
    pytest.param(
        [LOW, MID],
        entry("high", devices=NONE, priority=10),
        Limits(max_instances=2),
        [("Preempt", "low"), ("Start", "high")],
        "preempting low",
        id="a-deployment-of-no-device-preempts-for-a-node-wide-slot-the-lowest",
    ),
    pytest.param(
        [LOW],
        entry("high", devices=GPU, priority=10),
        Limits(per_kind={"nvidia": 1}),
        [("Preempt", "low"), ("Start", "high")],
        "preempting low",
        id="per-kind-limit-preempts-a-holder-of-that-kind",
    ),
    pytest.param(
        [CPU_LOW, running("amd-low", 0, {"count": 1, "kind": "amd"}, "amd:0")],
        entry("high", devices=GPU, priority=10),
        Limits(per_kind={"nvidia": 0}),
        [("Hold", "high")],
        "node limit maxInstances nvidia=0 reached",
        id="stopping-no-holder-of-the-kind-cannot-help-nobody-stopped",
    ),
    pytest.param(
        [LOW, CPU_LOW],
        entry("high", devices=GPU, priority=10),
        Limits(max_instances=2, per_kind={"nvidia": 1}),
        [("Preempt", "low"), ("Start", "high")],
        "preempting low",
        id="both-limits-one-victim-frees-both",
    ),
]


@pytest.mark.parametrize(("running_", "wanted", "limits", "expect", "said"), CASES)
def test_a_node_limit_preempts_like_a_device_shortage(
    running_: list[tuple[Any, RecordView]],
    wanted: Any,
    limits: Limits,
    expect: list[tuple[str, str]],
    said: str,
) -> None:
    entries = [e for e, _ in running_]
    seen = observed(*(v for _, v in running_))
    actions = plan(desired(*entries, wanted), seen, INV, NOW, limits=limits)
    assert steps(actions) == expect, actions
    last = actions[-1]
    assert said in last.reason, last.reason
    for a in actions:
        if isinstance(a, Preempt):
            assert a.reason == f"preempted by {wanted.name} (priority 10)", a.reason


def test_a_preempted_deployment_waits_on_the_limit_and_says_who_displaced_it() -> None:
    """The next pass: the victim is Pending, the limit full with the higher one: no flap."""
    low_entry, _ = LOW
    high = entry("high", devices=GPU, priority=10)
    pending = view(
        record(
            "low",
            spec=low_entry,
            phase=Phase.PENDING,
            port=None,
            message="preempted by high (priority 10)",
        )
    )
    _, high_running = running("high", 10, GPU, "nvidia:1")
    actions = plan(
        desired(low_entry, high),
        observed(pending, high_running),
        INV,
        NOW,
        limits=Limits(max_instances=1),
    )
    assert steps(actions) == [("Hold", "low")], actions
    assert actions[0].reason.startswith(
        "preempted by high (priority 10); waiting for room: node limit maxInstances=1 reached"
    ), actions[0].reason


def test_another_sets_engine_counts_against_the_limit_but_is_never_preempted() -> None:
    theirs = entry("theirs", devices=GPU, priority=0)
    other = record(
        "theirs", owner="/elsewhere", spec=theirs, devices=("nvidia:0",), port=9100, priority=0
    )
    high = entry("high", devices=GPU, priority=10)
    actions = plan(
        desired(high), observed(view(other, alive=True)), INV, NOW, limits=Limits(max_instances=1)
    )
    assert steps(actions) == [("Hold", "high")], actions
    assert "not preempted, as priority preempts only within one manifest set" in actions[0].reason


def test_a_teardown_this_round_frees_the_slot_and_nobody_is_preempted() -> None:
    """A removed manifest's engine stops this round: the start waits for its slot."""
    _, gone = running("gone", 0, GPU, "nvidia:0")
    low_entry, low = LOW
    low = view(record("low", spec=low_entry, devices=("nvidia:1",), port=9300), alive=True)
    high = entry("high", devices=GPU, priority=10)
    want = desired(low_entry, high, prune=True)
    actions = plan(want, observed(gone, low), INV, NOW, limits=Limits(max_instances=2))
    assert steps(actions) == [("Stop", "gone"), ("Hold", "high")], actions


def test_an_on_demand_start_swaps_an_idle_engine_out_for_the_node_limit() -> None:
    """A request for an Idle OnDemand deployment on a node at maxInstances: the idle
    OnDemand engine (no request in flight) is parked for it, as for a device."""
    lazy = {"activation": "OnDemand", "idleTimeout": "1h", "devices": GPU}
    idle_entry, asked = entry("idle", **lazy), entry("asked", **lazy)
    idle = record("idle", spec=idle_entry, devices=("nvidia:0",), port=9400)
    acts = {
        "idle": Activation(last_request_at=NOW - timedelta(seconds=600)),
        "asked": Activation(last_request_at=NOW),
    }
    want = desired(idle_entry, asked, activations=acts)
    seen = observed(view(idle, alive=True))
    actions = plan(want, seen, INV, NOW, limits=Limits(max_instances=1))
    assert steps(actions) == [("Park", "idle"), ("Hold", "asked")], actions
    assert isinstance(actions[0], Park) and "swapped out for asked" in actions[0].reason


# -- properties ---------------------------------------------------------------------------


@st.composite
def limited(draw: st.DrawFn) -> tuple[Scenario, Limits]:
    """A memory scenario (our deployments, some running) under random node limits."""
    scenario = draw(memory_scenarios())
    total = draw(st.none() | st.integers(0, 4))
    per_kind = {"nvidia": draw(st.integers(0, 3))} if draw(st.booleans()) else {}
    return scenario, Limits(max_instances=total, per_kind=per_kind)


def _holders_after(scenario: Scenario, actions: Sequence[Action]) -> dict[str, tuple[str, ...]]:
    """Record -> its devices, once the plan is applied (preempted and stopped gone)."""
    gone = {a.name for a in actions if isinstance(a, Preempt | Stop)}
    after = {
        name: v.record.devices
        for name, v in scenario.observed.records.items()
        if v.record.holds and name not in gone
    }
    after |= {a.name: a.devices for a in actions if isinstance(a, Start)}
    return after


def _no_device_double_booked_and_no_limit_passed(
    scenario: Scenario, limits: Limits, actions: list[Action]
) -> None:
    starts = [a for a in actions if isinstance(a, Start)]
    after = _holders_after(scenario, actions)
    specs = {n: e.deployment.spec for n, e in scenario.desired.entries.items()}
    sizes = {d.key: d.memory for d in scenario.inventory.devices}
    for start in starts:  # what this plan places: never onto a device it cannot share
        for key in start.devices:
            holders = [n for n, devices in after.items() if key in devices]
            memory = [specs[n].devices.memory for n in holders]
            if len(holders) > 1 and None in memory:
                assert all(
                    m is None and specs[n].devices.shareable
                    for n, m in zip(holders, memory, strict=True)
                )
            elif len(holders) > 1:
                assert sum(m for m in memory if m) <= (sizes[key] or 0), (key, holders)
    if starts and limits.max_instances is not None:
        assert len(after) <= limits.max_instances, (after, actions)
    kinds = Counter(k for devices in after.values() for k in {d.split(":")[0] for d in devices})
    for kind, cap in limits.per_kind.items():
        if any(d.startswith(f"{kind}:") for s in starts for d in s.devices):
            assert kinds[kind] <= cap, (kind, after, actions)


def _a_limit_preempts_only_strictly_lower_and_for_a_start(
    scenario: Scenario, actions: list[Action]
) -> None:
    entries = scenario.desired.entries
    for a in actions:
        if isinstance(a, Preempt):
            assert entries[a.name].deployment.spec.priority < a.priority
            assert a.priority == entries[a.by].deployment.spec.priority
            assert any(isinstance(s, Start) and s.name == a.by for s in actions), actions
        if isinstance(a, Hold):
            assert a.name not in {p.by for p in actions if isinstance(p, Preempt)}


# 300 draws, not the default 100: a per-kind limit off by one (>= cap read as > cap)
# was first caught at draws 15-120 across eight seeds, past 100 in three.
@settings(max_examples=300)
@given(limited())
def test_property_a_limited_plan_never_double_books_passes_no_limit_preempts_only_lower(
    case: tuple[Scenario, Limits],
) -> None:
    """Both limit properties on the same draws (a draw is most of an example's cost):
    each failing assertion is still shrunk and reported on its own line."""
    scenario, limits = case
    actions = plan(scenario.desired, scenario.observed, scenario.inventory, NOW, limits=limits)
    _no_device_double_booked_and_no_limit_passed(scenario, limits, actions)
    _a_limit_preempts_only_strictly_lower_and_for_a_start(scenario, actions)
