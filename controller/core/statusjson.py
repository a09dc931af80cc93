"""The deployment items of ``status -o json``: one builder for the CLI and the web page.

Pure (records in, plain dicts out): ``reconcile status -o json|yaml`` and the gateway's
``GET /ui/api/state`` give the same item for the same records. Machine output spells
every time in ISO 8601 (UTC) and never an age.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from controller.core.devicefaults import DeviceFault, health_fields
from controller.core.devices.inventory import Device
from controller.core.pulls import PullProgress
from controller.core.replicaset import ReplicaSet, group
from controller.core.state import EXITED, Phase, Record

# The phase shown for what a record of an unknown version holds: its state cannot be read.
UNKNOWN = "Unknown"

PULL_FIELDS = ("bytes_done", "bytes_total", "rate")


def iso(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat() if value else None


def next_retry(rec: Record) -> datetime | None:
    return rec.backoff_until if rec.phase is Phase.BACKOFF else None


def running_pid(rec: Record) -> int | None:
    """``pid``: the engine that runs, as Kubernetes shows a crash-looping container
    waiting with no process. In BackOff, Failed and Succeeded the record's ``ref`` names
    one that has exited (its pid may be another process's by now): ``last_exit.pid``."""
    return rec.ref.pid if rec.ref and rec.phase not in EXITED else None


def exited_pid(rec: Record) -> int | None:
    """``last_exit.pid``: the exited engine the record still names (BackOff, Failed,
    Succeeded); null once a new one started (the record keeps only its ``ref``)."""
    return rec.ref.pid if rec.ref and rec.phase in EXITED else None


def status_item(rec: Record) -> dict[str, Any]:
    """One deployment for ``status -o json|yaml`` (DESIGN.md's fields, then more)."""
    exit_info = None
    if rec.last_exit is not None:
        exit_info = {
            "code": rec.last_exit.code,
            "signal": rec.last_exit.signal,
            "at": iso(rec.last_exit.at),
            "reason": rec.last_exit.reason,
            "text": str(rec.last_exit),
            "pid": exited_pid(rec),
        }
    return {
        "name": rec.name,
        "phase": str(rec.phase),
        "ready": rec.phase is Phase.READY,
        "pid": running_pid(rec),
        "port": rec.port,
        "devices": list(rec.devices),
        "restarts": rec.restarts,
        "spec_valid": rec.spec_valid,
        # False while its cluster does not answer: ``phase`` is the last look's (the table
        # shows ``Ready?``), since ``state_unknown_since`` (ISO; null when known)
        "state_known": not rec.state_unknown,
        "state_unknown_since": iso(rec.unknown_since()),
        "message": rec.message,
        "engine": rec.engine,
        "node": rec.node,
        "backend": rec.backend,
        "owner": rec.owner,
        "source": rec.source,
        "revision": rec.revision,
        "host": rec.host,
        "extra_ports": list(rec.extra_ports),
        "device_uuids": list(rec.device_uuids),
        "spec_hash": rec.spec_hash,
        "reserved_at": iso(rec.reserved_at),
        "started_at": iso(rec.started_at),
        "ready_deadline_at": iso(rec.ready_deadline_at),
        "ready_at": iso(rec.ready_at),
        "next_retry_at": iso(next_retry(rec)),
        "last_exit": exit_info,
        "labels": dict(rec.labels),
        # DESIGN.md "Engines in containers": null for a process
        "container": None if rec.container is None else dataclasses.asdict(rec.container),
    }


def deployment_item(rs: ReplicaSet) -> dict[str, Any]:
    """One deployment for ``status -o json|yaml``: replica 0's fields, as a deployment of
    one replica always had them, plus the counts, the whole deployment's restarts and
    worst phase (what the table and the page show), and every instance."""
    return {
        **status_item(rs.first),
        "name": rs.name,
        "replicas": rs.desired,
        "ready_replicas": rs.ready,
        "restarts_total": rs.restarts,
        "worst_phase": str(rs.worst_phase),
        "instances": [instance_item(r.index, one) for r in rs.replicas for one in r.records],
    }


def instance_item(replica: int, rec: Record) -> dict[str, Any]:
    """A replica (or its rolling ``@next``, under the same index) in ``instances``."""
    return {
        "replica": replica,
        "name": rec.name,
        "phase": str(rec.phase),
        "ready": rec.phase is Phase.READY,
        "pid": running_pid(rec),
        "port": rec.port,
        "host": rec.host,
        "node": rec.node,
        "devices": list(rec.devices),
        "restarts": rec.restarts,
        "state_known": not rec.state_unknown,
        "message": rec.message,
    }


def pull_field(name: str, found: Mapping[str, PullProgress]) -> dict[str, Any]:
    """``pull: {bytes_done, bytes_total, rate}`` for ``status -o json`` (Pulling only)."""
    progress = found.get(name)
    if progress is None:
        return {}
    return {"pull": {k: v for k, v in progress.as_json().items() if k in PULL_FIELDS}}


def deployment_items(
    records: list[Record],
    pulls: Mapping[str, PullProgress],
    seen: Mapping[str, datetime],
    conditions: Mapping[str, list[str]],
) -> list[dict[str, Any]]:
    """``status -o json``'s list (the page's too): a deployment per item, its replicas
    within, a Pulling one with its pull's progress, and what the passes' notes say of it
    (``seen``, ``conditions``: per record)."""
    return [
        {**deployment_item(s), **pull_field(s.first.name, pulls), **observed(s, seen, conditions)}
        for s in group(records)
    ]


def observed(
    rs: ReplicaSet, seen: Mapping[str, datetime], conditions: Mapping[str, list[str]]
) -> dict[str, Any]:
    """``observed_at`` (the oldest of its replicas' views) and ``conditions`` (what holds
    the deployment as it is, e.g. an emptied manifest folder) of one deployment."""
    times = [seen[r.name] for r in rs.records if r.name in seen]
    held = dict.fromkeys(c for r in rs.records for c in conditions.get(r.name, ()))
    return {"observed_at": iso(min(times)) if times else None, "conditions": list(held)}


def outside_items(
    known: Iterable[str], records: Iterable[Record], node: str
) -> list[dict[str, Any]]:
    """``devices -o json``'s ``outside_inventory``: devices this node's engines hold that
    the inventory no longer lists (``--devices`` changed under them). They run on, and
    nothing new is placed there; said, so the device does not look free or gone."""
    listed = set(known)
    held: dict[str, list[str]] = {}
    for rec in sorted(records, key=lambda r: r.name):
        if rec.holds and not rec.elsewhere(node):
            for key in rec.devices:
                if key not in listed:
                    held.setdefault(key, []).append(rec.name)
    return [{"device": key, "held_by": names} for key, names in sorted(held.items())]


def device_items(
    devices: Iterable[Device],
    records: Iterable[Record],
    faults: Mapping[str, DeviceFault] | None = None,
    unreadable: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """``devices -o json``'s devices: each with who holds it and how much of it (bytes;
    a holder's memory None: the whole device), and its health (``faults``: the
    Unhealthy ones). ``unreadable``: device -> the record of an unknown version holding
    it whole, as the pass's ledger counts it (its phase ``Unknown``)."""
    holding: dict[str, list[dict[str, Any]]] = {}
    for rec in sorted(records, key=lambda r: r.name):
        for key in rec.devices if rec.holds else ():
            held = {"name": rec.name, "memory": rec.memory, "phase": str(rec.phase)}
            holding.setdefault(key, []).append(held)
    for key, holder in sorted((unreadable or {}).items()):
        holding.setdefault(key, []).append({"name": holder, "memory": None, "phase": UNKNOWN})
    return [
        {
            "device": d.key,
            "kind": d.kind,
            "id": d.id,
            "uuid": d.uuid,
            "name": d.name,
            "memory_total_mb": d.memory_total_mb,
            "memory_free_mb": d.memory_free_mb,
            # Bytes: the device's memory, what the leases hold of it, what is left.
            "memory": d.memory,
            **_allocation(d.memory, [h["memory"] for h in hs]),
            "held_by": [h["name"] for h in hs],
            "holders": hs,
            **health_fields((faults or {}).get(d.key)),
        }
        for d in devices
        for hs in [holding.get(d.key, [])]
    ]


def _allocation(memory: int | None, held: list[int | None]) -> dict[str, int | None]:
    """``memory_allocated``: the requests on the device, or all of it when a holder leases
    it whole (no ``memory``: the ledger gives it to no one else, as the metrics' ``leased``
    counts it); ``memory_free``: what that leaves (None: the device's memory is unknown)."""
    requested = sum(m or 0 for m in held)
    if memory is None:
        return {"memory_allocated": requested, "memory_free": None}
    allocated = memory if None in held else requested
    return {"memory_allocated": allocated, "memory_free": max(memory - allocated, 0)}
