"""Pure placement: pick devices and ports from what is free, or say why not.

A :class:`Ledger` is what is held right now (records, reservations, foreign
listeners); :func:`place` reads it and never mutates it; the planner calls
:meth:`Ledger.take` for each placement so one plan never hands a thing out twice.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from controller.core.inventory import KINDS, Device, Inventory
from controller.core.specs import DeploymentSpec
from controller.core.state import Observed, Record

DEFAULT_BASE_PORT = 8000
MAX_PORT = 65535
INTERNAL_BASE = 40000  # engines' internal ports (VLLM_PORT, TGI's master port...)
INTERNAL_BLOCK = 8


@dataclass(frozen=True)
class Placed:
    devices: tuple[str, ...]
    port: int
    extra_ports: tuple[int, ...] = ()

    @property
    def ports(self) -> tuple[int, ...]:
        return (self.port, *self.extra_ports)


@dataclass(frozen=True)
class Unplaced:
    reason: str


@dataclass
class Ledger:
    # device key -> [(holder, shareable)]
    devices: dict[str, list[tuple[str, bool]]] = field(default_factory=dict)
    ports: dict[int, str] = field(default_factory=dict)  # port -> holder
    listening: frozenset[int] = frozenset()  # ports foreign processes listen on

    def take(
        self, holder: str, devices: Iterable[str], ports: Iterable[int], shareable: bool
    ) -> None:
        for key in devices:
            self.devices.setdefault(key, []).append((holder, shareable))
        for port in ports:
            self.ports[port] = holder

    def without(self, holders: Iterable[str]) -> Ledger:
        """A copy as if ``holders`` had let go (what a swap would free)."""
        gone = set(holders)
        return Ledger(
            devices={k: [h for h in v if h[0] not in gone] for k, v in self.devices.items()},
            ports={p: h for p, h in self.ports.items() if h not in gone},
            listening=self.listening,
        )

    def free_for(self, key: str, shareable: bool) -> bool:
        holders = self.devices.get(key, [])
        # Invariant 1: stacking only when the holder and the newcomer are both shareable.
        return not holders or (shareable and all(s for _, s in holders))

    def port_taken(self, port: int) -> str | None:
        if port in self.ports:
            return f"held by deployment {self.ports[port]}"
        if port in self.listening:
            return "in use by another process"
        return None


def _matches(device: Device, candidates: tuple[str, ...] | None) -> bool:
    return candidates is None or device.id in candidates or device.key in candidates


def _device_order(device: Device) -> tuple[int, int, str]:
    ident = int(device.id) if device.id.isdigit() else 1 << 30
    return (KINDS.index(device.kind), ident, device.id)


def place_devices(
    spec: DeploymentSpec, inventory: Inventory, ledger: Ledger
) -> tuple[str, ...] | Unplaced:
    want = spec.devices
    if want.count == 0:
        return ()
    kinds = KINDS if want.kind == "any" else (want.kind,)
    usable = sorted(
        (d for d in inventory.devices if d.kind in kinds and _matches(d, want.candidates)),
        key=_device_order,
    )
    for kind in kinds:
        free = [d.key for d in usable if d.kind == kind and ledger.free_for(d.key, want.shareable)]
        if len(free) >= want.count:
            return tuple(free[: want.count])
    return Unplaced(_no_capacity(spec, usable, ledger))


def _no_capacity(spec: DeploymentSpec, usable: list[Device], ledger: Ledger) -> str:
    want = spec.devices
    kind = "" if want.kind == "any" else f"{want.kind} "
    plural = "device" if want.count == 1 else "devices"
    free = sum(1 for d in usable if ledger.free_for(d.key, want.shareable))
    if not usable:
        where = f" among candidates {list(want.candidates)}" if want.candidates else ""
        return (
            f"needs {want.count} {kind}{plural}, the node has none{where}: "
            "check --devices / RECONCILE_DEVICES or lower devices.count"
        )
    if len(usable) < want.count:  # never placeable here, whoever leaves
        where = f" among candidates {list(want.candidates)}" if want.candidates else ""
        return (
            f"needs {want.count} {kind}{plural}, {free} free — the node has only "
            f"{len(usable)}{where}: "
            "lower devices.count or add devices (--devices / RECONCILE_DEVICES)"
        )
    holders: dict[str, list[str]] = {}
    for d in usable:
        for holder, _ in ledger.devices.get(d.key, []):
            holders.setdefault(holder, []).append(d.key)
    held = "; ".join(f"{h} [{','.join(keys)}]" for h, keys in sorted(holders.items()))
    return (
        f"no capacity: needs {want.count} {kind}{plural}, {free} free — held by {held}: "
        "remove a manifest or lower devices.count"
    )


def place_ports(spec: DeploymentSpec, extra: int, ledger: Ledger) -> tuple[int, ...] | Unplaced:
    """The API port (exact, or scanning up from basePort), then ``extra`` internal ports."""
    if spec.port is not None:
        why = ledger.port_taken(spec.port)
        if why:
            return Unplaced(f"port {spec.port} is {why}: free it or choose another port")
        main = spec.port
    else:
        start = spec.base_port or DEFAULT_BASE_PORT
        found = next((p for p in range(start, MAX_PORT + 1) if ledger.port_taken(p) is None), None)
        if found is None:
            return Unplaced(
                f"no free port from {start} to {MAX_PORT}: "
                "stop what holds them or set a lower basePort"
            )
        main = found
    internal = _internal_ports(extra, ledger)
    if isinstance(internal, Unplaced):
        return internal
    return (main, *internal)


def _internal_ports(extra: int, ledger: Ledger) -> tuple[int, ...] | Unplaced:
    """Engines' internal ports, one aligned block each, away from the API ports.

    Engines scan upward from the port they are given when it is busy (vLLM's
    VLLM_PORT does), so each gets the first port of a free block of INTERNAL_BLOCK
    and the whole block is kept clear of foreign listeners and other instances.
    """
    chosen: list[int] = []
    for first in range(INTERNAL_BASE, MAX_PORT - INTERNAL_BLOCK + 2, INTERNAL_BLOCK):
        if len(chosen) == extra:
            break
        block = range(first, first + INTERNAL_BLOCK)
        if all(ledger.port_taken(p) is None for p in block):
            chosen.append(first)
    if len(chosen) < extra:
        return Unplaced(f"no free internal port block from {INTERNAL_BASE} to {MAX_PORT}")
    return tuple(chosen)


def place(
    spec: DeploymentSpec, inventory: Inventory, ledger: Ledger, extra_ports: int = 0
) -> Placed | Unplaced:
    devices = place_devices(spec, inventory, ledger)
    if isinstance(devices, Unplaced):
        return devices
    ports = place_ports(spec, extra_ports, ledger)
    if isinstance(ports, Unplaced):
        return ports
    return Placed(devices, ports[0], ports[1:])


def ledger_for(records: Iterable[Record], observed: Observed) -> Ledger:
    """The one ledger: what live records hold, unreadable records, foreign listeners.

    Records of another node hold that node's devices and ports, not ours: skipped.
    """
    ledger = Ledger(listening=observed.listening)
    for rec in records:
        if rec.holds and not rec.elsewhere(observed.node):
            ledger.take(rec.name, rec.devices, rec.ports, rec.shareable)
    for key, holder in observed.foreign_devices.items():
        ledger.take(holder, (key,), (), False)
    for port, holder in observed.foreign_ports.items():
        ledger.take(holder, (), (port,), False)
    return ledger
