"""RollingUpdate: the new instance ``<instance>@next`` starts beside the Ready old one,
runs its own lifecycle until Ready, then is promoted (the old one drains and stops).

With replicas, ``rollingUpdate`` bounds it as Kubernetes does: at most ``maxSurge``
``@next`` instances at once (surge); where no surge fits, old replicas are replaced in
place (stop, then start), never more than ``max(1, maxUnavailable)`` down at once, so
the others serve throughout. One replica is the special case: surge, else recreate.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from controller.core.actions import AnyAction, Promote, Release, Replace, Start, Stop
from controller.core.manifest.names import instance_of, replica_name
from controller.core.manifest.specs import Entry, base_name, next_name
from controller.core.planner.context import Context, Judged, Roll
from controller.core.planner.ledger import PlanLedger
from controller.core.planner.lifecycle import lifecycle, running
from controller.core.planner.recreate import recreate
from controller.core.state import Phase, RecordView


def rolling(entry: Entry) -> bool:
    return entry.deployment.spec.strategy == "RollingUpdate"


@dataclass(frozen=True, slots=True)
class Budget:
    """One deployment's room to roll right now (Kubernetes' maxSurge/maxUnavailable)."""

    replicas: int
    surge: int  # maxSurge as a count (a percentage rounds up)
    unavailable: int  # max(1, maxUnavailable as a count; a percentage rounds down)
    surging: int  # `@next` instances that exist
    down: int  # replicas not serving: missing, or not alive and Ready
    # Pending replicas, holding nothing: room that comes is theirs before a surge's (a
    # replica replaced in place would lose the device it freed to the next one's surge)
    pending: int
    waiting: tuple[str, ...]  # Ready old replicas with no `@next` yet, in index order

    @classmethod
    def of(cls, ctx: Context, entry: Entry) -> Budget:
        n = ctx.desired.count(entry.name)
        rolling_update = entry.deployment.spec.rolling_update
        surge = rolling_update.max_surge if rolling_update else 1
        unavailable = rolling_update.max_unavailable if rolling_update else 0
        names = [replica_name(entry.name, i) for i in range(n)]
        records = ctx.observed.records
        views = [records.get(name) for name in names]
        return cls(
            replicas=n,
            surge=_count(surge, n, up=True),
            unavailable=max(1, _count(unavailable, n, up=False)),
            surging=sum(next_name(name) in records for name in names),
            down=sum(not _serving(v) for v in views),
            pending=sum(v is not None and v.record.phase is Phase.PENDING for v in views),
            waiting=tuple(
                v.record.name
                for v in views
                if v is not None
                and _serving(v)
                and ctx.desired.stale(v.record, entry)
                and next_name(v.record.name) not in records
            ),
        )

    def path(self) -> str:
        """What ``plan`` says of the path a replicated rollout takes."""
        if self.surge:
            return f"surge: up to {self.surge} new beside the old (maxSurge)"
        return f"no surge: {in_place(self.unavailable)}"


def in_place(down: int) -> str:
    """The in-place path's words: "one at a time" only when it is one (maxUnavailable 3
    replaces three at once, which "one at a time, at most 3 down" belied)."""
    if down == 1:
        return "one at a time in place, at most 1 down"
    return f"up to {down} at a time in place, at most {down} down"


def _count(value: int | str, replicas: int, *, up: bool) -> int:
    """An IntOrString as a replica count: a percentage of ``replicas`` rounded ``up``
    (maxSurge) or down (maxUnavailable), as Kubernetes rounds them."""
    if isinstance(value, str):
        share = replicas * int(value.removesuffix("%")) / 100
        return math.ceil(share) if up else math.floor(share)
    return max(0, value)


def _serving(view: RecordView | None) -> bool:
    return view is not None and view.alive and view.record.phase is Phase.READY


def rollout(
    ctx: Context, view: RecordView, entry: Entry, why: str, fields: tuple[str, ...]
) -> list[Judged]:
    """A Ready old replica of a changed spec: its turn to surge, to be replaced in place,
    or to keep serving until the replicas before it are done."""
    rec = view.record
    budget = Budget.of(ctx, entry)
    turn = budget.waiting.index(rec.name) if rec.name in budget.waiting else len(budget.waiting)
    if budget.surge and not budget.pending:
        if turn < budget.surge - budget.surging:
            return [Roll(entry, why, fields, rec.name)]
        return list(running(ctx, view))
    if turn < budget.unavailable - budget.down:
        reason = f"{why}; rolling update ({budget.path()}): replacing {rec.name}"
        return recreate(ctx, view, entry, reason, fields)
    return list(running(ctx, view))


def rolls(ctx: Context, ledger: PlanLedger, requests: Sequence[Roll]) -> list[AnyAction]:
    """Start each ``@next`` beside its Ready old instance; where no room is left, recreate
    old ones instead while the deployment's maxUnavailable allows (others keep serving)."""
    out: list[AnyAction] = []
    down_left: dict[str, int] = {}
    for request in requests:
        entry = request.entry
        if entry.name not in down_left:
            budget = Budget.of(ctx, entry)
            down_left[entry.name] = budget.unavailable - budget.down
        placed = roll(ctx, ledger, request)
        if isinstance(placed, Start):
            out.append(placed)
        elif down_left[entry.name] > 0:
            down_left[entry.name] -= 1
            out.append(placed)
    return out


