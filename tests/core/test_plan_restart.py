"""The planner's `reconcile restart` and its in-place restatements, table-driven.

A restart request is desired state (``Desired.restarts``): an instance started before
it gives way to a new one (recreate, or rolling where the strategy says so), one
started since is left alone. Facts that change nothing that runs (labels, the
NOT_HASHED fields, the manifests' commit) rewrite the record in place. Pure.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from strategies import NOW, desired, entry, inventory, observed, record, view
from test_plan import Case, run

from controller.core.actions import Replace, Start, Update
from controller.core.manifest.names import replica_name
from controller.core.manifest.specs import Entry, next_name
from controller.core.state import Phase, RecordView

GPU1 = {"devices": {"count": 1, "kind": "nvidia"}}
ROLL = {"strategy": "RollingUpdate", **GPU1}
ASKED = {"a": NOW - timedelta(seconds=5)}  # the records started 60 s before NOW
FOUR = inventory("nvidia:0", "nvidia:1", "nvidia:2", "nvidia:3")
RESTARTED = "restarted by `reconcile restart`"


def _live(name: str, spec: Entry, device: str, **fields: object) -> RecordView:
    return view(record(name, spec=spec, devices=(device,), **fields), alive=True)


plain = entry("a", **GPU1)
rolling = entry("a", **ROLL)
replicated = entry("a", replicas=3, rollingUpdate={"maxSurge": 1}, **ROLL)

CASES = [
    pytest.param(
        Case(desired(plain, restarts=ASKED), observed(_live("a", plain, "nvidia:0"))),
        id="recreate-when-the-strategy-is-recreate",
    ),
    pytest.param(
        Case(desired(rolling, restarts=ASKED), observed(_live("a", rolling, "nvidia:0"))),
        id="rolling-starts-next-beside-the-old",
    ),
    pytest.param(
        Case(
            desired(plain, restarts={"a": NOW - timedelta(seconds=600)}),
            observed(_live("a", plain, "nvidia:0")),
        ),
        id="started-since-the-request-is-left-alone",
    ),
]
EXPECT = {
    "recreate-when-the-strategy-is-recreate": [(Replace, "a")],
    "rolling-starts-next-beside-the-old": [(Start, next_name("a"))],
    "started-since-the-request-is-left-alone": [],
}


@pytest.mark.parametrize("case", CASES)
def test_restart(case: Case, request: pytest.FixtureRequest) -> None:
    actions = run(Case(case.want, case.seen, inv=FOUR))
    case_id = request.node.callspec.id
    assert [(type(a), a.name) for a in actions] == EXPECT[case_id]
    for action in actions:
        assert RESTARTED in action.reason, action.reason


def test_a_replicated_rolling_restart_honours_max_surge() -> None:
    names = [replica_name("a", i) for i in range(3)]
    views = [_live(n, replicated, f"nvidia:{i}") for i, n in enumerate(names)]
    want = desired(replicated, restarts=ASKED)
    actions = run(Case(want, observed(*views), inv=FOUR))
    assert [(type(a), a.name) for a in actions] == [(Start, next_name("a"))]  # one at a time
    # Replica 0 was promoted (started after the request): the next one's turn.
    fresh = _live("a", replicated, "nvidia:0", started_at=NOW)
    actions = run(Case(want, observed(fresh, *views[1:]), inv=FOUR))
    assert [(type(a), a.name) for a in actions] == [(Start, next_name(names[1]))]


@pytest.mark.parametrize(
    ("change", "said"),
    [
        pytest.param({"aliases": ["chat"]}, "spec.aliases changed", id="aliases"),
        pytest.param({"idleTimeout": "17m"}, "spec.idleTimeout changed", id="idle-timeout"),
        pytest.param({"image": "x/y:2"}, "spec.image changed", id="image"),
    ],
)
def test_facts_that_change_nothing_running_update_in_place(
    change: dict[str, object], said: str
) -> None:
    was, now = entry("a"), entry("a", **change)
    assert was.hash == now.hash  # NOT_HASHED: no restart
    actions = run(Case(desired(now), observed(view(record("a", spec=was), alive=True))))
    assert [(type(a), a.name, a.reason) for a in actions] == [(Update, "a", said)]


def test_an_idle_record_takes_a_new_alias_in_place() -> None:
    was = entry("a", activation="OnDemand")
    now = entry("a", activation="OnDemand", aliases=["chat"])
    idle = view(record("a", spec=was, phase=Phase.IDLE))
    actions = run(Case(desired(now), observed(idle)))
    assert [(type(a), a.reason) for a in actions] == [(Update, "spec.aliases changed")]


def test_a_new_commit_alone_restates_the_revision_and_nothing_else() -> None:
    a = entry("a")
    seen = observed(view(record("a", spec=a, revision="1" * 40), alive=True))
    actions = run(Case(desired(a, revision="2" * 40), seen))
    assert len(actions) == 1 and isinstance(actions[0], Update)
    assert actions[0].revision_only and "222222222222" in actions[0].reason
    same = observed(view(record("a", spec=a, revision="2" * 40), alive=True))
    assert run(Case(desired(a, revision="2" * 40), same)) == []
