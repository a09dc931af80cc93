"""The planner around pulls, table-driven, with its properties. Pure: no process, no file.

A recreate (``strategy: Recreate``, or a rolling update replacing in place) of a Ready
engine whose new spec's model files are not in the cache pulls them first while the
engine serves, as a new image is pulled first; a failed pull stops nothing.

A start whose image's pull failed backs off holding nothing (the launcher gave its lease
back: ``Record.unleased_backoff``), as a failed model pull does: meanwhile its devices
and port are anyone's, and once the back-off is over it is placed afresh by the ledger,
never restarted in place on a lease it no longer has.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import (
    NOW,
    SOURCE,
    Scenario,
    deployment,
    desired,
    entry,
    inventory,
    memory_scenarios,
    observed,
    record,
    replicated_scenarios,
    scenarios,
    view,
)
from test_plan import DRAIN, Case, _holders_of, run

from controller.core.actions import (
    Fetch,
    Hold,
    HoldRestart,
    Preempt,
    Pull,
    Release,
    Replace,
    Restart,
    Start,
    Stop,
)
from controller.core.devices.capacity import Limits
from controller.core.devices.inventory import Device, Inventory
from controller.core.imagepulls import ImageWait
from controller.core.manifest.names import replica_name
from controller.core.manifest.specs import Entry, next_name, spec_hash
from controller.core.plan import Desired, plan
from controller.core.pulls import PullFailure, PullView, url_key
from controller.core.state import Observed, Phase, Record

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
        Case(
            desired(a_gpu),
            observed(view(pull_backoff()), drain=DRAIN),
            expect=((HoldRestart, "a", "restart held: node drained"),),
            inv=ONE,
        ),
        id="pull-back-off-over-but-drained-waits-and-says-so",
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


# -- a recreate's new model files are pulled first, while the Ready engine serves ----------

OLD_SHA, NEW_SHA = "a" * 64, "b" * 64
NEW_KEY = url_key(NEW_SHA)


def with_model(sha: str, **spec: Any) -> Entry:
    """Deployment ``a`` whose spec.source is a URL of digest ``sha``."""
    source = {"url": f"https://models.example.org/{sha[:4]}.gguf", "sha256": sha}
    dep = deployment("a", source=source, command=["serve", "{model}"], **spec)
    return Entry(dep, SOURCE, 1, spec_hash(dep.spec))


def serving_old(phase: Phase = Phase.READY, **spec: Any) -> Any:
    extra = {"ready_deadline_at": NOW + timedelta(seconds=30)} if phase is Phase.STARTING else {}
    rec = record("a", spec=with_model(OLD_SHA, **spec), phase=phase, **extra)
    return view(rec, alive=True)


FAILED = PullFailure(kind="http", message="HTTP 404 for https://x", at=NOW, attempts=1)

PREFETCH_CASES = [
    pytest.param(
        {},
        Pull,
        "spec.source.sha256, spec.source.url changed: pulling "
        "https://models.example.org/bbbb.gguf first; the running engine serves meanwhile",
        id="not-cached-pulls-first",
    ),
    pytest.param(
        {NEW_KEY: PullView(key=NEW_KEY, running=True)},
        Pull,
        "the running engine serves meanwhile",
        id="pulling-serves-on",
    ),
    pytest.param(
        {NEW_KEY: PullView(key=NEW_KEY, failure=FAILED)},
        Pull,
        "pull failed: HTTP 404 for https://x; retry at",
        id="failed-serves-on",
    ),
    pytest.param(
        {NEW_KEY: PullView(key=NEW_KEY, cached=True)},
        Replace,
        "spec.source.sha256, spec.source.url changed",
        id="cached-replaces",
    ),
]


@pytest.mark.parametrize(("pulls", "kind", "phrase"), PREFETCH_CASES)
def test_a_recreate_pulls_its_new_source_before_stopping_the_ready_engine(
    pulls: dict[str, PullView], kind: type, phrase: str
) -> None:
    actions = plan(desired(with_model(NEW_SHA)), observed(serving_old(), pulls=pulls), ONE, NOW)
    assert [(type(a), a.name) for a in actions] == [(kind, "a")], [a.describe() for a in actions]
    (action,) = actions
    assert phrase in action.reason, action.describe()
    if isinstance(action, Pull):  # the serving record stays as it is
        assert not action.record and action.spawn == (pulls == {}), action


def test_a_starting_engine_is_replaced_at_once() -> None:
    """Not serving yet: nothing to keep, the new files are pulled after it stops."""
    actions = plan(desired(with_model(NEW_SHA)), observed(serving_old(Phase.STARTING)), ONE, NOW)
    assert [(type(a), a.name) for a in actions] == [(Replace, "a")]


def test_a_rolling_update_without_surge_pulls_first_too() -> None:
    """maxSurge 0: replicas are replaced in place one at a time, each a recreate; the
    first one's new files are pulled while every replica serves."""
    spec = {"replicas": 2, "strategy": "RollingUpdate"}
    spec["rollingUpdate"] = {"maxSurge": 0, "maxUnavailable": 1}
    old = with_model(OLD_SHA, **spec)
    views = [view(record(replica_name("a", i), spec=old), alive=True) for i in range(2)]
    actions = plan(desired(with_model(NEW_SHA, **spec)), observed(*views), ONE, NOW)
    got = [(type(a), a.name) for a in actions]
    assert got == [(Pull, "a")], [a.describe() for a in actions]


