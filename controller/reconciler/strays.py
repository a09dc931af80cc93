"""Engines that no readable record accounts for: orphans whose record was torn.

A record torn (or quarantined by a pass) after its engine started leaves that engine
running with no record. Its ``RECONCILE_INSTANCE`` marker names the instance and its set
(an older version's names no set), so a pass need not guess: this set's pass gives it its
record back (:meth:`Adopter.rebuild`), another set's pass leaves it running with what it
holds held (:func:`spare_others`), and a whole set's `down` reaps this set's that nothing
declares (:meth:`Adopter.reap_own`). The rest the planner reaps as orphans.

An engine found by its spawn note, not its marker (``MarkedProcess.noted``: this user
may not read its environment) is never reaped: a note proves no process ours to signal.
This set's whose record is lost, torn or not, is adopted where its manifest declares it
and no record holds its name (else a second engine of it would start); the rest are
spared as another set's are, what they hold held and their name said taken.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from controller.backends.base import Backend
from controller.core.actions import Reap
from controller.core.devices.inventory import Inventory
from controller.core.devices.placement import Ledger, ledger_for
from controller.core.engines import RecipeError
from controller.core.manifest import backendnames
from controller.core.manifest.specs import Entry
from controller.core.plan import Desired, leader_of
from controller.core.state import MarkedProcess, Observed, ProcessRef, RecordView
from controller.host import procscan
from controller.logsetup import get_logger
from controller.reconciler.executor import Executor
from controller.reconciler.leases import Found, RecordMaker, conflict, found_in
from controller.store.instances.records import RecordProblem, RecordStore
from controller.store.lock import FileLock

log = get_logger("reconcile")

# Why an engine found by its spawn note has its record back, and what that record may not do.
NOTED = (
    "its record is lost; its spawn note names this instance (pid and start time), and this "
    "user may not read its environment: adopted, it is stopped only once proven ours"
)
REBUILT = (
    "record rebuilt from its engine's spawn note (the old one was lost): this user may not "
    "read the engine's environment, so only its own user, or root, may stop it"
)


def environ_of(marked: MarkedProcess) -> bytes:
    """Its environment as read now, or as its spawn note kept it where none can be read."""
    return marked.noted if marked.noted is not None else procscan.environ(marked.ref.pid) or b""


def named_by(engine: MarkedProcess) -> str:
    """What named ``engine`` this instance's, to a pass that adopted it, in words."""
    if engine.noted is None:
        return "its marker"
    return "its spawn note (this user may not read its environment)"


def by_instance(orphans: Iterable[MarkedProcess]) -> dict[str, list[MarkedProcess]]:
    """The orphan processes grouped by their marker's nonce: one engine's each."""
    out: dict[str, list[MarkedProcess]] = {}
    for marked in orphans:
        out.setdefault(marked.nonce, []).append(marked)
    return out


# -- another set's engines --------------------------------------------------------------


def spare_others(
    desired: Desired, observed: Observed, *, owner: str, store: RecordStore, inventory: Inventory
) -> Observed:
    """Leave running each orphan of another set whose record was torn after it started:
    records are shared by sets, so its own set's pass adopts it (or its `down` stops it).
    What its environment says it holds stays held meanwhile, and a name this set declares
    too is a conflict, not a second engine of that name. `plan` shows what a pass would
    do: it spares them too. An orphan found by its spawn note that no pass adopted is
    spared as well (never reaped: no note makes a process ours to signal). Only this
    node's processes (a local backend) are looked at."""
    wanted = desired.instances()
    devices, ports = dict(observed.foreign_devices), dict(observed.foreign_ports)
    spared: dict[str, str] = dict(observed.spared)
    reaped: list[MarkedProcess] = []
    for procs in by_instance(observed.orphans).values():
        leader = leader_of(procs)
        kept = _kept(leader, wanted, owner, store, inventory) if leader else None
        if leader is None or kept is None:
            reaped += [p for p in procs if p.noted is None]  # no note makes a process ours
            continue
        found, holder, taken = kept
        if found is not None:
            devices.update(dict.fromkeys(found.devices, holder))
            ports[found.port] = holder
        spared[leader.name] = taken
    return replace(observed, orphans=tuple(reaped), foreign_devices=devices,
                   foreign_ports=ports, spared=spared)  # fmt: skip


