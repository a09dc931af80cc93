"""The planner's RollingUpdate, table-driven: the new instance as ``<name>@next`` beside
the old one when there is room, promoted once Ready; a recreate (saying so) when there is
none; the old one serving on while the new one fails. Pure: no process, no file."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import NOW, desired, entry, inventory, observed, probe, record, ref, view
from test_plan import (
    DRAIN,
    HELD_ARGS,
    Case,
    acts_on_each_instance_once,
    exited,
    run,
    starting,
)

from controller.core.actions import (
    AnyAction,
    Fail,
    HoldChange,
    MarkReady,
    Park,
    Preempt,
    Promote,
    Release,
    Replace,
    Restart,
    Start,
    Stop,
)
from controller.core.devicefaults import DeviceFault
from controller.core.manifest.specs import is_dns1123, is_next, next_name
from controller.core.state import Drain, Phase, Record, RecordView

GPU1 = {"devices": {"count": 1, "kind": "nvidia"}}
ROLL = {"strategy": "RollingUpdate", **GPU1}
old = entry("a", args=["v1"], **ROLL)  # what runs
new = entry("a", args=["v2"], **ROLL)  # what the manifest now says
TWO = inventory("nvidia:0", "nvidia:1")
ONE = inventory("nvidia:0")
NEXT = next_name("a")


def running_old() -> RecordView:
    return view(record("a", spec=old, devices=("nvidia:0",)), alive=True)


def next_rec(phase: Phase = Phase.STARTING, **fields: Any) -> Record:
    values: dict[str, Any] = {"devices": ("nvidia:1",), "port": 8001, "nonce": "nonce-next"}
    if phase is Phase.STARTING:
        values["ready_deadline_at"] = starting["ready_deadline_at"]
    return record(NEXT, spec=new, phase=phase, **{**values, **fields})


CASES = [
    pytest.param(
        Case(
            desired(new),
            observed(running_old()),
            expect=((Start, NEXT, "rolling update (spec.args changed): a@next beside the old"),),
            inv=TWO,
        ),
        id="room-for-both-starts-next",
    ),
    pytest.param(
        Case(
            desired(new),
            observed(running_old()),
            expect=((Replace, "a", "spec.args changed; no room for both: recreating"),),
            inv=ONE,
        ),
        id="no-room-recreates-and-says-so",
    ),
    pytest.param(
        Case(
            desired(entry("a", args=["v2"], **GPU1)),
            observed(running_old()),
            expect=((Replace, "a", "spec.args changed"),),
            inv=TWO,
        ),
        id="recreate-strategy-still-replaces",
    ),
    pytest.param(
        Case(
            desired(new),
            observed(
                running_old(),
                view(next_rec(), alive=True, probe=probe(False)),
            ),
            expect=(),
            inv=TWO,
        ),
        id="next-starting-old-serves",
    ),
    pytest.param(
        Case(
            desired(new),
            observed(
                running_old(),
                view(next_rec(), alive=True, probe=probe(True)),
            ),
            expect=((MarkReady, NEXT, "GET /health -> 2xx"),),
            inv=TWO,
        ),
        id="next-passes-probe-marked-ready",
    ),
    pytest.param(
        Case(
            desired(new),
            observed(
                running_old(),
                view(next_rec(Phase.READY), alive=True),
            ),
            expect=((Promote, "a", "rolling update: a@next is Ready; old drains"),),
            inv=TWO,
        ),
        id="next-ready-promoted-old-stops",
    ),
    pytest.param(
        Case(
            desired(new),
            observed(view(next_rec(Phase.READY), alive=True)),
            expect=((Promote, "a", "a@next takes the name a"),),
            inv=TWO,
        ),
        id="old-record-gone-next-takes-the-name-no-start",
    ),
    pytest.param(
        Case(
            desired(new),
            observed(
                view(record("a", spec=new, nonce="nonce-next", devices=("nvidia:1",)), alive=True),
                view(next_rec(Phase.READY), alive=True),
            ),
            expect=((Promote, "a", "a@next takes the name a"),),
            inv=TWO,
        ),
        id="promote-interrupted-after-rename-finishes",
    ),
    pytest.param(
        Case(
            desired(new),
            observed(
                view(record("a", spec=old, devices=("nvidia:0",), phase=Phase.TERMINATING)),
                view(next_rec(Phase.READY), alive=True),
            ),
            expect=((Stop, "a", "finishing a teardown under way"),),
            inv=TWO,
        ),
        id="promote-interrupted-in-teardown-finishes-the-stop-first",
    ),
    pytest.param(
        Case(
            desired(new),
            observed(
                running_old(),
                view(next_rec(), alive=False, exit=exited(code=3)),
            ),
            expect=((Fail, NEXT, "engine exited with code 3; restart now"),),
            inv=TWO,
        ),
        id="next-fails-old-keeps-serving",
    ),
    pytest.param(
        Case(
            desired(new),
            observed(
                running_old(),
                view(
                    next_rec(Phase.STARTING, ready_deadline_at=NOW),
                    alive=True,
                    probe=probe(False),
                ),
            ),
            expect=((Fail, NEXT, "not ready by its readiness deadline"),),
            inv=TWO,
        ),
        id="next-misses-deadline-old-keeps-serving",
    ),
    pytest.param(
        Case(
            desired(new),
            observed(
                running_old(),
                view(next_rec(Phase.FAILED, port=None, devices=())),
            ),
            expect=(),
            inv=TWO,
        ),
        id="next-failed-for-good-old-untouched",
    ),
    pytest.param(
        Case(
            desired(entry("a", args=["v3"], **ROLL)),
            observed(
                running_old(),
                view(next_rec(), alive=True),
            ),
            expect=((Stop, NEXT, "the spec changed again"),),
            inv=TWO,
        ),
        id="spec-changes-again-next-stopped",
    ),
    # A daemon SIGKILLed mid-promotion left the old instance Terminating (or gone) and
    # `@next` Ready, serving alone; the spec changed again before the next daemon. The
    # `@next` is the last server: abandoned, nothing would serve until the newest is Ready
    # (a chaos trial's 503s). It is promoted, stale; the newest rolls from it.
    pytest.param(
        Case(
            desired(entry("a", args=["v3"], **ROLL)),
            observed(
                running_old(),
                view(next_rec(Phase.READY), alive=True),
            ),
            expect=((Stop, NEXT, "the spec changed again"),),
            inv=TWO,
        ),
        id="spec-changes-again-ready-next-stopped-while-the-old-serves",
    ),
    pytest.param(
        Case(
            desired(entry("a", args=["v3"], **ROLL)),
            observed(
                view(record("a", spec=old, devices=("nvidia:0",), phase=Phase.TERMINATING)),
                view(next_rec(Phase.READY), alive=True),
            ),
            expect=((Stop, "a", "finishing a teardown under way"),),
            inv=TWO,
        ),
        id="spec-changes-again-mid-promotion-the-serving-next-kept",
    ),
    pytest.param(
        Case(
            desired(entry("a", args=["v3"], **ROLL)),
            observed(view(next_rec(Phase.READY), alive=True)),
            expect=((Promote, "a", "a@next takes the name a; the spec changed again"),),
            inv=TWO,
        ),
        id="spec-changes-again-old-gone-the-serving-next-promoted",
    ),
    pytest.param(
        Case(
            desired(entry("a", args=["v3"], **ROLL)),
            observed(view(record("a", spec=new, devices=("nvidia:1",), port=8001), alive=True)),
            expect=((Start, NEXT, "rolling update (spec.args changed): a@next beside the old"),),
            inv=TWO,
        ),
        id="spec-changes-again-the-promoted-next-rolls-to-the-newest",
    ),
    pytest.param(
        Case(
            desired(),
            observed(
                running_old(),
                view(next_rec(), alive=True),
            ),
            expect=((Stop, "a", "manifest removed"), (Stop, NEXT, "manifest removed")),
            inv=TWO,
        ),
        id="manifest-removed-stops-both",
    ),
    pytest.param(
        Case(
            desired(new),
            observed(
                running_old(),
                view(next_rec(Phase.RESERVED, ref=None)),
            ),
            expect=((Release, NEXT, "reservation's maker (pid 50) is gone"),),
            inv=TWO,
        ),
        id="sigkill-after-next-reservation-released",
    ),
    # The old engine died mid-update: restarted or replaced, it would start an engine the
    # `@next` retires (a Replace left it Pending, placed the round after beside the
    # `@next`: two starts of one spec). Its `@next` takes the name now, alone, whatever
    # its state; the promotion releases the dead one (Kubernetes scales the old
    # ReplicaSet down as the new one's Pods come, and a dead Pod is nothing to wait for).
    pytest.param(
        Case(
            desired(new),
            observed(
                view(record("a", spec=old, devices=("nvidia:0",)), alive=False, exit=exited(1)),
                view(next_rec(), alive=True),
            ),
            expect=((Promote, "a", "a is down (engine exited with code 1): a@next takes"),),
            inv=TWO,
        ),
        id="old-dies-mid-update-next-starting-takes-the-name",
    ),
    pytest.param(
        Case(
            desired(new),
            observed(
                view(record("a", spec=old, devices=("nvidia:0",)), alive=False, exit=exited(1)),
                view(next_rec(Phase.READY), alive=True),
            ),
            expect=((Promote, "a", "a@next is Ready; the old one is down"),),
            inv=TWO,
        ),
        id="old-crashed-next-ready-promoted-not-both-restarted",
    ),
    pytest.param(
        Case(
            desired(new),
            observed(
                view(record("a", spec=old, devices=("nvidia:0",), phase=Phase.BACKOFF)),
                view(next_rec(Phase.READY), alive=True),
            ),
            expect=((Promote, "a", "a@next is Ready; the old one is down"),),
            inv=TWO,
        ),
        id="old-backing-off-next-ready-promoted",
    ),
    pytest.param(
        Case(
            desired(new),
            observed(
                view(record("a", spec=old, phase=Phase.PENDING, devices=(), port=None)),
                view(next_rec(), alive=True, probe=probe(False)),
            ),
            expect=((Promote, "a", "a is down (Pending): a@next takes the name"),),
            inv=TWO,
        ),
        id="old-pending-next-starting-no-second-start",
    ),
    # The spec went back to what the dead old engine ran: the Ready `@next` is its last
    # server, promoted; the old one is not restarted beside it as well.
    pytest.param(
        Case(
            desired(old),
            observed(
                view(record("a", spec=old, devices=("nvidia:0",)), alive=False, exit=exited(1)),
                view(next_rec(Phase.READY), alive=True),
            ),
            expect=((Promote, "a", "the spec changed again"),),
            inv=TWO,
        ),
        id="spec-reverted-old-crashed-ready-next-promoted-old-not-restarted",
    ),
    # A drain: a surge would be held Pending, and the fallback recreate stopped the old
    # engine for a start the drain holds too. Kubernetes' cordon leaves the old Pod
    # serving: so does the drain, its record saying what waits; uncordon rolls.
    pytest.param(
        Case(
            desired(new),
            observed(running_old(), drain=DRAIN),
            expect=((HoldChange, "a", HELD_ARGS),),
            inv=TWO,
        ),
        id="drain-holds-the-rolling-update-old-serves",
    ),
    pytest.param(
        Case(
            desired(new),
            observed(
                view(record("a", spec=old, devices=("nvidia:0",), message=HELD_ARGS), alive=True)
            ),
            expect=(
                (Start, NEXT, "rolling update (spec.args changed): a@next beside the old"),
                (HoldChange, "a", "the drain holds its spec change no more"),
            ),
            inv=TWO,
        ),
        id="uncordon-rolls-and-the-old-ones-hold-is-said-over",
    ),
    pytest.param(
        Case(
            desired(new),
            observed(
                view(record("a", spec=old, devices=("nvidia:0",), message=HELD_ARGS), alive=True)
            ),
            expect=(
                (Replace, "a", "spec.args changed; no room for both: recreating"),
                (HoldChange, "a", "no more"),  # its words go a moment before its record
            ),
            inv=ONE,
        ),
        id="uncordon-without-room-recreates",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_rolling_table(case: Case) -> None:
    actions = run(case)
    got = [(type(a), a.name) for a in actions]
    assert got == [(t, n) for t, n, _ in case.expect], [a.describe() for a in actions]
    for action, (_, _, phrase) in zip(actions, case.expect, strict=True):
        assert phrase in action.reason, action.describe()


def test_next_start_holds_its_own_device_and_port() -> None:
    """Invariants 1 and 2: the new instance never shares the old one's device or port."""
    (start,) = run(Case(desired(new), observed(running_old()), inv=TWO))
    assert isinstance(start, Start)
    assert start.devices == ("nvidia:1",)
    assert start.port != 8000
    assert start.entry.name == "a"  # the engine is the deployment's: its name, log, journal