@st.composite
def recreates(draw: st.DrawFn) -> tuple[Observed, Desired]:
    """Deployment ``a`` whose source changed, its record in any phase, alive or not; the
    new files cached, pulled now, failed (back-off over or not) or absent."""
    phase = draw(st.sampled_from([Phase.READY, Phase.STARTING, Phase.BACKOFF, Phase.PENDING]))
    strategy = draw(st.sampled_from(["Recreate", "RollingUpdate"]))
    old = with_model(OLD_SHA, strategy=strategy, **GPU1)
    fields: dict[str, Any] = {"devices": ("nvidia:0",)} if phase is not Phase.PENDING else {}
    if phase is Phase.PENDING:
        fields["port"] = None
    if phase is Phase.STARTING:
        fields["ready_deadline_at"] = NOW + timedelta(seconds=draw(st.integers(-30, 30)))
    if phase is Phase.BACKOFF:
        fields["backoff_until"] = NOW + timedelta(seconds=draw(st.integers(-30, 30)))
    rec = record("a", spec=old, phase=phase, **fields)
    alive = phase is not Phase.PENDING and draw(st.booleans())
    pull = draw(
        st.sampled_from(["none", "cached", "running", "failed"]).map(
            lambda k: {
                "none": None,
                "cached": PullView(key=NEW_KEY, cached=True),
                "running": PullView(key=NEW_KEY, running=True),
                "failed": PullView(
                    key=NEW_KEY,
                    failure=PullFailure(kind="http", message="404", at=NOW, attempts=1),
                ),
            }[k]
        )
    )
    pulls = {} if pull is None else {NEW_KEY: pull}
    seen = observed(view(rec, alive=alive), pulls=pulls)
    return seen, desired(with_model(NEW_SHA, strategy=strategy, **GPU1))