def _kept(
    leader: MarkedProcess,
    wanted: Mapping[str, Entry],
    owner: str,
    store: RecordStore,
    inventory: Inventory,
) -> tuple[Found | None, str, str] | None:
    """A spared orphan's holdings (None: unknown), who holds them and who holds its name,
    in words; None: it is reaped. One found by its spawn note is spared whatever else."""
    if leader.noted is not None:
        found = found_in(leader.ref, leader.noted, inventory)
        said = _unproven(leader, found)
        return (found if isinstance(found, Found) else None), said, said
    another = _anothers(leader, wanted, owner, store, inventory)
    if not isinstance(another, Found):
        return None
    holder = _holder(leader)
    return another, holder, f"another manifest set's engine, {holder}"


def _anothers(
    leader: MarkedProcess,
    wanted: Mapping[str, Entry],
    owner: str,
    store: RecordStore,
    inventory: Inventory,
) -> Found | str | None:
    """What the torn record's engine ``leader`` holds, if it is another set's (None: this
    set's, or no torn record's). Its marker names its set; an older version's names none,
    and is taken for another's where this set does not declare its name."""
    if leader.owner == owner or (leader.owner is None and leader.name in wanted):
        return None
    since = store.torn_since(leader.name)  # plan peeks: the record lies torn
    if since is None or since < leader.ref.start_time:
        return None
    return found_in(leader.ref, environ_of(leader), inventory)


def _unproven(leader: MarkedProcess, found: Found | str) -> str:
    """Who holds what an engine found by its spawn note holds, and the next move."""
    pid = leader.ref.pid
    why = f" ({found})" if isinstance(found, str) else ""
    return (
        f"engine pid {pid} of instance {leader.nonce}{why}, whose record is lost: its spawn "
        "note names it, but this user may not read its environment, so it is not adopted "
        f"here, nor stopped. End pid {pid} by hand, or run reconcile as root"
    )


def _holder(leader: MarkedProcess) -> str:
    """Who holds what a spared engine holds, as the Pending and conflict messages say it."""
    pid, name = leader.ref.pid, leader.name
    if leader.owner is None:  # an older version's engine: its set is a guess
        return f"{name} (pid {pid}: its record is torn, another set's?)"
    return f"{name} (pid {pid} of manifest set {leader.owner}: its record is torn)"


# -- what no pass here may adopt or stop, told to a person ---------------------------------


@dataclass(frozen=True, slots=True)
class Unproven:
    """An engine found by its spawn note alone whose name no manifest here declares: no
    pass adopts it (nothing declares it) and none stops it (a note proves no process
    ours), so what it holds stays held until a person ends it. :func:`unproven`."""

    name: str
    pid: int
    held: str  # what it holds, in words
    note: Path  # its spawn note

    def words(self) -> str:
        """What holds what, why reconcile leaves it, and the next move."""
        pid = self.pid
        return (
            f"engine pid {pid} holds {self.held} with no record and no manifest: its "
            f"spawn note {self.note} names it instance {self.name}, but this user may not "
            "read its environment, so reconcile cannot prove it its own, and neither adopts "
            f"nor stops it. Check what runs as pid {pid} (`ps -o user,args -p {pid}`), then "
            f"end it as its user or root (`kill {pid}`), or run reconcile as root, which "
            "reads its marker"
        )


def unproven(
    desired: Desired, observed: Observed, *, owner: str, inventory: Inventory, notes: Path
) -> list[Unproven]:
    """This set's engines found by their spawn note (in ``notes``) whose name ``desired``
    does not declare: their port and devices held silently else (a declared name's
    conflict says who holds it; these have no name here to say it under but their own).
    Another set's are its own pass's to adopt, or to say."""
    wanted = desired.instances()
    out: list[Unproven] = []
    for procs in by_instance(observed.orphans).values():
        leader = leader_of(procs)
        if leader is None or leader.noted is None or leader.name in wanted:
            continue
        if leader.owner not in (None, owner):
            continue
        found = found_in(leader.ref, leader.noted, inventory)
        out.append(Unproven(leader.name, leader.ref.pid, _held(found),
                            notes / f"{leader.nonce}.json"))  # fmt: skip
    return out


def _held(found: Found | str) -> str:
    if isinstance(found, str):
        return f"what its note cannot tell ({found})"
    devices = f" and devices {', '.join(found.devices)}" if found.devices else ""
    return f"port {found.port}{devices}"


# -- what a torn record's engine holds, for a reader ---------------------------------------


@dataclass(frozen=True, slots=True)
class TornHeld:
    """What the engines of records torn where they lie, or lost, hold, as `devices` shows
    them."""

    devices: dict[str, str]  # device -> its holder, in words
    ports: dict[int, str]  # port -> its holder
    unknown: list[str]  # the torn record files whose engine's holdings cannot be told


