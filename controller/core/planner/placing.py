"""The starts of one plan, highest priority first: each wanted deployment gets a Start,
an OnDemand swap (Parks and a Hold), a preemption (a Start and Preempts), or a Hold
(memory-packed engines also wait their turn on a shared device: ``planner/turns.py``);
a start whose image some node lacks (``Want.room_only``) a Start or a Hold (its room
taken, or a limit: said so).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from controller.core.actions import AnyAction, Hold, Preempt
from controller.core.devices.victims import Victim
from controller.core.manifest.names import replica_of
from controller.core.planner.context import Context, Want
from controller.core.planner.ledger import PlanLedger
from controller.core.planner.ondemand import swap
from controller.core.planner.preemption import candidates, foreign, preempt

MAKES_ROOM = ", which makes room"  # a start waiting for what this pass stops


def place_wanted(
    ctx: Context, ledger: PlanLedger, wants: Sequence[Want], leaving: frozenset[str]
) -> list[AnyAction]:
    """Actions for every Want; ``leaving``: names this round's other actions free."""
    running = candidates(ctx, leaving)  # once: a big plan stays linear
    others = foreign(ctx)  # other sets' engines: a wait they cause names them
    preempted: set[str] = set()  # a deployment is preempted once per plan
    out: list[AnyAction] = []
    for want in sorted(wants, key=_by_priority):
        step = _place(
            ctx,
            ledger,
            want,
            running=running,
            others=others,
            preempted=preempted,
            leaving=leaving,
        )
        preempted.update(a.name for a in step if isinstance(a, Preempt))
        out += step
    return out


def _place(
    ctx: Context,
    ledger: PlanLedger,
    want: Want,
    *,
    running: Sequence[Victim],
    others: Sequence[Victim],
    preempted: set[str],
    leaving: frozenset[str],
) -> list[AnyAction]:
    entry = want.entry
    start = ledger.start(entry, want.why, record=want.record, in_turn=True)
    if not isinstance(start, Hold) or start.name in ledger.waiting_turn:
        return [start]  # a start that waits its turn on a device preempts nobody
    if want.room_only is not None:  # a swap or a preemption frees a node lacking its image
        return [_room_taken(start, want.room_only)]
    # What this plan's teardowns free makes room (a Terminating record's finishing Stop
    # among them: a Park or a Preempt the daemon began, which holds its devices until its
    # group is gone): the start waits for them, parking and preempting nobody more.
    if leaving and ledger.places_without(entry.deployment.spec, leaving):
        return [_making_room(ctx, ledger, start, leaving)]
    # Idle OnDemand engines are parked for any start, as the README says (a new deployment,
    # a replica `replicas` or the autoscaler asks for, an OnDemand start): before a
    # preemption, which stops an engine at work.
    if swapped := swap(ctx, ledger, entry, want.record):
        return swapped
    # Only now, for a deployment that waits: a big plan with room stays linear.
    priority = entry.deployment.spec.priority
    lower = [c for c in running if c.priority < priority and c.name not in preempted]
    return preempt(ctx, ledger, start, why=want.why, lower=lower, leaving=leaving, others=others)


def _making_room(ctx: Context, ledger: PlanLedger, held: Hold, leaving: frozenset[str]) -> Hold:
    """A start that what this plan stops makes room for waits for them, and says so: its
    placement's "no capacity: remove a manifest" sent the operator of a preemption whose
    victim finishes its answers (up to its grace period) to cut what was already done."""
    spec = held.entry.deployment.spec
    going = sorted(n for n in leaving if not ledger.places_without(spec, leaving - {n}))
    going = going or sorted(leaving)  # any of them would do: name them all
    views = [ctx.observed.records.get(name) for name in going]
    if not any(views):
        return held
    them = ", ".join(going)
    whys = [f"{v.record.name}: {v.record.message}" for v in views if v and v.record.message]
    why = f"waiting for {them} to stop{MAKES_ROOM}" + (f" ({'; '.join(whys)})" if whys else "")
    return replace(held, reason=why)


def makes_room(why: str) -> bool:
    """A Hold's reason that waits only for this pass's own teardowns: the pass (a
    `--once` finishes them) starts it after them, so nothing needs the user."""
    return MAKES_ROOM in why


def _room_taken(held: Hold, image: str) -> Hold:
    """A start its image's nodes had room for, refused here (a limit, or the room taken
    by a start placed before it): it waits for that, Pending; its image is not why (the
    starts that need a pull fetch it), but it is why it preempts nobody."""
    why = f"{held.reason}; it preempts nobody while its image is missing on a node it may free"
    return replace(held, reason=f"{why} ({image})")


def _by_priority(want: Want) -> tuple[int, str, int]:
    """Highest priority first; a deployment's replicas in index order (0 first)."""
    return (-want.entry.deployment.spec.priority, want.entry.name, replica_of(want.record))
