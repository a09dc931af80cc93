"""Priority: a deployment that cannot start stops the fewest, lowest-priority running
deployments whose leaving lets it fit (whom: ``core/devices/victims.py``), or waits saying who
displaced it. Only strictly lower priorities are candidates, so nothing flaps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from controller.core.actions import AnyAction, Hold, Preempt, Start
from controller.core.devices.victims import Victim
from controller.core.manifest.names import base_name, in_repo, replica_of
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
            or not rec.holds  # a back-off that gave its lease back frees nothing
            or not rec.spec_valid
            or rec.spec_hash != entry.hash
            or name in leaving
        ):
            continue
        spec = entry.deployment.spec
        surplus = spec.autoscale is not None and replica_of(name) >= spec.autoscale.min
        out.append(Victim(name, spec.priority, rec.started_at, surplus=surplus))
    return out


def foreign(ctx: Context) -> list[Victim]:
    """Other manifest sets' engines running on this node: never preempted (a pass acts
    only on what its set owns), but a wait they cause says so (``_across_sets``)."""
    out = []
    for view in ctx.observed.records.values():
        rec = view.record
        if ctx.ours(rec) or rec.phase not in PREEMPTIBLE or not rec.holds:
            continue
        if rec.elsewhere(ctx.observed.node):
            continue
        out.append(Victim(rec.name, rec.priority, rec.started_at))
    return out


def preempt(
    ctx: Context,
    ledger: PlanLedger,
    hold: Hold,
    *,
    why: str,
    lower: list[Victim],
    leaving: frozenset[str],
    others: Sequence[Victim] = (),
) -> list[AnyAction]:
    """Start ``hold``'s entry by stopping some of ``lower``, or keep it waiting (one Hold).

    ``lower``: the candidates of lower priority not yet preempted in this plan;
    ``others``: other sets' running engines (``foreign``), which only the wait names.
    """
    entry = hold.entry
    spec = entry.deployment.spec
    if ctx.drain is not None:
        return [waiting(ctx, hold)]
    if not lower:
        return [waiting(ctx, _across_sets(ctx, ledger, hold, lower, others))]
    if ledger.fits_without(spec, leaving):
        return [hold]  # this round's teardowns make room (or a port refuses): preempt nobody
    victims = ledger.victims(spec, lower)
    if not victims:
        return [waiting(ctx, _across_sets(ctx, ledger, hold, lower, others))]
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


def _across_sets(
    ctx: Context, ledger: PlanLedger, hold: Hold, lower: list[Victim], others: Sequence[Victim]
) -> Hold:
    """A wait that other sets' engines of lower priority would end if they were ours:
    say who and why they stay (DESIGN: priority preempts within one manifest set), so
    "raise spec.priority" is not the next move it seems."""
    spec = hold.entry.deployment.spec
    below = [o for o in others if o.priority < spec.priority]
    victims = ledger.victims(spec, [*lower, *below]) if below else None
    theirs = [o for o in below if victims and o.name in victims]
    if not theirs:
        return hold
    held = ", ".join(f"{o.name} (priority {o.priority}, {_set_of(ctx, o.name)})" for o in theirs)
    names = " ".join(dict.fromkeys(base_name(o.name) for o in theirs))
    them = "them in their sets" if len(theirs) > 1 else "it in its set"
    note = (
        f"; not preempted, as priority preempts only within one manifest set: {held}; "
        f"stop {them} (`reconcile down {names}` with that set's -f) to make room"
    )
    return replace(hold, reason=hold.reason + note)


def _set_of(ctx: Context, name: str) -> str:
    """Where another set's engine is declared: its file names the set's folder (-f)."""
    rec = ctx.observed.records[name].record
    return f"from {in_repo(ctx.desired.repo, rec.source)}" if rec.source else f"set {rec.owner}"


def _preempting(start: Start, victims: tuple[str, ...]) -> Start:
    return replace(start, reason=f"{start.reason}; preempting {', '.join(victims)}")


def _stops(entry: Entry, victims: tuple[str, ...]) -> list[Preempt]:
    priority = entry.deployment.spec.priority
    reason = f"{PREEMPTED}{entry.name} (priority {priority})"
    return [Preempt(name=v, reason=reason, by=entry.name, priority=priority) for v in victims]
