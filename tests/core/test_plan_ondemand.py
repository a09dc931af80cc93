"""The OnDemand idle rule, table-driven: when a running engine is parked, and when not.

An inverted rule (``last_request_at - now``) once passed every planner test and was
caught only end to end; these cases pin each side of ``idleTimeout`` with ``now``
and the gateway's last request as inputs.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import NOW, desired, entry, inventory, observed, record, view

from controller.core.actions import Hold, Park, Preempt, Start, Stop
from controller.core.devices.inventory import Inventory
from controller.core.manifest.specs import Entry
from controller.core.plan import Desired, plan
from controller.core.state import Activation, Drain, Observed, Phase, RecordView

ON_DEMAND = {"activation": "OnDemand", "idleTimeout": "60s"}
SERVING = entry("a", **ON_DEMAND)


def ago(seconds: float) -> Activation:
    return Activation(last_request_at=NOW - timedelta(seconds=seconds))


def actions_for(activation: Activation | None, phase: Phase = Phase.READY) -> list[type]:
    rec = record("a", spec=SERVING, phase=phase)
    seen = observed(view(rec, alive=phase is Phase.READY))
    want = desired(SERVING, activations={} if activation is None else {"a": activation})
    return [type(a) for a in plan(want, seen, inventory(), NOW)]


@pytest.mark.parametrize(
    ("last_request", "parked"),
    [
        (ago(5), False),  # in use: keep it
        (ago(59.9), False),  # just inside the timeout
        (ago(60), True),  # exactly idleTimeout without a request: parked
        (ago(61), True),
        (ago(3600), True),
        (Activation(last_request_at=NOW + timedelta(seconds=30)), False),  # a clock ahead
        (None, True),  # no request ever recorded (the activation file is gone)
    ],
    ids=["5s", "59.9s", "60s", "61s", "1h", "future", "none"],
)
def test_a_ready_engine_is_parked_only_after_idle_timeout(
    last_request: Activation | None, parked: bool
) -> None:
    assert (Park in actions_for(last_request)) is parked


def test_an_idle_deployment_starts_on_a_request_after_it_parked() -> None:
    rec = record("a", spec=SERVING, phase=Phase.IDLE, idle_since=NOW - timedelta(seconds=10))
    want = desired(SERVING, activations={"a": ago(1)})
    assert [type(a) for a in plan(want, observed(view(rec)), inventory(), NOW)] == [Start]


def test_an_idle_deployment_stays_idle_without_a_new_request() -> None:
    """The last request came before it parked: not a reason to start again."""
    rec = record("a", spec=SERVING, phase=Phase.IDLE, idle_since=NOW - timedelta(seconds=10))
    want = desired(SERVING, activations={"a": ago(20)})
    assert plan(want, observed(view(rec)), inventory(), NOW) == []


def test_a_released_activation_parks_a_ready_engine_at_once() -> None:
    """Unload (the web page): a fresh activation marked released parks it, saying why."""
    rec = record("a", spec=SERVING, phase=Phase.READY)
    released = Activation(last_request_at=NOW, released=True)
    actions = plan(
        desired(SERVING, activations={"a": released}), observed(view(rec)), inventory(), NOW
    )
    assert [type(a) for a in actions] == [Park]
    assert actions[0].reason.startswith("unloaded")


def test_an_unloaded_idle_deployment_stays_idle() -> None:
    """Released after it parked: nothing to do (a later request, not released, starts it,
    as test_an_idle_deployment_starts_on_a_request_after_it_parked shows)."""
    rec = record("a", spec=SERVING, phase=Phase.IDLE, idle_since=NOW - timedelta(seconds=10))
    released = Activation(last_request_at=NOW - timedelta(seconds=1), released=True)
    want = desired(SERVING, activations={"a": released})
    assert plan(want, observed(view(rec)), inventory(), NOW) == []


# -- any start that finds no room parks idle OnDemand engines -------------------------------

GPU = {"count": 1, "kind": "nvidia"}
LAZY = {"activation": "OnDemand", "idleTimeout": "1h", "devices": GPU}
IDLE = entry("idle", **LAZY)
TWO = inventory("nvidia:0", "nvidia:1")


def _idle(priority: int = 0, inflight: int = 0) -> tuple[Entry, RecordView, Activation]:
    """``idle``: Ready on nvidia:1, last asked 10 minutes ago (inside its idleTimeout)."""
    e = entry("idle", priority=priority, **LAZY)
    rec = record("idle", spec=e, devices=("nvidia:1",), port=9400, priority=priority)
    asked = Activation(last_request_at=NOW - timedelta(minutes=10), inflight=inflight)
    return e, view(rec, alive=True), asked


def _on_gpu0(e: Entry, name: str | None = None) -> RecordView:
    rec = record(name or e.name, spec=e, devices=("nvidia:0",), port=9600)
    return view(rec, alive=True)


BUSY = entry("busy", devices=GPU)
WEB2 = entry("web", replicas=2, devices=GPU)
AUTO = entry("web", devices=GPU, autoscale={"min": 0, "max": 3, "targetInflight": 1})
CHAT = entry("chat", **LAZY)
NOW_ASKED = {"chat": Activation(last_request_at=NOW)}

# (the deployments besides idle, what runs besides idle, desired counts, the record that
# needs the room)
STARTS = [
    pytest.param((CHAT, BUSY), (_on_gpu0(BUSY),), {}, "chat", id="an-on-demand-start"),
    pytest.param(
        (entry("web", devices=GPU), BUSY), (_on_gpu0(BUSY),), {}, "web", id="a-new-deployment"
    ),
    pytest.param((WEB2,), (_on_gpu0(WEB2),), {}, "web@1", id="a-replicas-scale-up"),
    pytest.param((AUTO,), (_on_gpu0(AUTO),), {"web": 2}, "web@1", id="an-autoscaler-scale-up"),
]


@pytest.mark.parametrize(("entries", "running", "counts", "starting"), STARTS)
def test_every_start_that_finds_no_room_parks_an_idle_on_demand_engine(
    entries: tuple[Entry, ...],
    running: tuple[RecordView, ...],
    counts: dict[str, int],
    starting: str,
) -> None:
    """A scale-up (the manifest's replicas, or the autoscaler's under load) waited for an
    idle OnDemand engine's idleTimeout where an OnDemand start parked it at once: every
    start now parks it (an idle engine is a cache the next request refills)."""
    idle, idle_view, asked = _idle()
    want = desired(idle, *entries, activations={"idle": asked, **NOW_ASKED}, replicas=counts)
    actions = plan(want, observed(idle_view, *running), TWO, NOW)
    assert [(type(a), a.name) for a in actions] == [(Park, "idle"), (Hold, starting)], actions
    assert actions[0].reason == f"swapped out for {starting} (idle OnDemand, least recently used)"
    assert actions[1].reason == "making room: stopping idle idle"


@pytest.mark.parametrize(
    ("priority", "inflight", "drained"),
    [(5, 0, False), (0, 1, False), (0, 0, True)],
    ids=["a-higher-priority-idle-engine", "one-with-a-request-in-flight", "a-drained-node"],
)
def test_a_scale_up_parks_no_engine_a_start_may_not_park(
    priority: int, inflight: int, drained: bool
) -> None:
    idle, idle_view, asked = _idle(priority, inflight)
    want = desired(idle, WEB2, activations={"idle": asked})
    drain = Drain(until=NOW + timedelta(hours=1)) if drained else None
    actions = plan(want, observed(idle_view, _on_gpu0(WEB2), drain=drain), TWO, NOW)
    assert [(type(a), a.name) for a in actions] == [(Hold, "web@1")], actions


@st.composite
def idle_scenarios(draw: st.DrawFn) -> tuple[Desired, Observed, Inventory]:
    """Idle OnDemand engines and always-on ones on 1-3 GPUs, and new deployments (some
    OnDemand, asked now; some replicated) wanting room."""
    inv = inventory(*(f"nvidia:{i}" for i in range(draw(st.integers(1, 3)))))
    keys = [d.key for d in inv.devices]
    entries, views, acts = [], [], {}
    for i in range(draw(st.integers(0, 3))):  # running, each on a GPU of its own or not
        lazy = draw(st.booleans())
        name = f"run{i}"
        spec = LAZY if lazy else {"devices": GPU}
        e = entry(name, priority=draw(st.integers(0, 2)), **spec)
        device = draw(st.sampled_from(keys))
        rec = record(
            name, spec=e, devices=(device,), port=9000 + i, priority=e.deployment.spec.priority
        )
        entries.append(e)
        views.append(view(rec, alive=True))
        if lazy:
            ago = timedelta(seconds=draw(st.integers(1, 3000)))
            acts[name] = Activation(last_request_at=NOW - ago, inflight=draw(st.integers(0, 1)))
    for i in range(draw(st.integers(1, 3))):  # wanting room
        name, priority = f"new{i}", draw(st.integers(0, 2))
        if draw(st.booleans()):
            e = entry(name, priority=priority, **LAZY)
            acts[name] = Activation(last_request_at=NOW)
        else:
            e = entry(name, priority=priority, replicas=draw(st.integers(1, 2)), devices=GPU)
        entries.append(e)
    return desired(*entries, activations=acts), observed(*views), inv


@settings(max_examples=300)
@given(idle_scenarios())
def test_property_parks_only_idle_engines_and_never_double_books(
    scenario: tuple[Desired, Observed, Inventory],
) -> None:
    """A Park made for a start takes only an idle OnDemand engine (no request in flight)
    of no higher priority than the start it makes room for; no Start lands on a device a
    running engine, parked this plan or not, still holds (but a preempted one's: the
    preemption stops it first)."""
    want, seen, inv = scenario
    actions = plan(want, seen, inv, NOW)
    holds = {a.name: a for a in actions if isinstance(a, Hold)}
    for park in (a for a in actions if isinstance(a, Park) and "swapped out" in a.reason):
        starter = park.reason.removeprefix("swapped out for ").split(" ")[0]
        spec = want.entries[park.name].deployment.spec
        assert spec.activation == "OnDemand" and want.activations[park.name].inflight == 0
        assert starter in holds, actions
        assert spec.priority <= holds[starter].entry.deployment.spec.priority
    preempted = {a.name for a in actions if isinstance(a, Preempt)}  # its start's, stopped first
    held = {d for n, v in seen.records.items() if n not in preempted for d in v.record.devices}
    started = [d for a in actions if isinstance(a, Start) for d in a.devices]
    assert not set(started) & held, actions
    assert len(started) == len(set(started)), actions


def test_a_start_waits_for_a_terminating_engines_room_and_parks_no_other() -> None:
    """A swap the daemon began leaves the parked engine Terminating, holding its device
    until its group is gone (launcher ``begin``): the start it made room for waits for
    that device, and no second idle engine is parked for it meanwhile."""
    idle, idle_view, asked = _idle()
    gone = entry("gone", **LAZY)
    going = record("gone", spec=gone, devices=("nvidia:0",), port=9600, phase=Phase.TERMINATING)
    want = desired(idle, gone, CHAT, activations={"idle": asked, **NOW_ASKED})
    actions = plan(want, observed(idle_view, view(going, alive=True)), TWO, NOW)
    assert [(type(a), a.name) for a in actions] == [(Stop, "gone"), (Hold, "chat")], actions