def roll(ctx: Context, ledger: PlanLedger, request: Roll) -> Start | Replace:
    """Start ``<instance>@next`` beside the Ready old instance, or recreate if no room."""
    entry, why, old = request.entry, request.why, request.record
    nxt = next_name(old)
    many = ctx.desired.count(entry.name) > 1
    path = f" ({Budget.of(ctx, entry).path()})" if many else ""
    said = f"rolling update ({why}){path}: {nxt} beside the old"
    placed = ledger.start(entry, said, record=nxt)
    if isinstance(placed, Start):
        return _fetched_first(ctx, placed, said)
    reason = f"{why}; no room for both: recreating ({placed.reason})"
    if many:  # the path plan names: in place, maxUnavailable at a time, the others serve
        down = Budget.of(ctx, entry).unavailable
        reason = f"{why}; no room for a surge ({placed.reason}): replacing {in_place(down)}"
    return Replace(name=old, reason=reason, fields=request.fields, entry=request.entry)


def _fetched_first(ctx: Context, start: Start, said: str) -> Start:
    """A new instance whose image is not on the node pulls it first, holding nothing
    (the launch's Pulling record): its words say so, and what it takes once pulled."""
    first = ctx.observed.fetching.get(start.entry.name)
    if first is None:
        return start
    taken = start.reason.removeprefix(f"{said}: ")
    reason = f"{said}: {first.why} first; once pulled it takes {taken}"
    return dataclasses.replace(start, reason=reason)


def judge_next(ctx: Context, view: RecordView) -> list[Judged]:
    """A RollingUpdate's new instance: its own lifecycle until Ready, then promoted."""
    rec = view.record  # ours, neither Reserved nor Terminating: the caller saw to those
    base = instance_of(rec.name)  # the instance it replaces: `web@2` for `web@2@next`
    entry = ctx.entry(rec.name)  # None once the deployment, or this replica, is gone
    old = ctx.observed.records.get(base)
    if entry is None or not rolling(entry):
        return list(_abandon(ctx, view, entry))
    stale = rec.spec_hash != entry.hash
    if stale and not _last_server(view, old):
        return list(_abandon(ctx, view, entry))
    kept = "; the spec changed again: it serves until the newest is Ready" if stale else ""
    if old is None or old.record.nonce == rec.nonce:
        # The old record is gone (stopped, or a promote interrupted after its rename).
        return [Promote(name=base, reason=f"{rec.name} takes the name {base}{kept}")]
    if old.record.phase is Phase.TERMINATING:
        return []  # the old one's teardown is finished first (its Stop); then the rename
    down = _down(old)
    if view.alive and rec.phase is Phase.READY:
        drains = "the old one is down: released, not restarted" if down else "old drains"
        return [Promote(name=base, reason=f"rolling update: {rec.name} is Ready; {drains}{kept}")]
    if rec.phase in (Phase.PENDING, Phase.IDLE):
        return [Release(name=rec.name, reason="not a rolling update's state", nonce=rec.nonce)]
    if down:
        reason = (
            f"{base} is down ({down}): {rec.name} takes the name now; the old one is "
            f"released, not restarted{kept}"
        )
        return [Promote(name=base, reason=reason)]
    return lifecycle(ctx, view, entry)  # Starting, crashed, backing off: the old one serves


def _down(old: RecordView) -> str | None:
    """Why the old instance serves nothing and never will again in this roll (its engine
    dead: crashed, backing off, Pending for room, ended), or None while it runs (or is a
    reservation, or parked). Restarted, replaced or placed again, it would start an
    engine the ``@next`` retires as soon as it is Ready (minutes of a model's load, its
    devices held twice over): the ``@next`` takes the name instead, whatever its state,
    and the promotion releases the dead one, as Kubernetes scales an old ReplicaSet down
    while the new one's Pods come, and waits for no dead Pod of the old one."""
    rec = old.record
    if old.alive or rec.phase in (Phase.IDLE, Phase.RESERVED, Phase.TERMINATING):
        return None
    return f"engine {old.exit}" if old.exit else rec.phase.value


def _last_server(view: RecordView, old: RecordView | None) -> bool:
    """A Ready ``@next`` its instance's old engine no longer serves beside (Terminating
    from a promotion cut short, gone, or down): abandoned for a newer spec, it would leave
    nothing Ready until the newest is. As Kubernetes scales a mid-rollout ReplicaSet's
    Ready pods down only as the newest's become Ready, it is promoted instead, stale, and
    the newest rolls from it (a ``@next`` beside it) as from any Ready old instance."""
    other = old is not None and old.record.nonce != view.record.nonce and _serving(old)
    return _serving(view) and not other


def _abandon(ctx: Context, view: RecordView, entry: Entry | None) -> tuple[AnyAction, ...]:
    """The new instance is no longer wanted: stop it (the old one is untouched). A Ready
    one takes its instance's requests (the gateway's table), so those in flight end first,
    as a scaled-away replica's do; a pruned deployment's goes as a prune goes (drained
    too when its file is still there: a name edited in place, its model served on)."""
    rec = view.record
    drain = True
    if entry is None and ctx.scaled_away(rec.name):
        why = f"scaled down to {ctx.desired.count(base_name(rec.name))}"
    elif entry is None:
        broken = base_name(rec.name) in ctx.desired.invalid
        kept = ctx.desired.broken_sources | ctx.desired.emptied
        if broken or rec.source in kept or not ctx.desired.prune:
            return ()  # invariants 4 and 5: a broken or missing manifest stops nothing
        why = ctx.unselected(rec) or ctx.removed(rec, "manifest removed")
        # a prune goes at once, but a name edited in place may be served on (as above)
        drain = ctx.unselected(rec) is None and bool(ctx.still_declaring(rec))
    elif not rolling(entry):
        why = "strategy is no longer RollingUpdate"
    else:
        why = "the spec changed again: a fresh rolling update follows"
    reason = f"rolling update abandoned: {why}"
    if view.alive or view.markers or rec.holds:
        return (Stop(name=rec.name, reason=reason, drain=drain),)
    return (Release(name=rec.name, reason=reason, nonce=rec.nonce),)
