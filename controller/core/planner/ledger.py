"""The planning ledger: what this plan has handed out, and the one way to hand out more.

It starts from what the node holds (:func:`placement.ledger_for`) and what counts
against maxInstances; each :meth:`PlanLedger.start` that succeeds takes its devices
and ports at once, so one plan never hands a thing out twice. Questions about what
*would* fit if some deployments left are asked of copies; the ledger itself changes
only by a start, or by a preemption's start (which releases its victims with it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from controller.core.actions import Hold, Start
from controller.core.devicefaults import Measured
from controller.core.devices import capacity as limits
from controller.core.devices.inventory import Inventory
from controller.core.devices.placement import (
    Ledger,
    Placed,
    Selector,
    Spread,
    Unplaced,
    bound_selectors,
    ledger_for,
    near_of,
    place,
    place_devices,
)
from controller.core.devices.victims import Victim, choose_victims
from controller.core.engines.share import user_share
from controller.core.manifest.names import in_repo
from controller.core.manifest.quantity import format_bytes
from controller.core.manifest.specs import DeploymentSpec, Entry
from controller.core.planner.context import Context
from controller.core.planner.turns import starting_on, turn_taken


# Measured memory: ``devices.memory: auto`` resolved from the engine's last measured peak.
#
# On NVML hosts each pass records the peak GPU memory an engine's processes used, per
# spec hash and device (``store/side/measured.py``). A spec that says ``memory: auto`` leases
# whole devices until there is a measurement, then the peak plus 10%: estimates (weights,
# KV cache, CUDA graphs) are what every estimator gets wrong, the engine's own use is not.
def with_headroom(peak: int) -> int:
    """The peak + 10%, rounded up (never below)."""
    return peak + (peak + 9) // 10


def resolve(entry: Entry, measured: Mapping[str, Measured]) -> tuple[Entry, str]:
    """``entry`` with an ``auto`` memory request resolved, and what to say about it
    (the Start's reason); any other entry unchanged, with nothing to say."""
    devices = entry.deployment.spec.devices
    found = measured.get(entry.hash)
    if not devices.memory_auto:
        if found is None or devices.count == 0:
            return entry, ""
        asked = "whole devices" if devices.memory is None else format_bytes(devices.memory)
        return entry, f" (memory {asked} requested, measured {format_bytes(found.peak)})"
    if found is None:
        return entry, " (memory auto: not measured yet, whole devices)"
    lease = with_headroom(found.peak)
    spec = entry.deployment.spec
    resolved = spec.model_copy(update={"devices": devices.model_copy(update={"memory": lease})})
    deployment = entry.deployment.model_copy(update={"spec": resolved})
    note = f" (memory auto: measured {format_bytes(found.peak)} + 10% = {format_bytes(lease)})"
    return dataclasses.replace(entry, deployment=deployment), note


def selectors_of(ctx: Context) -> frozenset[Selector]:
    """The nodeSelectors of ``ctx``'s deployments that ask for devices."""
    return bound_selectors(e.deployment.spec for e in ctx.desired.entries.values())


class PlanLedger:
    def __init__(
        self,
        ctx: Context,
        held: Ledger,
        instances: dict[str, frozenset[str]],
        starting: dict[str, str] | None = None,
        selectors: frozenset[Selector] | None = None,
    ) -> None:
        self._ctx = ctx
        # A cluster's nodes that selector-bound deployments may use go to others last.
        self._selectors = selectors if selectors is not None else selectors_of(ctx)
        self._held = held
        self._instances = instances  # what counts against maxInstances: name -> device kinds
        # device -> the memory-packed record starting on it (planner/turns.py)
        self._starting = starting if starting is not None else starting_on(ctx.observed)
        self.waiting_turn: set[str] = set()  # held only because another starts first

    @classmethod
    def of(cls, ctx: Context) -> PlanLedger:
        observed = ctx.observed
        records = [v.record for v in observed.records.values()]
        instances = {
            rec.name: limits.kinds_of(rec.devices)
            for rec in records
            if rec.holds and not rec.elsewhere(observed.node)
        }
        return cls(ctx, ledger_for(records, observed), instances)

    def start(
        self, entry: Entry, why: str, *, record: str | None = None, in_turn: bool = False
    ) -> Start | Hold:
        """Start ``entry`` as record ``record`` (default: its own name), or Hold saying why.

        A Start takes its devices and ports in this ledger; a Hold takes nothing. Replicas
        of one deployment are placed apart while the node allows (``spread``). ``in_turn``:
        a memory-packed start waits while another starts on its device (``waiting_turn``).
        """
        name = record or entry.name
        if self._ctx.drain is not None:
            return Hold(name=name, reason=self._ctx.drain_text(), entry=entry)
        entry, measured = resolve(entry, self._ctx.observed.measured)  # memory: auto
        spec = entry.deployment.spec
        room = self.room(spec)
        if isinstance(room, str):
            return Hold(name=name, reason=room, entry=entry)
        extra = self._ctx.extra_ports.get(spec.engine, 0)
        seen = self._ctx.observed
        near = near_of(entry, seen.pulls, seen.images_on)  # its files', its image's nodes
        spread = Spread(entry.name, self._selectors, near)
        placed = place(spec, room, self._held, extra, spread=spread)
        if isinstance(placed, Unplaced):
            return Hold(name=name, reason=self._unplaced(entry, placed, room), entry=entry)
        memory = spec.devices.memory
        wait = turn_taken(self._starting, placed.devices, name) if memory else None
        if in_turn and wait is not None:
            self.waiting_turn.add(name)
            return Hold(name=name, reason=wait, entry=entry)
        if memory is not None:
            for device in placed.devices:
                self._starting.setdefault(device, name)
        self._held.take(
            name, placed.devices, placed.ports, spec.devices.shareable, spec.devices.memory
        )
        self._instances[name] = limits.kinds_of(placed.devices)
        return self._started(entry, why + measured, name, placed)

    def starting_too(self, names: Iterable[str]) -> None:
        """Records this plan restarts start on their devices too (a packed start waits)."""
        for name in names:
            view = self._ctx.observed.records.get(name)
            if view is not None and view.record.memory is not None:
                for device in view.record.devices:
                    self._starting.setdefault(device, name)

    def start_instead_of(
        self, entry: Entry, why: str, victims: Sequence[str], *, record: str | None = None
    ) -> Start | Hold:
        """Start ``entry`` as ``record`` in the room ``victims`` leave; the ledger changes
        only on a Start. A memory-packed start waits its turn here too (a Hold that stops
        nobody: the victims run on until the device's other start is Ready)."""
        trial = self._without(victims)
        outcome = trial.start(entry, why, record=record, in_turn=True)
        self.waiting_turn |= trial.waiting_turn
        if isinstance(outcome, Start):
            self._held, self._instances = trial._held, trial._instances
            self._starting = trial._starting
        return outcome

    def room(self, spec: DeploymentSpec) -> Inventory | str:
        """The devices ``spec`` may use under the node's limits, or why none."""
        return limits.room(
            count=spec.devices.count,
            kind=spec.devices.kind,
            inventory=self._ctx.inventory,
            instances=self._instances,
            limits=self._ctx.limits,
        )

    def places_without(self, spec: DeploymentSpec, gone: Iterable[str]) -> bool:
        """``spec`` (devices and ports) fits once ``gone`` let go, within the node's limits."""
        trial = self._without(gone)
        room = trial.room(spec)
        extra = self._ctx.extra_ports.get(spec.engine, 0)
        return not isinstance(room, str) and isinstance(
            place(spec, room, trial._held, extra), Placed
        )

    def fits_without(self, spec: DeploymentSpec, gone: Iterable[str]) -> bool:
        """``spec``'s devices are free once ``gone`` let go, within the node's limits
        (maxInstances counts as devices do: Kubernetes preempts for a node's pod count
        too). Ports are not asked: stopping an engine is no way to free a port for another."""
        trial = self._without(gone)
        room = trial.room(spec)
        return not isinstance(room, str) and not isinstance(
            place_devices(spec, room, trial._held), Unplaced
        )

    def victims(self, spec: DeploymentSpec, candidates: Sequence[Victim]) -> tuple[str, ...] | None:
        """The fewest, cheapest ``candidates`` whose leaving lets ``spec`` fit."""
        return choose_victims(spec.priority, candidates, lambda gone: self.fits_without(spec, gone))

    def _without(self, names: Iterable[str]) -> PlanLedger:
        gone = set(names)
        kept = {n: kinds for n, kinds in self._instances.items() if n not in gone}
        starting = {d: n for d, n in self._starting.items() if n not in gone}  # victims: turn over
        return PlanLedger(self._ctx, self._held.without(gone), kept, starting, self._selectors)

    def _unplaced(self, entry: Entry, placed: Unplaced, room: Inventory) -> str:
        reason = limits.explain(placed.reason, self._ctx.inventory, room, self._ctx.limits)
        if placed.field is not None:  # no pass can place it: point at the manifest
            line = entry.line_at(placed.field.split("."))
            reason = f"{in_repo(self._ctx.desired.repo, entry.source)}:{line}: {reason}"
        return reason

    def _started(self, entry: Entry, why: str, name: str, placed: Placed) -> Start:
        where = ",".join(placed.devices) or "no devices"
        keyed = self._ctx.inventory.by_key()
        spec = entry.deployment.spec
        note = user_share(spec, tuple(keyed[d] for d in placed.devices if d in keyed))
        return Start(
            name=name,
            reason=f"{why}: {where}, port {placed.port}{note}",
            entry=entry,
            devices=placed.devices,
            port=placed.port,
            extra_ports=placed.extra_ports,
        )
