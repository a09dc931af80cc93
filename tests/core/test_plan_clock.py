"""Wall-clock steps in the planner (docs/design.md, "Clock steps"), table-driven.

Records keep their deadlines as wall-clock times (they must outlive the process and the
boot clock of the pass that wrote them). A step of the wall clock moves ``now`` against
them: an hour forward would kill every Starting engine at once, an hour back would keep
every crashed one waiting an extra hour. The planner judges a Starting engine by its age
on the boot clock where it is known, and never lets a back-off wait longer than its own
length from now.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from strategies import NOW, desired, entry, inventory, observed, probe, record, view

from controller.core.actions import Action, Fail, Restart
from controller.core.plan import backoff, plan
from controller.core.state import Phase, RecordView
from controller.daemon.loop import _next_due

HOUR = timedelta(hours=1)
DEADLINE = 30.0  # seconds: the readiness deadline of every case here
GPUS = inventory("nvidia:0")


def starting(*, deadline_in: timedelta, age: float | None) -> RecordView:
    """A Starting engine, alive and not ready, whose wall-clock deadline is ``deadline_in``
    from now and which has run ``age`` seconds by the boot clock."""
    rec = record(
        "a",
        phase=Phase.STARTING,
        ready_deadline_seconds=DEADLINE,
        ready_deadline_at=NOW + deadline_in,
    )
    return view(rec, alive=True, probe=probe(False), age=age)


def backing_off(*, restarts: int, due_in: timedelta) -> RecordView:
    rec = record("a", phase=Phase.BACKOFF, restarts=restarts, backoff_until=NOW + due_in)
    return view(rec)


def run(seen: RecordView) -> list[tuple[type[Action], str]]:
    return [(type(a), a.reason) for a in plan(desired(entry("a")), observed(seen), GPUS, NOW)]


# (view, what must happen: "kill", "wait", "restart")
CASES = [
    pytest.param(
        starting(deadline_in=-HOUR + timedelta(seconds=20), age=10.0),
        "wait",
        id="forward-step-10s-into-start-no-kill",
    ),
    pytest.param(
        starting(deadline_in=-HOUR, age=DEADLINE - 0.5),
        "wait",
        id="forward-step-just-before-its-deadline-no-kill",
    ),
    pytest.param(
        starting(deadline_in=HOUR, age=DEADLINE + 1),
        "kill",
        id="back-step-deadline-had-by-the-boot-clock-kills",
    ),
    pytest.param(
        starting(deadline_in=timedelta(seconds=-1), age=DEADLINE + 1),
        "kill",
        id="no-step-past-deadline-kills",
    ),
    pytest.param(
        starting(deadline_in=timedelta(seconds=5), age=DEADLINE - 5),
        "wait",
        id="no-step-before-deadline-waits",
    ),
    pytest.param(
        starting(deadline_in=timedelta(seconds=-1), age=None),
        "kill",
        id="age-unknown-wall-clock-decides-kill",
    ),
    pytest.param(
        starting(deadline_in=timedelta(seconds=1), age=None),
        "wait",
        id="age-unknown-wall-clock-decides-wait",
    ),
    pytest.param(
        backing_off(restarts=1, due_in=HOUR + timedelta(seconds=5)),
        "restart",
        id="back-step-during-10s-back-off-restarts",
    ),
    pytest.param(
        backing_off(restarts=0, due_in=HOUR),
        "restart",
        id="back-step-during-memory-back-off-restarts",
    ),
    pytest.param(
        backing_off(restarts=6, due_in=timedelta(seconds=backoff(6) - 5)),
        "wait",
        id="longest-back-off-still-waits",
    ),
    pytest.param(
        backing_off(restarts=0, due_in=timedelta(seconds=backoff(1) - 1)),
        "wait",
        id="first-back-off-still-waits",
    ),
    pytest.param(
        backing_off(restarts=2, due_in=-HOUR + timedelta(seconds=5)),
        "restart",
        id="forward-step-during-back-off-restarts",
    ),
]


@pytest.mark.parametrize(("seen", "outcome"), CASES)
def test_clock_steps(seen: RecordView, outcome: str) -> None:
    actions = run(seen)
    if outcome == "wait":
        assert actions == []
    elif outcome == "kill":
        assert [t for t, _ in actions] == [Fail], actions
        assert "readiness deadline" in actions[0][1]
    else:
        assert [t for t, _ in actions] == [Restart], actions


@pytest.mark.parametrize("restarts", [0, 1, 3, 9])
def test_the_daemon_never_sleeps_past_a_back_off_after_a_step_back(restarts: int) -> None:
    rec = backing_off(restarts=restarts, due_in=HOUR).record
    due = _next_due(rec, NOW)
    assert due is not None and due[1] <= backoff(max(restarts, 1)) + 0.01, due


def test_the_daemon_does_not_spin_on_a_deadline_the_wall_clock_jumped_past() -> None:
    rec = starting(deadline_in=-HOUR, age=1.0).record
    due = _next_due(rec, NOW)
    assert due == ("probe due", rec.probe.period_seconds), due
