"""Pure choice of whom to preempt: the fewest, lowest-priority deployments whose leaving
lets a higher-priority one fit (DESIGN: Memory and priority), its devices and the node's
maxInstances limits alike (``fits``: the planning ledger's question). No clock, no I/O.

Only strictly lower priorities are ever candidates, so two deployments of equal
priority never preempt each other, and one that was preempted cannot preempt back
the deployment that displaced it (that one's priority is higher): no flapping.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class Victim:
    """A running deployment that may be stopped for a higher priority one."""

    name: str
    priority: int
    started_at: datetime | None = None
    surplus: bool = False  # a replica above its autoscale.min: the deployment can spare it


def cheapest_first(candidate: Victim) -> tuple[int, bool, float, str]:
    """Lowest priority first; among equals a replica above autoscale.min (its deployment
    keeps its floor), then the most recently started (least work lost)."""
    started = candidate.started_at.timestamp() if candidate.started_at else float("inf")
    return (candidate.priority, not candidate.surplus, -started, candidate.name)


def choose_victims(
    priority: int,
    candidates: Sequence[Victim],
    fits: Callable[[Sequence[str]], bool],
) -> tuple[str, ...] | None:
    """Names to stop so a deployment of ``priority`` fits (``fits(gone)``), or None when
    stopping them cannot help.

    One victim when one suffices (the cheapest such); otherwise the cheapest prefix
    that makes room, then every victim that is not needed after all is spared, the
    most expensive first: the set is minimal and as low as the order allows.
    """
    eligible = sorted((c for c in candidates if c.priority < priority), key=cheapest_first)
    names = [c.name for c in eligible]
    for name in names:
        if fits((name,)):
            return (name,)
    chosen: list[str] = []
    for name in names:
        chosen.append(name)
        if fits(chosen):
            break
    else:
        return None
    for name in reversed(chosen):
        rest = [n for n in chosen if n != name]
        if fits(rest):
            chosen = rest
    return tuple(chosen)
