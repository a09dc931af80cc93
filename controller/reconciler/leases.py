"""Making records: the lease a reservation takes, Pending and rejected records.

The executor writes these; building them (and rendering what the engine will
run, whose probe, deadline and grace the record keeps) lives here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from controller.core.devices.inventory import Device, Inventory
from controller.core.devices.placement import Ledger
from controller.core.elapsed import BootClock
from controller.core.engines import default_affinity
from controller.core.manifest.specs import Entry, routable_names, spec_document
from controller.core.render import Rendered, deadline_of, render
from controller.core.state import Phase, ProcessRef, Record
from controller.host import bootclock
from controller.store.instances.records import RecordStore


@dataclass(frozen=True, slots=True)
class Lease:
    """A reservation record and what its engine will run: rendered once, for both (the
    record keeps the probe, deadline and grace; the spawn execs the argv and env)."""

    record: Record
    rendered: Rendered


@dataclass(kw_only=True)
class RecordMaker:
    store: RecordStore
    inventory: Inventory
    owner: str
    node: str
    me: ProcessRef  # the reservations' maker: this process
    revision: str | None = None  # the manifests' git commit, when they are in a work tree
    backend: str = "local"  # the backend that judges the records made here
    # `{model}` of a spec with a source: its pulled files (None: no model cache here)
    model_path: Callable[[Entry], str | None] = lambda _entry: None

    def now(self) -> datetime:
        return datetime.now(UTC)

    def boot(self) -> BootClock | None:
        """The boot clock, stamped beside a wall-clock time a later pass compares (a step
        of the wall clock does not move it: core/elapsed.py)."""
        return bootclock.read()

    def reservation(
        self,
        entry: Entry,
        *,
        devices: tuple[str, ...],
        port: int,
        extra_ports: tuple[int, ...],
        restarts: int = 0,
        name: str | None = None,
    ) -> Lease:
        """A record that leases devices and ports before anything is spawned.

        ``name``: the record's, when not the deployment's (a RollingUpdate's ``@next``).
        """
        now = self.now()
        rendered = self.render(entry, devices, port, extra_ports, name=name)
        keyed = self.inventory.by_key()
        spec = entry.deployment.spec
        record = replace(
            self.pending(entry, ""),  # the fields every record of it shares
            name=name or entry.name,
            nonce=os.urandom(8).hex(),  # secrets.token_hex, without hmac + hashlib
            reserved_by=self.me,
            host=spec.host,
            port=port,
            extra_ports=extra_ports,
            devices=devices,
            shareable=spec.devices.shareable,
            device_uuids=tuple(keyed[d].uuid if d in keyed else None for d in devices),
            memory=spec.devices.memory if devices else None,
            phase=Phase.RESERVED,
            probe=rendered.probe,
            liveness=rendered.liveness,
            stop_signal=rendered.stop_signal,
            grace_seconds=rendered.grace_seconds,
            reserved_at=now,
            ready_deadline_at=now + timedelta(seconds=rendered.deadline_seconds),
            restarts=restarts,
        )
        return Lease(record, rendered)

    def pending(self, entry: Entry, reason: str, *, name: str | None = None) -> Record:
        """``name``: the record's, when not the deployment's (a replica, a ``@next``)."""
        blank = Record(
            name=name or entry.name,
            owner=self.owner,
            node=self.node,
            backend=self.backend,
            phase=Phase.PENDING,
            message=reason,
        )
        return self.described(blank, entry)

    def described(self, rec: Record, entry: Entry) -> Record:
        """``rec`` stating ``entry``: its spec document and hash, and every fact a reader
        takes from the spec, typed (the gateway and the daemon read these, never the
        document, so both see one activation, one idle timeout, one deadline)."""
        spec = entry.deployment.spec
        return replace(
            rec,
            source=entry.source,
            spec_hash=entry.hash,
            stored_spec=spec_document(spec),
            engine=spec.engine,
            restart_policy=spec.restart_policy,
            priority=spec.priority,
            activation=spec.activation,
            idle_timeout=spec.idle_timeout,
            ready_deadline_seconds=deadline_of(spec),
            models=routable_names(entry.name, spec),
            device_count=spec.devices.count,
            affinity=spec.affinity or default_affinity(spec.engine),
            fallbacks=tuple(spec.fallbacks),
            fallback_after=spec.fallback_after,
            scale_to_zero=spec.autoscale is not None and spec.autoscale.min == 0,
            revision=self.revision,
            labels=dict(entry.deployment.metadata.labels),
        )

    def idle(self, entry: Entry, reason: str, *, name: str | None = None) -> Record:
        """Parked (OnDemand, or scaled to 0): no engine, no device, no port (phase Idle)."""
        pending = self.pending(entry, reason, name=name)
        return replace(pending, phase=Phase.IDLE, idle_since=self.now(), idle_boot=self.boot())

    def render(
        self,
        entry: Entry,
        devices: tuple[str, ...],
        port: int,
        extra_ports: tuple[int, ...],
        *,
        name: str | None = None,
    ) -> Rendered:
        """What the engine of record ``name`` (default: the deployment's) runs; each
        replica has its own runtime dir, while ``{name}`` stays the deployment's."""
        keyed = self.inventory.by_key()
        chosen = tuple(keyed.get(d) or _device(d) for d in devices)
        runtime_dir = self.store.runtime_dir(name or entry.name)
        return render(
            entry,
            devices=chosen,
            port=port,
            extra_ports=extra_ports,
            runtime_dir=str(runtime_dir),
            model_path=self.model_path(entry),
        )

    def rebuilt(self, entry: Entry, found: Found, *, name: str, nonce: str) -> Record:
        """The record of a running engine whose record was quarantined: its manifest's
        facts, the devices and port its environment names, its marker's nonce, Starting
        (its readiness is probed again). Raises RecipeError as a reservation would."""
        lease = self.reservation(
            entry, devices=found.devices, port=found.port, extra_ports=(), name=name
        )
        started = datetime.fromtimestamp(found.ref.start_time, UTC)
        return replace(
            lease.record,
            nonce=nonce,
            ref=found.ref,
            phase=Phase.STARTING,
            started_at=started,
            message="record rebuilt from its engine's marker (the old one was quarantined)",
        )

    def rejected(self, name: str, reason: str) -> Record:
        """A deployment whose manifest never validated: seen, so recorded, holding nothing.

        Its name stays routable (the gateway answers "not Ready", not "no such model"),
        with no deadline: nothing will start it until the manifest is fixed.
        """
        return Record(
            name=name,
            owner=self.owner,
            node=self.node,
            backend=self.backend,
            phase=Phase.PENDING,
            spec_valid=False,
            models=(name,),
            message=reason,
            revision=self.revision,
        )


@dataclass(frozen=True, slots=True)
class Found:
    """What a running engine's environment says it was given: the lease it holds."""

    ref: ProcessRef
    devices: tuple[str, ...]
    port: int


def found_in(ref: ProcessRef, environ: bytes, inventory: Inventory) -> Found | str:
    """The devices (its visibility variables, UUIDs mapped back) and port (``PORT``) an
    engine was started with, or why they cannot be told."""
    env = dict(item.partition("=")[::2] for item in environ.decode(errors="replace").split("\0"))
    port = env.get("PORT", "")
    if not port.isdigit():
        return "its environment has no PORT"
    by_uuid = {d.uuid: d.key for d in inventory.devices if d.uuid}
    nvidia = [by_uuid.get(i, f"nvidia:{i}") for i in env.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    amd = [f"amd:{i}" for i in env.get("HIP_VISIBLE_DEVICES", "").split(",")]
    devices = tuple(d for d in (*nvidia, *amd) if not d.endswith(":"))
    return Found(ref, devices, int(port))


def conflict(found: Found, entry: Entry, ledger: Ledger, inventory: Inventory) -> str | None:
    """Why the engine cannot keep what it holds (None: it can): adopting it must never
    double-book a device or a port, nor hold what the manifest does not ask for."""
    spec = entry.deployment.spec
    if found.port in ledger.ports:
        return f"its port {found.port} is held by {ledger.ports[found.port]}"
    if len(found.devices) != spec.devices.count:
        return f"it has {len(found.devices)} devices, the manifest asks for {spec.devices.count}"
    keyed = inventory.by_key()
    for key in found.devices:
        if key not in keyed:
            return f"its device {key} is not in this node's inventory"
        memory = spec.devices.memory
        sized = memory is not None and ledger.fits(keyed[key], memory)
        if not (ledger.free_for(key, spec.devices.shareable) or sized):
            holders = ", ".join(h for h, _ in ledger.devices.get(key, []))
            return f"its device {key} is held by {holders}"
    return None


def _device(key: str) -> Device:
    kind, _, ident = key.partition(":")
    return Device(kind=kind, id=ident)


def kept_count(current: Record | None, record: Record) -> int:
    """The restart count a new record of ``current``'s name carries: a restart that went
    by way of a pull (its image's: the record was Pulling), a port move (Pending with its
    count: launcher's ``_port_gone``) or a wait for room is still that restart, so a start
    that keeps failing backs off longer each time and counts as crash-looping (``--once``
    exits 1), as a process's does. A back-off that gave its lease back (its image's pull
    failed) is placed afresh when it is over: that start is the restart it waited for,
    counted as one. A changed spec starts from 0, as a Kubernetes pod of a new template
    does."""
    if current is None or current.spec_hash != record.spec_hash:
        return 0
    if current.unleased_backoff:
        return current.restarts + 1
    return current.restarts if current.phase in (Phase.PULLING, Phase.PENDING) else 0