def test_no_manifest_name_can_be_a_rolling_instance() -> None:
    """``web--next`` once stopped the engine of ``web`` on every pass: the instance's
    separator is no DNS-1123 character, so every valid name is a deployment's own."""
    assert is_next(NEXT) and not is_next("a") and not is_next("a--next")
    assert not is_dns1123(NEXT)
    assert entry("a--next").name == "a--next"


def test_a_deployment_named_like_the_old_suffix_leaves_the_other_alone() -> None:
    """``web`` Ready and a new ``web--next``: one start for the newcomer, nothing for web."""
    actions = run(Case(desired(old, entry("a--next")), observed(running_old()), inv=TWO))
    assert [(type(a), a.name) for a in actions] == [(Start, "a--next")]


def test_an_old_instance_starting_is_replaced_not_rolled() -> None:
    """Rolling needs a Ready old instance to keep serving; a Starting one is recreated."""
    rec = record("a", spec=old, devices=("nvidia:0",), ref=ref(100), **starting)
    actions = run(Case(desired(new), observed(view(rec, alive=True)), inv=TWO))
    assert [(type(a), a.name) for a in actions] == [(Replace, "a")]


# -- properties --------------------------------------------------------------------------

TAKES_AWAY = (Stop, Fail, Release, Park, Preempt)  # a Replace is a Stop