def held_by_torn(
    problems: Iterable[RecordProblem],
    backend: Backend | None,
    inventory: Inventory,
    *,
    recorded: Collection[str],
) -> TornHeld:
    """What each engine of a torn record (a reader's ``peek`` leaves it in place) holds,
    told by its marker and environment as the pass that adopts it tells it: a /proc
    scan, nothing written, nothing signalled. ``backend``: None where its engines are
    not this host's processes; then, or where an engine's environment cannot be read,
    what it holds is not known and its file is named in ``unknown``. An engine whose
    nonce no record holds (``recorded``: the readable records' nonces) is told too: a
    lost record's, which a pass spares holding what it holds when its spawn note alone
    names it (this user may not read its environment), so it is held here as there."""
    torn = {p.name: p.path for p in problems if p.torn and p.name}
    if backend is None or backend.name != backendnames.LOCAL:
        return TornHeld({}, {}, sorted(torn.values()))
    held = TornHeld({}, {}, [])
    for procs in by_instance(backend.scan()).values():
        leader = leader_of(procs)
        if leader is None or (leader.name not in torn and leader.nonce in recorded):
            continue
        found = found_in(leader.ref, environ_of(leader), inventory)
        if isinstance(found, str) and leader.name in torn:
            held.unknown.append(torn[leader.name])
        if isinstance(found, str):
            continue
        holder = f"{leader.name} ({_unrecorded(leader, torn)}; engine pid {leader.ref.pid})"
        held.devices.update(dict.fromkeys(found.devices, holder))
        held.ports[found.port] = holder
    return held


def _unrecorded(leader: MarkedProcess, torn: Collection[str]) -> str:
    """Why no record shows what ``leader`` holds, in the holder's words."""
    if leader.name in torn:
        return "torn record"
    return "no record, found by its spawn note" if leader.noted is not None else "no record"


# -- this set's engines -------------------------------------------------------------------


def adoptable(
    desired: Desired, observed: Observed, owner: str, since: Callable[[str], float | None]
) -> list[tuple[Entry, MarkedProcess]]:
    """This set's orphan engines (their marker names the instance exactly, and the set; an
    older version's names none) whose manifest still declares them and whose record was
    set aside (``since``: when, None if not) after they started, or is lost while no
    record holds the name and no one may reap the engine (:func:`lost`): (entry,
    leader) each."""
    wanted = desired.instances()
    out: list[tuple[Entry, MarkedProcess]] = []
    for _, procs in sorted(by_instance(observed.orphans).items()):
        leader = leader_of(procs)
        entry = wanted.get(leader.name) if leader else None
        if leader is None or entry is None or leader.owner not in (None, owner):
            continue
        torn = since(leader.name)
        if (torn is not None and torn >= leader.ref.start_time) or lost(leader, observed.records):
            out.append((entry, leader))
    return out


def lost(leader: MarkedProcess, records: Mapping[str, RecordView]) -> bool:
    """An engine found by its spawn note whose name no record holds: reaped by no one (it
    is not proven ours), it runs on; unadopted, its name would start a second one."""
    return leader.noted is not None and leader.name not in records


def refusal(
    entry: Entry, found: Found, ledger: Ledger, inventory: Inventory, extra: Mapping[str, int]
) -> str | None:
    """Why the engine of a torn record cannot be adopted (None: it can)."""
    if extra.get(entry.deployment.spec.engine, 0):
        return "its engine's extra ports are not in its environment"
    return conflict(found, entry, ledger, inventory)


def foresee(
    desired: Desired,
    observed: Observed,
    *,
    owner: str,
    store: RecordStore,
    inventory: Inventory,
    extra: Mapping[str, int],
) -> Observed:
    """`plan`'s view of :meth:`Adopter.rebuild`, which a pass runs before it plans: this
    set's engines whose record lies torn (or was quarantined) that the pass would adopt
    are no orphans to reap but ``adopting`` (the planner shows their adoption). Judged
    as the pass judges them, against the records as they are now; nothing written."""
    ledger = ledger_for([v.record for v in observed.records.values()], observed)
    adopting: dict[str, ProcessRef] = dict(observed.adopting)
    nonces: set[str] = set()
    for entry, leader in adoptable(desired, observed, owner, store.torn_since):
        if leader.name in adopting:
            continue  # one record per name: the pass reaps a second engine of it
        found = found_in(leader.ref, environ_of(leader), inventory)
        if isinstance(found, str) or refusal(entry, found, ledger, inventory, extra):
            continue  # the pass reaps it, as the plan says
        spec = entry.deployment.spec
        ledger.take(leader.name, found.devices, (found.port,), spec.devices.shareable,
                    spec.devices.memory)  # fmt: skip
        adopting[leader.name] = leader.ref
        nonces.add(leader.nonce)
    orphans = tuple(m for m in observed.orphans if m.nonce not in nonces)
    return replace(observed, orphans=orphans, adopting=adopting)


