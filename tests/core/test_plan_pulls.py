"""The planner around pulls, table-driven, with its properties. Pure: no process, no file.

A start whose image's pull failed backs off holding nothing (the launcher gave its lease
back: ``Record.unleased_backoff``), as a failed model pull does: meanwhile its devices
and port are anyone's, and once the back-off is over it is placed afresh by the ledger,
never restarted in place on a lease it no longer has.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from strategies import (
    NOW,
    Scenario,
    desired,
    entry,
    inventory,
    observed,
    record,
    replicated_scenarios,
    scenarios,
    view,
)
from test_plan import DRAIN, Case, _holders_of, run

from controller.core.actions import Hold, Release, Restart, Start
from controller.core.manifest.specs import next_name
from controller.core.plan import plan
from controller.core.state import Phase, Record

GPU1 = {"devices": {"count": 1, "kind": "nvidia"}}
ONE = inventory("nvidia:0")
TWO = inventory("nvidia:0", "nvidia:1")
a_gpu = entry("a", **GPU1)
b_gpu = entry("b", **GPU1)
IMAGE_FAILED = "cannot pull image 127.0.0.1:1/x:1: connection refused"


def pull_backoff(name: str = "a", *, due: bool = True, **fields: Any) -> Record:
    """A record backing off after its image's pull failed: no device, no port."""
    until = NOW if due else NOW + timedelta(seconds=5)
    values: dict[str, Any] = {"spec": a_gpu, "restarts": 1, "message": IMAGE_FAILED}
    values |= fields
    return record(name, phase=Phase.BACKOFF, backoff_until=until, port=None, **values)


def holding(name: str, spec: Any, device: str, port: int) -> Any:
    return view(record(name, spec=spec, devices=(device,), port=port), alive=True)


CASES = [
    pytest.param(
        Case(
            desired(a_gpu),
            observed(view(pull_backoff())),
            expect=((Start, "a", "back-off over (restart 2): placing it: nvidia:0, port 8000"),),
            inv=ONE,
        ),
        id="pull-back-off-over-is-placed-afresh",
    ),
    pytest.param(
        Case(desired(a_gpu), observed(view(pull_backoff(due=False))), inv=ONE),
        id="pull-back-off-not-over-waits",
    ),
    pytest.param(
        Case(desired(a_gpu), observed(view(pull_backoff()), drain=DRAIN), inv=ONE),
        id="pull-back-off-over-but-drained-waits",
    ),
    pytest.param(
        Case(
            desired(a_gpu, b_gpu),
            observed(view(pull_backoff(due=False))),
            expect=((Start, "b", "new deployment: nvidia:0"),),
            inv=ONE,
        ),
        id="pull-back-off-leaves-its-gpu-to-another",
    ),
    pytest.param(
        Case(
            desired(a_gpu, b_gpu),
            observed(view(pull_backoff()), holding("b", b_gpu, "nvidia:0", 8000)),
            expect=((Hold, "a", "no capacity"),),
            inv=ONE,
        ),
        id="pull-back-off-over-its-gpu-taken-waits-for-room",
    ),
    pytest.param(
        Case(
            desired(entry("a", priority=5, **GPU1), b_gpu),
            observed(
                view(pull_backoff(spec=entry("a", priority=5, **GPU1), due=False)),
                view(record("b", spec=b_gpu, phase=Phase.PENDING)),
            ),
            expect=((Start, "b", "retrying placement: nvidia:0"),),
            inv=ONE,
        ),
        id="pull-back-off-of-higher-priority-blocks-nothing",
    ),
    pytest.param(
        Case(
            desired(entry("a", args=["v2"], **GPU1)),
            observed(view(pull_backoff(due=False))),
            expect=((Start, "a", "spec.args changed: placing the new spec"),),
            inv=ONE,
        ),
        id="pull-back-off-spec-changed-placed-with-the-new-spec",
    ),
    pytest.param(
        Case(
            desired(prune=True),
            observed(view(pull_backoff(due=False))),
            expect=((Release, "a", "manifest removed"),),
            inv=ONE,
        ),
        id="pull-back-off-manifest-removed-drops-the-record",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_plan_pulls_table(case: Case) -> None:
    actions = run(case)
    got = [(type(a), a.name) for a in actions]
    assert got == [(t, n) for t, n, _ in case.expect], [a.describe() for a in actions]
    for action, (_, _, phrase) in zip(actions, case.expect, strict=True):
        assert phrase in action.reason, action.describe()


ROLL = {"strategy": "RollingUpdate", **GPU1}


@pytest.mark.parametrize(
    ("due", "other", "expect"),
    [
        (False, False, ()),
        (True, False, (Start,)),  # placed beside the old one, on the GPU left
        (True, True, (Hold,)),  # that GPU taken meanwhile: it waits (its Pending is let go)
    ],
    ids=["waiting", "over", "over-gpu-taken"],
)
def test_a_rolling_update_whose_new_image_fails_keeps_the_old_one(
    due: bool, other: bool, expect: tuple[type, ...]
) -> None:
    """The new instance (``a@next``) backs off holding nothing after its image's pull
    failed: the old one serves on, untouched (no Stop, Replace or Promote of it), and
    the retry is placed beside it where room is left."""
    old, new = entry("a", args=["v1"], **ROLL), entry("a", args=["v2"], **ROLL)
    nxt = pull_backoff(next_name("a"), spec=new, due=due, nonce="nonce-next")
    views = [holding("a", old, "nvidia:0", 8000), view(nxt)]
    entries = [new]
    if other:
        views.append(holding("b", b_gpu, "nvidia:1", 8001))
        entries.append(b_gpu)
    actions = plan(desired(*entries), observed(*views), TWO, NOW)
    got = [(type(a), a.name) for a in actions]
    assert got == [(t, next_name("a")) for t in expect], [a.describe() for a in actions]
    if expect == (Start,):
        (start,) = actions
        assert isinstance(start, Start) and start.devices == ("nvidia:1",), start.describe()


@given(scenarios() | replicated_scenarios())
def test_property_a_pull_back_off_holds_nothing_and_is_never_restarted_in_place(
    scenario: Scenario,
) -> None:
    """No GPU or port is held by a deployment backing off from a failed pull: the plan
    never restarts one in place (a Restart reuses a lease it gave back), and a Start of
    one takes only devices and ports that no live record holds."""
    actions = plan(scenario.desired, scenario.observed, scenario.inventory, NOW)
    unleased = {n for n, r in scenario.holders() if r.unleased_backoff}
    assert not [a for a in actions if isinstance(a, Restart) and a.name in unleased]
    holders = _holders_of(scenario, actions)
    held_ports = {p for n, r in scenario.holders() if r.holds for p in r.ports}
    for a in actions:
        if isinstance(a, Start) and a.name in unleased:
            assert not {a.port, *a.extra_ports} & held_ports, a.describe()
            for key in a.devices:  # shared only where every holder shares (invariant 1)
                assert len(holders[key]) == 1 or all(s for _, s in holders[key]), holders[key]