def _old_view(state: str, version: str) -> RecordView | None:
    spec = entry("a", args=[version], **ROLL)
    held = {"spec": spec, "devices": ("nvidia:0",)}
    match state:
        case "ready":
            return view(record("a", **held), alive=True)
        case "terminating":  # a promotion cut short after its old record's write
            return view(record("a", phase=Phase.TERMINATING, **held))
        case "crashed":
            return view(record("a", **held), alive=False, exit=exited(code=1))
        case "starting":
            return view(record("a", **held, **starting), alive=True)
        case "backoff":  # its restart due now
            return view(record("a", phase=Phase.BACKOFF, backoff_until=NOW, **held))
        case "pending":  # replaced, or preempted: holding nothing, waiting to be placed
            return view(record("a", spec=spec, phase=Phase.PENDING, port=None))
    return None


def _next_view(state: str) -> RecordView:
    match state:
        case "ready":
            return view(next_rec(Phase.READY), alive=True)
        case "crashed":
            return view(next_rec(Phase.READY), alive=False, exit=exited(code=1))
        case "backoff":
            return view(next_rec(Phase.BACKOFF, backoff_until=NOW))
    return view(next_rec(), alive=True, probe=probe(False))


# Every state of a roll's two instances (the old one, its `@next`) and of the spec.
ROLLS = {
    "old_state": st.sampled_from(
        ("gone", "ready", "terminating", "crashed", "starting", "backoff", "pending")
    ),
    "old_version": st.sampled_from(("v1", "v2", "v3")),
    "next_state": st.sampled_from(("ready", "starting", "crashed", "backoff")),
    "newest": st.sampled_from(("v2", "v3")),  # `@next` runs v2: v3 is a spec changed again
}


