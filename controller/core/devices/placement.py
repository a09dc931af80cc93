"""Pure placement: pick devices and ports from what is free, or say why not.

A :class:`Ledger` is what is held right now (records, reservations, foreign
listeners); :func:`place` reads it and never mutates it; the planner calls
:meth:`Ledger.take` for each placement so one plan never hands a thing out twice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from controller.core.devices.inventory import KINDS, Device, Inventory
from controller.core.manifest.labels import matches, pairs
from controller.core.manifest.names import base_name
from controller.core.manifest.quantity import format_bytes
from controller.core.manifest.specs import DeploymentSpec, Entry
from controller.core.pulls import PullView
from controller.core.state import Observed, Record

DEFAULT_BASE_PORT = 8000
MAX_PORT = 65535
INTERNAL_BASE = 40000  # engines' internal ports (VLLM_PORT, TGI's master port...)
INTERNAL_BLOCK = 8


@dataclass(frozen=True, slots=True)
class Placed:
    devices: tuple[str, ...]
    port: int
    extra_ports: tuple[int, ...] = ()

    @property
    def ports(self) -> tuple[int, ...]:
        return (self.port, *self.extra_ports)


@dataclass(frozen=True, slots=True)
class Unplaced:
    reason: str
    field: str | None = None  # the spec field at fault when no pass can ever place it


@dataclass
class Ledger:
    # device key -> [(holder, shareable)]
    devices: dict[str, list[tuple[str, bool]]] = field(default_factory=dict)
    ports: dict[int, str] = field(default_factory=dict)  # port -> holder
    listening: frozenset[int] = frozenset()  # ports foreign processes listen on
    holders: Mapping[int, str] = field(default_factory=dict)  # ... who, where known
    # device key -> {holder: bytes}: the memory requests sharing it. A holder listed in
    # `devices` but not here leases the whole device (or all of its unified memory).
    memory: dict[str, dict[str, int]] = field(default_factory=dict)
    # base port -> first port not known taken: port scans stay linear in a big plan.
    _scan: dict[int, int] = field(default_factory=dict, repr=False, compare=False)
    # device key -> (bytes requested, shared only by requests): a big plan asks per device
    # per placement, so it is summed once and forgotten when the device's holders change.
    _sums: dict[str, tuple[int, bool]] = field(default_factory=dict, repr=False, compare=False)

    def take(
        self,
        holder: str,
        devices: Iterable[str],
        ports: Iterable[int],
        shareable: bool,
        memory: int | None = None,
    ) -> None:
        for key in devices:
            self._sums.pop(key, None)
            self.devices.setdefault(key, []).append((holder, shareable))
            if memory is not None:
                self.memory.setdefault(key, {})[holder] = memory
        for port in ports:
            self.ports[port] = holder

    def release(self, holder: str) -> None:
        """Forget what ``holder`` leases (a preemption being weighed or decided)."""
        for key in list(self.devices):
            kept = [h for h in self.devices[key] if h[0] != holder]
            if kept:
                self.devices[key] = kept
            else:
                del self.devices[key]
            self.memory.get(key, {}).pop(holder, None)
        self._sums.clear()
        self.ports = {p: h for p, h in self.ports.items() if h != holder}
        self._scan.clear()  # ports below a hint may be free again

    def without(self, holders: Iterable[str]) -> Ledger:
        """A copy as if ``holders`` had let go (what an OnDemand swap would free)."""
        out = self.copy()
        for holder in holders:
            out.release(holder)
        return out

    def copy(self) -> Ledger:
        return Ledger(
            devices={k: list(v) for k, v in self.devices.items()},
            ports=dict(self.ports),
            listening=self.listening,
            holders=self.holders,
            memory={k: dict(v) for k, v in self.memory.items()},
        )

    def free_for(self, key: str, shareable: bool) -> bool:
        holders = self.devices.get(key, [])
        # Invariant 1: stacking only when the holder and the newcomer are both shareable,
        # and never on a device whose memory is handed out by request.
        return not holders or (shareable and all(s for _, s in holders) and not self.sized(key))

    def held_by(self, key: str, deployment: str) -> bool:
        """A record of ``deployment`` (a replica, a ``@next``) holds the device."""
        return any(base_name(holder) == deployment for holder, _ in self.devices.get(key, []))

    def sized(self, key: str) -> dict[str, int]:
        return self.memory.get(key, {})

    def room(self, device: Device) -> int | None:
        """Bytes still free for memory requests; None when none may go there."""
        if device.memory is None:
            return None  # unknown size: no request can be checked against it
        used, shared = self._sum(device.key)
        # a whole or unified lease never shares (invariant 1)
        return device.memory - used if shared else None

    def _sum(self, key: str) -> tuple[int, bool]:
        if key not in self._sums:
            sized = self.sized(key)
            shared = all(h in sized for h, _ in self.devices.get(key, []))
            self._sums[key] = (sum(sized.values()), shared)
        return self._sums[key]

    def fits(self, device: Device, memory: int) -> bool:
        room = self.room(device)
        return room is not None and memory <= room

    def port_taken(self, port: int) -> str | None:
        if port in self.ports:
            return f"held by deployment {self.ports[port]}"
        if port in self.listening:
            held = self.holders.get(port)
            return f"in use by {held}" if held else "in use by another process"
        return None

    def first_free_port(self, start: int) -> int | None:
        port = max(start, self._scan.get(start, start))
        while port <= MAX_PORT and self.port_taken(port) is not None:
            port += 1
        self._scan[start] = port  # ports are only taken between releases
        return port if port <= MAX_PORT else None


def _matches(device: Device, candidates: tuple[str, ...] | None) -> bool:
    return candidates is None or device.id in candidates or device.key in candidates


def _selected(device: Device, selector: Mapping[str, str]) -> bool:
    """A cluster's device on a node the selector picks (a local device: the node's own
    labels chose the manifest before any plan)."""
    return device.node is None or matches(selector, dict(device.labels))


Selector = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Spread:
    """Which devices a placement would rather not take while others fit.

    ``sibling``: the deployment whose replicas this one keeps apart from, on devices and
    (a cluster's) nodes. ``selectors``: the plan's spec.nodeSelectors (of deployments
    asking for devices); a node that one picks among fewer than all of this placement's
    nodes is taken last, so a deployment with more choice leaves it room. ``near``: the
    nodes holding its pulled model files or its image (``near_of``), taken before others
    (but after those kept for a selector): elsewhere its launch pulls there first."""

    sibling: str | None = None
    selectors: frozenset[Selector] = frozenset()
    near: frozenset[str] = frozenset()


def near_of(
    entry: Entry, pulls: Mapping[str, PullView], images_on: Mapping[str, frozenset[str]]
) -> frozenset[str]:
    """The nodes holding what ``entry`` runs from (:attr:`Spread.near`): its source's
    files (``PullView.nodes``), its image (``Observed.images_on``)."""
    source = entry.deployment.spec.source
    view = pulls.get(source.key) if source is not None else None
    files = view.nodes if view is not None else frozenset()
    return files | images_on.get(entry.name, frozenset())


def bound_selectors(specs: Iterable[DeploymentSpec]) -> frozenset[Selector]:
    """The nodeSelectors of ``specs`` that ask for devices (:attr:`Spread.selectors`)."""
    return frozenset(
        tuple(sorted(s.node_selector.items())) for s in specs if s.node_selector and s.devices.count
    )


def _kept(usable: list[Device], selectors: frozenset[Selector]) -> set[str]:
    """The nodes of ``usable`` a selector picks some but not all of (one picking them all
    leaves this placement no other choice: it keeps nothing)."""
    labels = {d.node: dict(d.labels) for d in usable if d.node is not None}
    kept: set[str] = set()
    for selector in selectors:
        picked = {n for n, own in labels.items() if matches(dict(selector), own)}
        if len(picked) < len(labels):
            kept |= picked
    return kept


def _device_order(device: Device) -> tuple[int, int, str]:
    ident = int(device.id) if device.id.isdigit() else 1 << 30
    return (KINDS.index(device.kind), ident, device.id)


def place_devices(
    spec: DeploymentSpec, inventory: Inventory, ledger: Ledger, spread: Spread | None = None
) -> tuple[str, ...] | Unplaced:
    """``spread``: the devices (and nodes) taken last while others fit, see
    :class:`Spread` (replicas apart survive one device's or node's failure, and do not
    compete for one device's compute)."""
    want = spec.devices
    if want.count == 0:
        return ()
    kinds = KINDS if want.kind == "any" else (want.kind,)
    usable = sorted(
        (
            d
            for d in inventory.devices
            if d.kind in kinds and _matches(d, want.candidates) and _selected(d, spec.node_selector)
        ),
        key=_device_order,
    )
    if not usable and spec.node_selector:
        unselected = _unselected(spec, inventory, kinds)
        if unselected is not None:
            return Unplaced(unselected)
    rank = _node_rank(usable, ledger, spread or Spread())
    for kind in kinds:
        chosen = _choose_on_one_node([d for d in usable if d.kind == kind], spec, ledger, rank)
        if chosen is not None:
            return chosen
    too_few = _no_node_has(want.count, usable)
    if too_few is not None:
        return Unplaced(too_few, field="spec.devices.count")
    if want.memory is not None:
        return _no_memory(spec, usable, ledger, want.memory)
    return Unplaced(_no_capacity(spec, usable, ledger))


Rank = Callable[[Device], tuple[bool, bool, bool, bool]]


def _node_rank(usable: list[Device], ledger: Ledger, spread: Spread) -> Rank:
    """A device's place in the choice, lowest first: not a sibling's device, not on a
    node kept for a selector-bound deployment (``_kept``), on a node holding its files
    (``Spread.near``, when some does), not on a node a sibling runs on."""
    crowded = (
        {d.node for d in usable if d.node is not None and ledger.held_by(d.key, spread.sibling)}
        if spread.sibling is not None
        else set()
    )
    kept = _kept(usable, spread.selectors)

    def rank(d: Device) -> tuple[bool, bool, bool, bool]:
        sibling = spread.sibling is not None and ledger.held_by(d.key, spread.sibling)
        far = bool(spread.near) and d.node not in spread.near
        return (sibling, d.node in kept, far, d.node is not None and d.node in crowded)

    return rank


def _choose_on_one_node(
    devices: list[Device], spec: DeploymentSpec, ledger: Ledger, rank: Rank
) -> tuple[str, ...] | None:
    """:func:`_choose` within one node, the best ranked that has room: on a cluster's
    inventory (each device names its node) an engine's devices cannot span two
    machines. Ray would never place it: ``plan`` said "create" over two nodes."""
    per_node = {d.node: rank(d)[1:] for d in devices if d.node is not None}
    nodes = sorted(per_node, key=lambda node: (per_node[node], node))
    if spec.devices.count <= 1 or not nodes:
        return _choose(devices, spec, ledger, rank)
    for node in nodes:
        chosen = _choose([d for d in devices if d.node == node], spec, ledger, rank)
        if chosen is not None:
            return chosen
    return None


def _unselected(spec: DeploymentSpec, inventory: Inventory, kinds: Sequence[str]) -> str | None:
    """Why a cluster has devices of the kinds asked for, but on no node the selector
    picks (None: no cluster's devices of those kinds), with what those nodes carry of the
    selector's keys."""
    keys = set(spec.node_selector)
    nodes = {
        d.node: pairs({k: v for k, v in d.labels if k in keys}) or "none"
        for d in inventory.devices
        if d.node is not None and d.kind in kinds
    }
    if not nodes:
        return None
    kind = "" if spec.devices.kind == "any" else f"{spec.devices.kind} "
    carried = ", ".join(f"{labels} ({n})" for labels, n in sorted(Counter(nodes.values()).items()))
    return (
        f"no node with {kind}devices matches nodeSelector {pairs(spec.node_selector)}; "
        f"theirs: {carried}: label one, or change spec.nodeSelector"
    )


def _no_node_has(count: int, usable: list[Device]) -> str | None:
    """Why a cluster's request can never be placed: no one node has ``count`` devices
    (freeing others cannot help). None: some node has, or the devices name no node."""
    per_node = Counter(d.node for d in usable if d.node is not None)
    if not per_node or max(per_node.values()) >= count:
        return None
    node, most = max(per_node.items(), key=lambda item: (item[1], item[0]))
    return (
        f"no node has {count} devices: an engine's devices are on one node, and the most "
        f"one has is {most} (node {node}): lower spec.devices.count, or add a node with "
        f"{count} GPUs"
    )


def _choose(
    devices: list[Device], spec: DeploymentSpec, ledger: Ledger, rank: Rank
) -> tuple[str, ...] | None:
    """``count`` devices of one kind for the spec, by rank then device order, or None.

    Devices a sibling replica holds come last, so replicas share one only when no
    other fits (a shareable or memory-packed lease could stack on it).
    """
    want = spec.devices
    if want.memory is None:
        free = [d for d in devices if ledger.free_for(d.key, want.shareable)]
        free.sort(key=lambda d: (rank(d), _device_order(d)))
    else:
        fitting = [d for d in devices if ledger.fits(d, want.memory)]
        # Best fit: the tightest devices first, so empty devices and big gaps stay for
        # whole leases and large requests (first fit strands room on every card).
        free = sorted(fitting, key=lambda d: (rank(d), ledger.room(d), _device_order(d)))
    if len(free) < want.count:
        return None
    return tuple(d.key for d in sorted(free[: want.count], key=_device_order))


def _no_memory(spec: DeploymentSpec, usable: list[Device], ledger: Ledger, memory: int) -> Unplaced:
    """Why a memory request fits nowhere: unknown sizes, too big for any device, or full."""
    want = spec.devices
    kind = "" if want.kind == "any" else f"{want.kind} "
    need = f"needs {format_bytes(memory)} on each of {want.count} {kind}device(s)"
    known = [d for d in usable if d.memory is not None]
    unknown = [d.key for d in usable if d.memory is None]
    declare = (
        f"; {', '.join(unknown[:3])} ha{'s' if len(unknown) == 1 else 've'} no declared memory "
        f"and take{'s' if len(unknown) == 1 else ''} no memory request: declare it "
        f"(--devices {unknown[0]}=80Gi)"
        if unknown
        else ""
    )
    if _most_of_one_kind(usable) < want.count:  # too few at all: their memory is not it
        return Unplaced(_no_capacity(spec, usable, ledger))
    big = [d for d in known if d.memory is not None and d.memory >= memory]
    if len(big) < want.count:
        largest = max(known, key=lambda d: d.memory or 0, default=None)
        most = f"the largest has {largest.describe_memory()} ({largest.key})" if largest else ""
        return Unplaced(
            f"spec.devices.memory {format_bytes(memory)} is more than the node's devices "
            f"have: {need}, {most or 'none has a declared memory'}{declare}: "
            "lower spec.devices.memory or devices.count",
            field="spec.devices.memory",
        )
    return Unplaced(f"no capacity: {need}, {_most_room(big, ledger)}{declare}: {_MOVES}")


_MOVES = "remove a manifest, lower spec.devices.memory, or raise spec.priority"


def _most_room(devices: list[Device], ledger: Ledger) -> str:
    """The roomiest device and a few holders: bounded text, whatever the node's size."""
    rooms = [(ledger.room(d), d) for d in devices]
    shared = [(r, d) for r, d in rooms if r is not None]
    best = max(shared, key=lambda rd: rd[0], default=None)
    most = f"most free is {format_bytes(best[0])} on {best[1].key}" if best else "none is shared"
    holders: list[str] = []
    for d in devices:
        for holder, _ in ledger.devices.get(d.key, []):
            if holder not in holders:
                holders.append(holder)
        if len(holders) > 5:
            break
    shown = ", ".join(holders[:5]) + (" and others" if len(holders) > 5 else "")
    return f"{most} — held by {shown or 'nobody'}"


def _most_of_one_kind(usable: list[Device]) -> int:
    """The most devices one lease could take: all of one kind (``kind: any`` picks one)."""
    return max(Counter(d.kind for d in usable).values(), default=0)


def _no_capacity(spec: DeploymentSpec, usable: list[Device], ledger: Ledger) -> str:
    want = spec.devices
    kind = "" if want.kind == "any" else f"{want.kind} "
    plural = "device" if want.count == 1 else "devices"
    free = sum(1 for d in usable if ledger.free_for(d.key, want.shareable))
    if not usable:
        where = f" among candidates {_listed(want.candidates)}" if want.candidates else ""
        return (
            f"needs {want.count} {kind}{plural}, the node has none{where}: "
            "check --devices / RECONCILE_DEVICES or lower devices.count"
        )
    most = _most_of_one_kind(usable)
    if most < want.count:  # never placeable here, whoever leaves
        where = f" among candidates {_listed(want.candidates)}" if want.candidates else ""
        has = f"only {len(usable)}"
        if most < len(usable):  # kind: any, and one lease is of one kind
            kinds = Counter(d.kind for d in usable)
            has = f"at most {most} of one kind ({', '.join(f'{k}: {n}' for k, n in kinds.items())})"
        return (
            f"needs {want.count} {kind}{plural}, {free} free — the node has {has}{where}: "
            "lower devices.count or add devices (--devices / RECONCILE_DEVICES)"
        )
    holders: dict[str, list[str]] = {}
    for d in usable:
        for holder, _ in ledger.devices.get(d.key, []):
            holders.setdefault(holder, []).append(d.key)
    held = "; ".join(f"{h} [{','.join(keys)}]" for h, keys in sorted(holders.items()))
    # Free devices beside the candidates would read as "0 free" of the whole node.
    where = f" of candidates {_listed(want.candidates)}" if want.candidates else ""
    where += _absent(want.candidates, usable)
    if spec.node_selector and any(d.node is not None for d in usable):
        where += f" on the nodes matching nodeSelector {pairs(spec.node_selector)}"
    way_out = "widen devices.candidates, " if want.candidates else ""
    return (
        f"no capacity: needs {want.count} {kind}{plural}, {free} free{where} — held by "
        f"{held or 'nobody'}: {way_out}{_moves(spec)}"
    )


def _absent(candidates: Sequence[str] | None, usable: list[Device]) -> str:
    """The candidates the inventory lacks, in words: a GPU taken out of --devices (or
    gone from discovery) while the manifest still names it reads as one held otherwise."""
    known = {name for d in usable for name in (d.id, d.key)}
    absent = [c for c in candidates or () if c not in known]
    return f" ({', '.join(absent)} not in the inventory)" if absent else ""


def _listed(ids: Sequence[str]) -> str:
    """Ids as the manifest's flow list shows them (``[0, 1]``), not Python's ``['0', '1']``."""
    return f"[{', '.join(ids)}]"


def _moves(spec: DeploymentSpec) -> str:
    """The ways out; a replicated deployment's include fewer replicas (its own may hold
    the rest)."""
    fewer = "autoscale.max" if spec.autoscale is not None else "spec.replicas"
    if spec.autoscale is None and spec.replicas <= 1:
        return "remove a manifest or lower devices.count"
    return f"remove a manifest, lower devices.count or {fewer}"


def place_ports(spec: DeploymentSpec, extra: int, ledger: Ledger) -> tuple[int, ...] | Unplaced:
    """The API port (exact, or scanning up from basePort), then ``extra`` internal ports."""
    if spec.port is not None:
        why = ledger.port_taken(spec.port)
        if why:
            return Unplaced(f"port {spec.port} is {why}: free it or choose another port")
        main = spec.port
    else:
        start = spec.base_port or DEFAULT_BASE_PORT
        found = ledger.first_free_port(start)
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
    spec: DeploymentSpec,
    inventory: Inventory,
    ledger: Ledger,
    extra_ports: int = 0,
    *,
    spread: Spread | None = None,
) -> Placed | Unplaced:
    """Devices and ports for ``spec``; ``spread``: see :func:`place_devices`."""
    devices = place_devices(spec, inventory, ledger, spread)
    if isinstance(devices, Unplaced):
        return devices
    ports = place_ports(spec, extra_ports, ledger)
    if isinstance(ports, Unplaced):
        return ports
    return Placed(devices, ports[0], ports[1:])


def ledger_for(records: Iterable[Record], observed: Observed) -> Ledger:
    """The one ledger: what live records hold, unreadable records, foreign listeners,
    Unhealthy devices.

    Records of another node hold that node's devices and ports, not ours: skipped.
    """
    ledger = Ledger(listening=observed.listening, holders=observed.port_holders)
    for rec in records:
        if rec.holds and not rec.elsewhere(observed.node):
            ledger.take(rec.name, rec.devices, rec.ports, rec.shareable, rec.memory)
    for key, holder in observed.foreign_devices.items():
        ledger.take(holder, (key,), (), False)
    for port, holder in observed.foreign_ports.items():
        ledger.take(holder, (), (port,), False)
    for key, fault in observed.unhealthy.items():  # a whole lease no one can preempt
        ledger.take(f"Unhealthy ({fault.reason})", (key,), (), False)
    return ledger