@given(recreates(), st.sampled_from([ONE, TWO]))
def test_property_a_serving_engine_is_never_stopped_for_files_not_in_the_cache(
    case: tuple[Observed, Desired], inv: Any
) -> None:
    """A Ready, live engine whose new spec's files are not cached is neither replaced nor
    stopped: they are pulled first (a Pull that writes no record), and no engine of the
    new spec starts before they are there."""
    seen, want = case
    actions = plan(want, seen, inv, NOW)
    rec = seen.records["a"].record
    cached = NEW_KEY in seen.pulls and seen.pulls[NEW_KEY].cached
    if not cached:
        assert not [a for a in actions if isinstance(a, Start)], [a.describe() for a in actions]
    if rec.phase is Phase.READY and seen.records["a"].alive and not cached:
        teardowns = [a for a in actions if isinstance(a, Stop | Preempt) and a.name == "a"]
        assert not teardowns, [a.describe() for a in actions]
        pulls = [a for a in actions if isinstance(a, Pull)]
        assert len(pulls) == 1 and not pulls[0].record, [a.describe() for a in actions]


# -- a start whose image the backend has not fetched yet (Observed.fetching) ----------------

PULLING_IMAGE = "pulling image 127.0.0.1:1/x:1 (podman)"
a_high = entry("a", priority=5, **GPU1)
a_pair = entry("a", priority=5, replicas=2, **GPU1)
c_higher = entry("c", priority=9, **GPU1)
ON_BARE = ImageWait(f"{PULLING_IMAGE} on Ray node 0a1b2c3d", room=1)
NOT_THE_IMAGE = "it preempts nobody while its image is missing on a node it may free"
NO_ROOM = "no capacity: needs 1 nvidia device, 0 free — held by b [nvidia:0]; c [nvidia:1]"

FETCH_CASES = [
    pytest.param(
        Case(
            desired(a_high, b_gpu),
            observed(
                view(pull_backoff(spec=a_high)),
                holding("b", b_gpu, "nvidia:0", 8000),
                fetching={"a": ImageWait(PULLING_IMAGE)},
            ),
            expect=((Fetch, "a", PULLING_IMAGE),),
            inv=ONE,
        ),
        id="image-retry-of-higher-priority-preempts-nobody",
    ),
    pytest.param(
        Case(
            desired(a_high, b_gpu),
            observed(
                holding("b", b_gpu, "nvidia:0", 8000), fetching={"a": ImageWait(PULLING_IMAGE)}
            ),
            expect=((Fetch, "a", PULLING_IMAGE),),
            inv=ONE,
        ),
        id="image-not-here-new-deployment-preempts-nobody",
    ),
    pytest.param(
        Case(
            desired(a_high, b_gpu),
            observed(
                view(record("a", spec=a_high, phase=Phase.PULLING, port=None)),
                holding("b", b_gpu, "nvidia:0", 8000),
            ),
            expect=(
                (Preempt, "b", "preempted by a (priority 5)"),
                (Start, "a", "preempting b"),
            ),
            inv=ONE,
        ),
        id="image-here-now-placed-and-preempts",
    ),
    pytest.param(
        Case(
            desired(a_gpu, b_gpu),
            observed(
                view(record("a", spec=a_gpu, phase=Phase.PULLING, port=None)),
                view(record("b", spec=b_gpu, phase=Phase.PENDING, port=None)),
                fetching={"a": ImageWait(f"{PULLING_IMAGE}: Copying blob")},
            ),
            expect=(
                (Start, "b", "retrying placement: nvidia:0"),
                (Fetch, "a", "Copying blob"),
            ),
            inv=ONE,
        ),
        id="image-pulling-keeps-no-gpu-from-the-next-start",
    ),
    pytest.param(
        Case(
            desired(a_gpu),
            observed(view(pull_backoff(due=False)), fetching={"a": ImageWait(PULLING_IMAGE)}),
            inv=ONE,
        ),
        id="image-back-off-not-over-waits",
    ),
    # A cluster's node with room holds the image, one where a preempting start lands
    # does not (ImageWait.room = 1): the start that fits is placed, the other waits.
    pytest.param(
        Case(
            desired(a_pair, b_gpu),
            observed(holding("b", b_gpu, "nvidia:0", 8000), fetching={"a": ON_BARE}),
            expect=((Start, "a", "nvidia:1"), (Fetch, "a@1", ON_BARE.why)),
            inv=TWO,
        ),
        id="image-on-the-node-with-room-places-what-fits-there",
    ),
    pytest.param(
        Case(
            desired(a_high, b_gpu, c_higher),
            observed(holding("b", b_gpu, "nvidia:0", 8000), fetching={"a": ON_BARE}),
            expect=((Start, "c", "nvidia:1"), (Hold, "a", NO_ROOM)),
            inv=TWO,
        ),
        id="image-room-a-higher-start-took-waits-and-preempts-nobody",
    ),
]