def _sick(*keys: str) -> dict[str, Any]:
    return {
        "unhealthy": {k: DeviceFault(k, "Xid 79 (GPU has fallen off the bus)", NOW) for k in keys}
    }


# What else the node says: drained (evicting or not), the old one's device, the `@next`'s
# or both Unhealthy (each a teardown of its own that a promotion must not meet).
NODES = {
    "calm": {},
    "drained": {"drain": DRAIN},
    "evicting": {"drain": Drain(until=NOW + timedelta(hours=1), evict=True)},
    "old-sick": _sick("nvidia:0"),
    "next-sick": _sick("nvidia:1"),
    "both-sick": _sick("nvidia:0", "nvidia:1"),
}


def _roll(
    old_state: str, old_version: str, next_state: str, newest: str, node: str = "calm"
) -> tuple[list[RecordView], list[AnyAction]]:
    old_view = _old_view(old_state, old_version)
    views = [v for v in (old_view, _next_view(next_state)) if v is not None]
    want = desired(entry("a", args=[newest], **ROLL))
    return views, run(Case(want, observed(*views, **NODES[node]), inv=TWO))


@given(**ROLLS)
def test_property_a_roll_never_takes_its_last_ready_server_away(
    old_state: str, old_version: str, next_state: str, newest: str
) -> None:
    """At every step of a roll some Ready engine of the deployment serves, unless none
    did before (Kubernetes' maxUnavailable 0 for one replica): no plan stops, fails or
    releases the last one, and a promotion hands the name on to the Ready `@next`."""
    views, actions = _roll(old_state, old_version, next_state, newest)
    serving = {v.record.name for v in views if v.alive and v.record.phase is Phase.READY}
    taken = {a.name for a in actions if isinstance(a, (*TAKES_AWAY, Promote))}
    assert not serving or serving - taken, [a.describe() for a in actions]


@given(**ROLLS, node=st.sampled_from(sorted(NODES)))
def test_property_a_roll_never_starts_what_it_retires(
    old_state: str, old_version: str, next_state: str, newest: str, node: str
) -> None:
    """A promotion retires the old instance itself: no plan also restarts, replaces,
    fails or places it (two actions each meaning to become the serving instance, a model
    loaded only to be stopped), whatever the node says (a drain, an Unhealthy device).
    Nor does a plan start or restart the old instance beside a `@next` it leaves running:
    one roll loads the new spec once. And no instance gets two actions of its fate."""
    _, actions = _roll(old_state, old_version, next_state, newest, node)
    acts_on_each_instance_once(actions)
    said = [a.describe() for a in actions]
    promoted = {a.name for a in actions if isinstance(a, Promote)}
    assert not [a for a in actions if a.name in promoted and not isinstance(a, Promote)], said
    ended = {a.name for a in actions if isinstance(a, Stop | Release)}
    if NEXT not in ended:
        assert not [a for a in actions if isinstance(a, Start | Restart) and a.name == "a"], said
