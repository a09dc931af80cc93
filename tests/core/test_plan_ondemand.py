"""The OnDemand idle rule, table-driven: when a running engine is parked, and when not.

An inverted rule (``last_request_at - now``) once passed every planner test and was
caught only end to end; these cases pin each side of ``idleTimeout`` with ``now``
and the gateway's last request as inputs.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from strategies import NOW, desired, entry, inventory, observed, record, view

from controller.core.actions import Park, Start
from controller.core.plan import plan
from controller.core.state import Activation, Phase

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