def test_a_start_into_its_images_room_refused_by_a_limit_says_the_limit() -> None:
    """The start the room of the image's nodes takes (``ImageWait.room``), refused by
    ``--max-instances``, waits Pending and says so: its message said the image's pull
    elsewhere, as if that were what it waited for. Why it preempts nobody follows."""
    seen = observed(holding("b", b_gpu, "nvidia:0", 8000), fetching={"a": ON_BARE})
    actions = plan(desired(a_pair, b_gpu), seen, TWO, NOW, limits=Limits(max_instances=1))
    got = {a.name: (type(a), a.reason) for a in actions}
    assert got.keys() == {"a", "a@1"} and got["a@1"] == (Fetch, ON_BARE.why), got
    kind, why = got["a"]
    assert kind is Hold, got
    assert why.startswith("node limit maxInstances=1 reached (running: b): remove a manifest")
    assert why.endswith(f"; {NOT_THE_IMAGE} ({ON_BARE.why})"), why


def test_a_start_is_planned_on_a_node_its_image_was_found_on() -> None:
    """A cluster's look found a's image on node n2 (``Observed.images_on``): the plan
    takes its GPU, not the first free one (the launch went to n2, `plan` said n1)."""
    nodes = ("n1", "n2", "n3")
    inv = Inventory(tuple(Device(kind="nvidia", id=f"{n}/0", node=n) for n in nodes), "ray")
    (alone,) = plan(desired(a_gpu), observed(), inv, NOW)
    assert isinstance(alone, Start) and alone.devices == ("nvidia:n1/0",), alone.describe()
    seen = observed(images_on={"a": frozenset({"n2"})})
    (start,) = plan(desired(a_gpu), seen, inv, NOW)
    assert isinstance(start, Start) and start.devices == ("nvidia:n2/0",), start.describe()


@pytest.mark.parametrize("case", FETCH_CASES)
def test_plan_fetch_table(case: Case) -> None:
    test_plan_pulls_table(case)


@settings(max_examples=300)
@given(memory_scenarios(), st.data())
def test_property_a_start_whose_image_is_not_here_never_preempts_and_holds_nothing(
    scenario: Scenario, data: st.DataObject
) -> None:
    """Whichever deployments' images are not here (being pulled, or their pull failed),
    none of them is started (a Start takes a lease) or preempts anyone: each waits in a
    Fetch, which holds nothing, and the others are placed as if it were not there."""
    names = sorted(scenario.desired.entries)
    missing = data.draw(st.lists(st.sampled_from(names), unique=True))
    room = data.draw(st.integers(min_value=0, max_value=2))  # starts a node with room takes
    waits = {n: ImageWait(PULLING_IMAGE, room=room) for n in missing}
    seen = replace(scenario.observed, fetching=waits)
    actions = plan(scenario.desired, seen, scenario.inventory, NOW)
    shown = [a.describe() for a in actions]
    for name in missing:  # into free room alone, as many as the nodes holding it take
        started = [a for a in actions if isinstance(a, Start) and a.entry.name == name]
        assert len(started) <= room, shown
    assert not [a for a in actions if isinstance(a, Preempt) and a.by in missing], shown
    for fetch in (a for a in actions if isinstance(a, Fetch)):
        assert fetch.entry.name in missing and fetch.name not in _holders(seen), shown


def _holders(seen: Observed) -> set[str]:
    return {n for n, v in seen.records.items() if v.record.holds}
