"""What one plan reads (frozen inputs) and the requests its judging hands on.

Judging a record never places anything: it returns actions, or a :class:`Want` (start
this deployment) or a :class:`Roll` (start its ``@next`` beside it), which the
placing step turns into actions against the plan's ledger.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from controller.core.actions import AnyAction
from controller.core.inventory import Inventory
from controller.core.limits import Limits
from controller.core.specs import Entry
from controller.core.state import Activation, Drain, Observed, Record


@dataclass(frozen=True, kw_only=True, slots=True)
class Desired:
    owner: str
    entries: Mapping[str, Entry] = field(default_factory=dict)
    invalid: Mapping[str, str] = field(default_factory=dict)  # name -> error
    broken_sources: frozenset[str] = frozenset()
    source_errors: Mapping[str, str] = field(default_factory=dict)  # broken file -> its error
    prune: bool = True  # False: a folder is missing or empty (invariant 5)
    # OnDemand deployments the gateway asked for: name -> last request (and in flight).
    activations: Mapping[str, Activation] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class Context:
    """Everything a plan reads; ``drain`` is set only while the node's drain is active."""

    desired: Desired
    observed: Observed
    inventory: Inventory
    now: datetime
    extra_ports: Mapping[str, int]
    limits: Limits
    drain: Drain | None

    @classmethod
    def of(
        cls,
        desired: Desired,
        observed: Observed,
        inventory: Inventory,
        now: datetime,
        *,
        extra_ports: Mapping[str, int],
        limits: Limits,
    ) -> Context:
        drain = observed.drain
        return cls(
            desired=desired,
            observed=observed,
            inventory=inventory,
            now=now,
            extra_ports=extra_ports,
            limits=limits,
            drain=drain if drain is not None and drain.active(now) else None,
        )

    def ours(self, rec: Record) -> bool:
        return rec.owner == self.desired.owner

    def drain_text(self) -> str:
        drain = self.drain
        assert drain is not None
        by = f" by {drain.by}" if drain.by else ""
        why = f" ({drain.reason})" if drain.reason else ""
        until = drain.until.strftime("%Y-%m-%d %H:%M:%S %Z").strip()
        return f"node drained{by} until {until}{why}: run `reconcile uncordon` or wait"


@dataclass(frozen=True, slots=True)
class Want:
    """Start ``entry``: placed once every record is judged, highest priority first."""

    entry: Entry
    why: str


@dataclass(frozen=True, slots=True)
class Roll:
    """RollingUpdate: start ``<name>@next`` beside the Ready old instance, or recreate."""

    entry: Entry
    why: str
    fields: tuple[str, ...]


# What judging one record gives: actions, and requests for the placing step.
Judged = AnyAction | Want | Roll
