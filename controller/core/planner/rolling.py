"""RollingUpdate: the new instance ``<name>@next`` starts beside the Ready old one,
runs its own lifecycle until Ready, then is promoted (the old one drains and stops).
"""

from __future__ import annotations

from controller.core.actions import AnyAction, Promote, Release, Replace, Start, Stop
from controller.core.planner.context import Context, Judged, Roll
from controller.core.planner.ledger import PlanLedger
from controller.core.planner.lifecycle import lifecycle
from controller.core.specs import Entry, base_name, next_name
from controller.core.state import Phase, RecordView


def rolling(entry: Entry) -> bool:
    return entry.deployment.spec.strategy == "RollingUpdate"


def roll(ledger: PlanLedger, request: Roll) -> Start | Replace:
    """Start ``<name>@next`` beside the Ready old instance, or recreate if no room."""
    entry, why = request.entry, request.why
    nxt = next_name(entry.name)
    placed = ledger.start(entry, f"rolling update ({why}): {nxt} beside the old", record=nxt)
    if isinstance(placed, Start):
        return placed
    reason = f"{why}; no room for both: recreating ({placed.reason})"
    return Replace(name=entry.name, reason=reason, fields=request.fields)


def judge_next(ctx: Context, view: RecordView) -> list[Judged]:
    """A RollingUpdate's new instance: its own lifecycle until Ready, then promoted."""
    rec = view.record  # ours, neither Reserved nor Terminating: the caller saw to those
    base = base_name(rec.name)
    entry = ctx.desired.entries.get(base)
    old = ctx.observed.records.get(base)
    if entry is None or not rolling(entry) or rec.spec_hash != entry.hash:
        return list(_abandon(ctx, view, entry))
    if old is None or old.record.nonce == rec.nonce:
        # The old record is gone (stopped, or a promote interrupted after its rename).
        return [Promote(name=base, reason=f"{rec.name} takes the name {base}")]
    if old.record.phase is Phase.TERMINATING:
        return []  # the old one's teardown is finished first (its Stop); then the rename
    if view.alive and rec.phase is Phase.READY:
        return [Promote(name=base, reason=f"rolling update: {rec.name} is Ready; old drains")]
    if rec.phase in (Phase.PENDING, Phase.IDLE):
        return [Release(name=rec.name, reason="not a rolling update's state", nonce=rec.nonce)]
    return lifecycle(ctx, view, entry)  # Starting, crashed, backing off: the old one serves


def _abandon(ctx: Context, view: RecordView, entry: Entry | None) -> tuple[AnyAction, ...]:
    """The new instance is no longer wanted: stop it (the old one is untouched)."""
    rec = view.record
    if entry is None:
        broken = base_name(rec.name) in ctx.desired.invalid
        if broken or rec.source in ctx.desired.broken_sources or not ctx.desired.prune:
            return ()  # invariants 4 and 5: a broken or missing manifest stops nothing
        why = "manifest removed"
    elif not rolling(entry):
        why = "strategy is no longer RollingUpdate"
    else:
        why = "the spec changed again: a fresh rolling update follows"
    reason = f"rolling update abandoned: {why}"
    if view.alive or view.markers or rec.holds:
        return (Stop(name=rec.name, reason=reason),)
    return (Release(name=rec.name, reason=reason, nonce=rec.nonce),)
