"""Node capacity limits: ``maxInstances`` for the whole node and per device kind. Pure.

An instance counts while its record holds resources (every phase but Pending,
Failed and Succeeded), whoever owns it: the limit is the node's. Per kind, an
instance counts against each kind of device it holds; one with no devices counts
only against the node-wide limit. The planner passes these in; nothing here reads
a clock, a file or the environment.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from controller.core.devices.inventory import KINDS, Inventory

FLAG_HELP = "--max-instances / RECONCILE_MAX_INSTANCES / maxInstances in the node config"


@dataclass(frozen=True, slots=True)
class Limits:
    max_instances: int | None = None  # None: no node-wide limit
    per_kind: Mapping[str, int] = field(default_factory=dict)

    def merged(self, other: Limits) -> Limits:
        """``other`` (a flag) wins over ``self`` (the node config file), key by key."""
        total = other.max_instances if other.max_instances is not None else self.max_instances
        return Limits(total, {**self.per_kind, **other.per_kind})

    def describe(self) -> str:
        parts = [] if self.max_instances is None else [str(self.max_instances)]
        parts += [f"{k}={v}" for k, v in sorted(self.per_kind.items())]
        return ",".join(parts) or "none"


def parse_limits(text: str) -> Limits:
    """``8`` (node-wide), ``nvidia=2,amd=1`` (per kind) or both: ``8,nvidia=2``."""
    total: int | None = None
    per_kind: dict[str, int] = {}
    for item in (p.strip() for p in text.split(",") if p.strip()):
        kind, sep, value = item.rpartition("=")
        if not value.isdigit() or (sep and kind not in KINDS):
            raise ValueError(
                f"max instances {item!r} is not N or KIND=N with KIND one of "
                f"{', '.join(KINDS)} (example: 8,nvidia=2)"
            )
        if sep:
            per_kind[kind] = int(value)
        else:
            total = int(value)
    return Limits(total, per_kind)


def kinds_of(devices: Iterable[str]) -> frozenset[str]:
    return frozenset(d.partition(":")[0] for d in devices)


def node_denial(instances: Mapping[str, frozenset[str]], limits: Limits) -> str | None:
    """Why nothing more can start on this node (node-wide limit), or None."""
    cap = limits.max_instances
    if cap is None or len(instances) < cap:
        return None
    return (
        f"node limit maxInstances={cap} reached (running: {_names(sorted(instances))}): "
        f"remove a manifest or raise the limit ({FLAG_HELP})"
    )


def full_kinds(instances: Mapping[str, frozenset[str]], limits: Limits) -> dict[str, list[str]]:
    """Kinds at their limit -> the instances holding them."""
    out = {}
    for kind, cap in limits.per_kind.items():
        holders = sorted(n for n, kinds in instances.items() if kind in kinds)
        if len(holders) >= cap:
            out[kind] = holders
    return out


def kind_denial(wanted: str, full: Mapping[str, list[str]], limits: Limits) -> str | None:
    """Why an instance of a specific device kind cannot start, or None."""
    if wanted not in full:
        return None
    return (
        f"node limit maxInstances {wanted}={limits.per_kind[wanted]} reached "
        f"(held by {_names(full[wanted])}): remove a manifest or raise the limit ({FLAG_HELP})"
    )


def without_kinds(inventory: Inventory, kinds: Iterable[str]) -> Inventory:
    drop = set(kinds)
    return Inventory(tuple(d for d in inventory.devices if d.kind not in drop), inventory.source)


def only_kinds(inventory: Inventory, kinds: frozenset[str]) -> Inventory:
    """The inventory narrowed to ``kinds`` (all of it when ``kinds`` is empty)."""
    if not kinds:
        return inventory
    return Inventory(tuple(d for d in inventory.devices if d.kind in kinds), inventory.source)


def _names(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def room(
    *,
    count: int,
    kind: str,
    inventory: Inventory,
    instances: Mapping[str, frozenset[str]],
    limits: Limits,
) -> Inventory | str:
    """The inventory a new instance may be placed on, or why it may not start at all."""
    denied = node_denial(instances, limits)
    if denied or count == 0:
        return denied or inventory
    full = full_kinds(instances, limits)
    if kind != "any":
        return kind_denial(kind, full, limits) or inventory
    return without_kinds(inventory, full)


def explain(reason: str, inventory: Inventory, allowed: Inventory, limits: Limits) -> str:
    """A placement failure's reason, plus the kinds a per-kind limit took out of play."""
    dropped = sorted({d.kind for d in inventory.devices} - {d.kind for d in allowed.devices})
    if not dropped:
        return reason
    shown = ", ".join(f"{k}={limits.per_kind[k]}" for k in dropped)
    return f"{reason} (devices of kinds at their maxInstances limit are left out: {shown})"
