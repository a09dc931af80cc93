"""The planner: (desired, observed, inventory, now) -> ordered actions. Pure.

No clock, no I/O: ``now`` and every observation come in as arguments, so the
same inputs always give the same plan (kubelet's computePodActions, pip-tools'
diff). Each action carries the reason `reconcile plan` prints.

This is the public entry; the policies live in ``controller/core/planner/`` (its
docstring lists them). A plan runs in three steps: judge every record (actions, and
requests to start), roll RollingUpdates beside their old instances, then place the
starts highest priority first, swapping out or preempting where that makes room.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from controller.core.actions import AnyAction, Preempt, Reap, Restart
from controller.core.devices.capacity import Limits
from controller.core.devices.inventory import Inventory
from controller.core.planner.context import EMPTIED, Context, Desired, Roll, Want
from controller.core.planner.ledger import PlanLedger
from controller.core.planner.lifecycle import BACKOFF_RESET, restarts_after
from controller.core.planner.placing import makes_room, place_wanted
from controller.core.planner.preemption import PREEMPTED, PREEMPTIBLE
from controller.core.planner.pulling import gate
from controller.core.planner.records import IN_PLACE, RESTARTED, judge, leader_of, rekeyed
from controller.core.planner.rolling import rolls
from controller.core.planner.turns import is_turn, restarts_in_turn, waits_turn
from controller.core.state import BACKOFF_FIRST, BACKOFF_MAX, Observed, backoff

__all__ = [
    "BACKOFF_FIRST",
    "BACKOFF_MAX",
    "BACKOFF_RESET",
    "EMPTIED",
    "IN_PLACE",
    "PREEMPTED",
    "PREEMPTIBLE",
    "RESTARTED",
    "Desired",
    "backoff",
    "is_turn",
    "leader_of",
    "makes_room",
    "plan",
    "rekeyed",
    "restarts_after",
    "waits_turn",
]


def plan(
    desired: Desired,
    observed: Observed,
    inventory: Inventory,
    now: datetime,
    *,
    extra_ports: Mapping[str, int] | None = None,
    limits: Limits | None = None,
) -> list[AnyAction]:
    ctx = Context.of(
        desired, observed, inventory, now, extra_ports=extra_ports or {}, limits=limits or Limits()
    )
    ledger = PlanLedger.of(ctx)
    judged = gate(ctx, judge(ctx))  # a start whose model files are not cached pulls first
    found = restarts_in_turn([a for a in judged if not isinstance(a, Want | Roll)], observed)
    ledger.starting_too(a.name for a in found if isinstance(a, Restart))  # one per device
    # Rolls place before every Want, in name order: a Ready old instance's successor
    # goes first, and a recreate it falls back to frees its room for this round's starts.
    found += rolls(ctx, ledger, [r for r in judged if isinstance(r, Roll)])
    leaving = frozenset(a.name for a in found if a.frees_now())
    found += place_wanted(ctx, ledger, [w for w in judged if isinstance(w, Want)], leaving)
    preempted = {a.name for a in found if isinstance(a, Preempt)}
    # A preempted record's own action (ready, restart...) gives way to its preemption.
    kept = [a for a in found if a.name not in preempted or isinstance(a, Preempt | Reap)]
    return sorted(kept, key=lambda a: (a.order, a.name))
