"""Every action class states its own facts (order, teardown, what it frees, plan class).

The classes come from the module's namespace, not ``Action.__subclasses__()``:
``@dataclass(slots=True)`` builds a new class, and the replaced one lingers among the
subclasses with the facts it had before the decorator ran.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import get_args

import pytest
from strategies import entry

from controller.core import actions
from controller.core.actions import Action, Fail, PlanClass, Replace, Stop
from controller.core.manifest.names import base_name
from controller.core.state import Phase

FACTS = ("verb", "order", "tears_down", "frees", "plan_class")
CONCRETE = sorted(
    (
        v
        for v in vars(actions).values()
        if isinstance(v, type) and issubclass(v, Action) and v is not Action
    ),
    key=lambda cls: cls.__name__,
)


def test_the_namespace_holds_every_executable_action() -> None:
    """What the executor must handle (AnyAction) is exactly the concrete classes."""
    assert set(CONCRETE) == set(get_args(actions.AnyAction))


@pytest.mark.parametrize("cls", CONCRETE, ids=lambda cls: cls.__name__)
def test_each_fact_is_stated_on_the_class_itself(cls: type[Action]) -> None:
    missing = [fact for fact in FACTS if fact not in vars(cls)]
    assert not missing, f"{cls.__name__} inherits or lacks {missing}"


def test_the_base_is_abstract_by_design_it_states_no_fact() -> None:
    """A new action that forgets a fact fails loudly instead of inheriting a default."""
    assert not [fact for fact in FACTS if fact in vars(Action)]


def test_facts_have_their_declared_types() -> None:
    kinds = set(get_args(PlanClass))
    wrong = [
        cls.__name__
        for cls in CONCRETE
        if not (
            isinstance(cls.verb, str)
            and type(cls.order) is int
            and type(cls.tears_down) is bool
            and type(cls.frees) is bool
            and cls.plan_class in kinds
        )
    ]
    assert not wrong, wrong


def test_orders_are_distinct_so_a_plan_sorts_one_way() -> None:
    orders = sorted(cls.order for cls in CONCRETE)
    assert orders == list(range(len(CONCRETE)))


def test_verbs_are_distinct() -> None:
    verbs = [cls.verb for cls in CONCRETE]
    assert len(verbs) == len(set(verbs))


def test_teardowns_run_before_starts() -> None:
    start = actions.Start.order
    assert all(cls.order < start for cls in CONCRETE if cls.tears_down)


def test_a_subclass_restates_what_differs_from_its_parent() -> None:
    """Replace is a Stop to the executor, but plans first and shows as a replacement."""
    assert issubclass(Replace, Stop)
    assert (Replace.order, Replace.plan_class) != (Stop.order, Stop.plan_class)


@pytest.mark.parametrize(
    ("phase", "frees"),
    [(Phase.BACKOFF, False), (Phase.FAILED, True), (Phase.SUCCEEDED, True)],
)
def test_a_fail_frees_its_devices_only_when_its_phase_holds_none(phase: Phase, frees: bool) -> None:
    retry = datetime(2025, 1, 1, tzinfo=UTC) if phase is Phase.BACKOFF else None
    assert Fail(name="a", reason="r", phase=phase, retry_at=retry).frees_now() is frees


def test_other_actions_free_by_their_class() -> None:
    stop = Stop(name="a", reason="r")
    assert stop.frees_now() is Stop.frees is True


def _start(name: str) -> actions.Start:
    return actions.Start(name=name, reason="r", entry=entry(base_name(name)), devices=(), port=1)


@pytest.mark.parametrize(
    ("plan", "present", "early"),
    [
        ([], [], True),  # nothing to do: nothing to defer
        ([_start("new")], ["other", "other@1"], True),
        ([_start("new"), _start("new@1")], [], True),  # a new deployment's replicas
        ([_start("web@1")], ["web"], False),  # a scale-up changes a running deployment
        ([actions.Fetch(name="new", reason="r", entry=entry("new"))], [], True),  # its image
        ([actions.Fetch(name="web@1", reason="r", entry=entry("web"))], ["web"], False),
        ([_start("web@next")], ["web"], False),  # a rolling update's new instance
        ([_start("new"), Stop(name="old", reason="r")], ["old"], False),  # a stop
        ([Replace(name="web", reason="r")], ["web"], False),
        ([Fail(name="web", reason="r", phase=Phase.FAILED)], ["web"], False),
    ],
)
def test_only_a_plan_of_new_deployments_may_run_before_the_folder_settles(
    plan: list[Action], present: list[str], early: bool
) -> None:
    """What a pass run at once (the daemon's first whole change after quiet) may apply."""
    assert actions.only_starts_new(plan, present) is early