@dataclass(kw_only=True)
class Adopter:
    """A pass's (and `down`'s) hand on this set's engines of quarantined records."""

    store: RecordStore
    backend: Backend
    maker: RecordMaker  # its inventory is the pass's current one
    executor: Executor
    placement_lock: FileLock
    lock_timeout: float
    extra_ports: Callable[[], Mapping[str, int]]  # engine -> the extra ports its recipe takes

    def rebuild(self, desired: Desired, observed: Observed) -> dict[str, MarkedProcess]:
        """Adopt each orphan engine of this set whose record was quarantined after it
        started and whose manifest still declares it (:func:`adoptable`); the rest are
        reaped by the plan or spared as another set's. Those adopted: name -> its engine
        (each has a record now)."""
        if self.backend.name != backendnames.LOCAL:
            return {}  # its environment is on another machine
        found = adoptable(desired, observed, self.maker.owner, self.store.quarantined_at)
        return {
            leader.name: leader
            for entry, leader in found
            if self._rebuild_one(entry, leader, observed)
        }

    def _rebuild_one(self, entry: Entry, leader: MarkedProcess, observed: Observed) -> bool:
        name, pid = leader.name, leader.ref.pid
        found = found_in(leader.ref, environ_of(leader), self.maker.inventory)
        with self.placement_lock.hold(self.lock_timeout):
            fresh = self.store.load()
            if name in fresh.records:
                return False  # another pass made one meanwhile: the plan judges the engine
            ledger = ledger_for(fresh.records.values(), observed)
            why = found if isinstance(found, str) else self._refusal(entry, found, ledger)
            if why is None and isinstance(found, Found):
                try:
                    rebuilt = self.maker.rebuilt(entry, found, name=name, nonce=leader.nonce)
                    container = self.backend.container_of(rebuilt)  # its runtime's labels
                    said = rebuilt.message if leader.noted is None else REBUILT
                    self.store.write(replace(rebuilt, container=container, message=said))
                except RecipeError as exc:
                    why = str(exc)
        record = "a quarantined" if leader.noted is None else "a lost"
        if why is not None:
            log.warning(f"engine of {record} record not adopted", deployment=name, pid=pid,
                        reason=why)  # fmt: skip
            return False
        reason = "its record was quarantined; its marker names this instance"
        log.warning(f"engine of {record} record adopted", deployment=name, pid=pid)
        self.executor.event(name, "adopt", reason if leader.noted is None else NOTED,
                            f"adopted pid {pid}")  # fmt: skip
        return True

    def _refusal(self, entry: Entry, found: Found, ledger: Ledger) -> str | None:
        return refusal(entry, found, ledger, self.maker.inventory, self.extra_ports())

    def adopt_torn(
        self, look: Callable[[], Observed], wanted: Callable[[], Desired], *, strays: bool
    ) -> list[str]:
        """Give the engine of a torn (quarantined) record its record back, as a pass does,
        before `down` looks (``look``: the node now; ``wanted``: the manifests): else
        `down` finds nothing to stop and the engine runs on with no record, its devices
        and port looking free to every pass. With ``strays``, this set's engines still
        without one are reaped: the names of those. The caller holds the pass lock."""
        observed = look()
        if observed.orphans and self.rebuild(wanted(), observed):
            observed = look()  # the adopted have records now
        return self.reap_own(observed.orphans) if strays else []

    def reap_own(
        self, orphans: Sequence[MarkedProcess], *, why: str = "have no record"
    ) -> list[str]:
        """Reap the engines whose marker names this set and no record accounts for (a torn
        record's, its manifest gone); another set's, and an older version's (no set
        named), are left to their own passes, as is one found by its spawn note alone.
        ``why``: what the reap's reason says of them."""
        mine = by_instance(m for m in orphans if m.owner == self.maker.owner)
        # No spawn note makes a process ours: an engine found by one is not reaped.
        ours = {n: procs for n, procs in mine.items() if all(p.noted is None for p in procs)}
        for nonce, procs in sorted(ours.items()):
            pids = ", ".join(str(p.ref.pid) for p in procs)
            said = f"reconcile down: engine processes ({pids}) of instance {nonce} {why}"
            self.executor.apply(Reap(name=procs[0].name, reason=said, processes=tuple(procs)))
        return sorted({procs[0].name for procs in ours.values()})
