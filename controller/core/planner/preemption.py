"""Priority: a deployment that cannot start stops the fewest, lowest-priority running
deployments whose leaving lets it fit (whom: ``core/devices/victims.py``), or waits saying who
displaced it. Only strictly lower priorities are candidates, so nothing flaps.
"""

from __future__ import annotations

from dataclasses import replace

from controller.core.actions import AnyAction, Hold, Preempt, Start
from controller.core.devices.victims import Victim
from controller.core.manifest.names import replica_of
from controller.core.manifest.specs import Entry
from controller.core.planner.context import Context
from controller.core.planner.ledger import PlanLedger
from controller.core.state import Phase

PREEMPTED = "preempted by "  # a Pending record's message: it keeps saying why while it waits
PREEMPTIBLE = (Phase.STARTING, Phase.READY, Phase.BACKOFF)


def candidates(ctx: Context, leaving: frozenset[str]) -> list[Victim]:
    """Our running deployments with a valid manifest that no other action moves."""
    out = []
    for name, view in ctx.observed.records.items():
        rec, entry = view.record, ctx.instances.get(name)
        if (
            entry is None
            or not ctx.ours(rec)
            or rec.phase not in PREEMPTIBLE
            or not rec.spec_valid
            or rec.spec_hash != entry.hash
            or name in leaving
        ):
            continue
        spec = entry.deployment.spec
        surplus = spec.autoscale is not None and replica_of(name) >= spec.autoscale.min
        out.append(Victim(name, spec.priority, rec.started_at, surplus=surplus))
    return out


def preempt(
    ctx: Context,
    ledger: PlanLedger,
    hold: Hold,
    *,
    why: str,
    lower: list[Victim],
    leaving: frozenset[str],
) -> list[AnyAction]:
    """Start ``hold``'s entry by stopping some of ``lower``, or keep it waiting (one Hold).

    ``lower``: the candidates of lower priority not yet preempted in this plan.
    """
    entry = hold.entry
    spec = entry.deployment.spec
    if not lower or spec.devices.count == 0 or ctx.drain is not None:
        return [waiting(ctx, hold)]
    if ledger.devices_free_without(spec, leaving):
        return [hold]  # this round's teardowns make room: wait, preempt nobody
    victims = ledger.victims(spec, lower)
    if not victims:
        return [waiting(ctx, hold)]
    start = ledger.start_instead_of(entry, why, victims, record=hold.name)
    if isinstance(start, Hold) and start.name in ledger.waiting_turn:
        return [start]  # another start on that device goes first: stop nobody yet
    if not isinstance(start, Start):  # a port or a limit still refuses: stop nobody
        return [waiting(ctx, hold)]
    return [_preempting(start, victims), *_stops(entry, victims)]


def waiting(ctx: Context, hold: Hold) -> Hold:
    """A preempted deployment's Pending message keeps saying who displaced it."""
    view = ctx.observed.records.get(hold.name)
    if view is None or view.record.phase is not Phase.PENDING:
        return hold
    message = view.record.message
    if not message.startswith(PREEMPTED):
        return hold
    first = message.split("; waiting for room: ")[0]
    return replace(hold, reason=f"{first}; waiting for room: {hold.reason}")


def _preempting(start: Start, victims: tuple[str, ...]) -> Start:
    return replace(start, reason=f"{start.reason}; preempting {', '.join(victims)}")


def _stops(entry: Entry, victims: tuple[str, ...]) -> list[Preempt]:
    priority = entry.deployment.spec.priority
    reason = f"{PREEMPTED}{entry.name} (priority {priority})"
    return [Preempt(name=v, reason=reason, by=entry.name, priority=priority) for v in victims]
