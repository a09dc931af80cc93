"""OnDemand (the gateway): an engine runs while requests come, parks when idle, and
idle engines of no higher priority are swapped out, least recently used first.
"""

from __future__ import annotations

from controller.core.actions import AnyAction, Hold, Park
from controller.core.elapsed import later
from controller.core.manifest.specs import Entry
from controller.core.planner.context import Context
from controller.core.planner.ledger import PlanLedger
from controller.core.state import Activation, Phase, Record


def parked(ctx: Context, entry: Entry, rec: Record | None) -> bool:
    """An OnDemand deployment nobody asked for within its idleTimeout stays Idle.

    The gateway refreshes ``last_request_at`` while requests are in flight, so a
    stale activation (a crashed daemon's) expires by itself.
    """
    spec = entry.deployment.spec
    if spec.activation != "OnDemand":
        return False
    act = ctx.desired.activations.get(entry.name)
    if act is None or act.released:  # released: unloaded, until the next request
        return True
    if rec is not None and rec.phase is Phase.IDLE and rec.idle_since is not None:
        # The boot clock orders the two where both have it: after a step back a new
        # request's wall time can be before the park's.
        asked = (act.last_request_at, act.boot)
        if not later(*asked, rec.idle_since, rec.idle_boot, ctx.observed.boot):
            return True  # parked (idle or swapped out) after its last request
    # On the boot clock where the gateway stamped it: a wall-clock step parks nothing.
    return act.idle_for(ctx.now, ctx.observed.boot) >= spec.idle_timeout


def idle_reason(entry: Entry, rec: Record, act: Activation | None = None) -> str:
    if act is not None and act.released and rec.holds:
        return "unloaded (the web page): idle until a request"
    if rec.phase in (Phase.PENDING, Phase.IDLE) or not rec.holds:
        return "OnDemand: idle until a request"
    return f"idle: no request for {entry.deployment.spec.idle_timeout:g}s (idleTimeout)"


def swap(ctx: Context, ledger: PlanLedger, entry: Entry, record: str) -> list[AnyAction]:
    """Park idle OnDemand engines of no higher priority, LRU first, to make room for
    ``record`` (an instance of ``entry``: its replica, for a scale-up).

    An idle engine is a cache the gateway refills on the next request, so any start
    that finds no room may take its place: an OnDemand start, a new deployment, a
    replica the manifest or the autoscaler asks for (a scale-up under load once waited
    for the idle engine's idleTimeout). Empty when no such set makes room; else the
    Parks and a Hold that the next round (the room freed) turns into the Start.
    """
    if ctx.drain is not None:
        return []
    victims = _victims(ctx, ledger, entry)
    if not victims:
        return []
    reason = f"swapped out for {record} (idle OnDemand, least recently used)"
    parks: list[AnyAction] = [
        Park(name=v, reason=reason, entry=ctx.desired.entries[v]) for v in victims
    ]
    why = f"making room: stopping idle {', '.join(victims)}"
    return [*parks, Hold(name=record, reason=why, entry=entry)]


def _victims(ctx: Context, ledger: PlanLedger, entry: Entry) -> list[str]:
    """The shortest LRU-first run of idle engines whose parking lets ``entry`` fit (its
    devices, its port, and the node's maxInstances, which a parked engine counts no more
    against)."""
    spec = entry.deployment.spec
    candidates = sorted(_swappable(ctx, entry), key=lambda name: -_idle_for(ctx, name))
    for n in range(1, len(candidates) + 1):
        if ledger.places_without(spec, candidates[:n]):
            return candidates[:n]
    return []


def _swappable(ctx: Context, entry: Entry) -> list[str]:
    """Our Ready OnDemand engines of no higher priority with no request in flight."""
    out = []
    for name, view in ctx.observed.records.items():
        other = ctx.desired.entries.get(name)
        if name == entry.name or other is None or not ctx.ours(view.record):
            continue
        spec = other.deployment.spec
        if spec.activation != "OnDemand" or view.record.phase is not Phase.READY:
            continue
        if spec.priority <= entry.deployment.spec.priority and not _busy(ctx, name):
            out.append(name)
    return out


def _busy(ctx: Context, name: str) -> bool:
    act = ctx.desired.activations.get(name)
    return act is not None and act.inflight > 0


def _idle_for(ctx: Context, name: str) -> float:
    """Seconds since its last request (the boot clock's where known): LRU order."""
    act = ctx.desired.activations.get(name)
    return act.idle_for(ctx.now, ctx.observed.boot) if act is not None else float("inf")
