"""Records on an Unhealthy device (devicefaults.py) are moved: the instance is stopped
and its record dropped (a ``Replace``: ``plan`` shows destroy and create), and the next
round places it again like any start, on the devices the ledger still offers (an
Unhealthy one is held by its fault, ``placement.ledger_for``)."""

from __future__ import annotations

from controller.core.actions import AnyAction, Replace, Stop
from controller.core.devicefaults import describe
from controller.core.planner.context import Context
from controller.core.state import Phase, RecordView


def move_off_unhealthy(ctx: Context, view: RecordView) -> list[AnyAction]:
    """A teardown for our record holding an Unhealthy device; [] otherwise."""
    rec = view.record
    faults = ctx.observed.unhealthy
    bad = [d for d in rec.devices if d in faults] if rec.holds else []
    if not bad or rec.phase is Phase.RESERVED:
        return []  # a reservation's maker starts it; the round after moves it
    why = "; ".join(describe(faults[d]) for d in bad)
    if ctx.entry(rec.name) is None:
        return [Stop(name=rec.name, reason=f"{why}: stopping it")]
    return [Replace(name=rec.name, reason=f"{why}: moving it to a healthy device", fields=())]
