"""The promises, checked from outside: records on disk and /proc, never the CLI's word.

``violations(cluster)`` after a recovery pass must be empty:

- no record is corrupt (each file parses as a Record; nothing was quarantined);
- no stale tmp file of a dead writer is left in ``instances/``;
- each declared deployment has exactly one engine per replica (``spec.replicas``,
  records ``name``, ``name@1``, ...): one live marker process whose nonce and pid are
  the replica's record's, listening on its port, seeing only its devices;
- no device and no port is held by two live records (invariants 1 and 2);
- no reservation outlives its maker (invariant 3);
- no marker process lacks a record (invariant 3);
- no record is left for a deployment no folder declares (the pass converged).
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

from controller.core.manifest.names import replica_name
from controller.core.state import Phase, ProcessRef, Record
from controller.store.instances.recordjson import from_json, to_json

from .cluster import Cluster, Marked, alive, marked, start_time

TOLERANCE = 0.05


def read_records(state: Path) -> tuple[dict[str, Record], list[str]]:
    """Every record file, parsed without side effects (the store would quarantine)."""
    records: dict[str, Record] = {}
    problems: list[str] = []
    folder = state / "instances"
    with contextlib.suppress(FileNotFoundError):
        for path in sorted(folder.iterdir()):
            if path.name.startswith(".") or not path.name.endswith(".json"):
                continue
            try:
                rec = from_json(path.read_bytes())
            except FileNotFoundError:
                continue
            except ValueError as exc:  # RecordInvalid included
                problems.append(f"corrupt record {path.name}: {str(exc)[:200]}")
                continue
            records[rec.name] = rec
    return records, problems


def same_process(ref: ProcessRef | None) -> bool:
    if ref is None or not alive(ref.pid):
        return False
    started = start_time(ref.pid)
    return started is not None and abs(started - ref.start_time) <= TOLERANCE


def stale_tmp(state: Path) -> list[str]:
    out = []
    for folder in (state, state / "instances", state / "events"):
        with contextlib.suppress(FileNotFoundError):
            for path in folder.iterdir():
                if path.name.endswith(".tmp"):
                    pid = path.name.rsplit(".", 2)[-2]
                    if not (pid.isdigit() and alive(int(pid))):
                        out.append(f"stale tmp file {path} (writer gone)")
    return out


def quarantined(state: Path) -> list[str]:
    with contextlib.suppress(FileNotFoundError):
        return [f"quarantined: {p.name}" for p in (state / "quarantine").iterdir()]
    return []


def double_bookings(records: Mapping[str, Record]) -> list[str]:
    out = []
    holders = [r for r in records.values() if r.holds]
    devices = Counter(d for r in holders for d in r.devices if not r.shareable)
    ports = Counter(p for r in holders for p in ((r.port,) if r.port else ()) + r.extra_ports)
    for key, n in devices.items():
        if n > 1:
            who = sorted(r.name for r in holders if key in r.devices)
            out.append(f"device {key} held by {n} records: {who}")
    for port, n in ports.items():
        if n > 1:
            who = sorted(r.name for r in holders if port == r.port or port in r.extra_ports)
            out.append(f"port {port} held by {n} records: {who}")
    return out


def _engine_problems(name: str, rec: Record | None, procs: list[Marked]) -> list[str]:
    if rec is None:
        return [f"{name}: declared but has no record"]
    if rec.phase is Phase.BACKOFF and not procs and _waiting(rec):
        return []  # a crash-looping engine waits out its back-off, still holding its lease
    if rec.phase not in (Phase.STARTING, Phase.READY):
        return [f"{name}: phase {rec.phase} after recovery ({rec.message})"]
    if len(procs) != 1:
        return [f"{name}: {len(procs)} engines {[p.pid for p in procs]}, want exactly 1"]
    proc = procs[0]
    out = []
    if proc.nonce != rec.nonce:
        out.append(f"{name}: engine nonce {proc.nonce} is not the record's {rec.nonce}")
    if rec.ref is None or rec.ref.pid != proc.pid or not same_process(rec.ref):
        out.append(f"{name}: record ref {rec.ref} is not the engine pid {proc.pid}")
    if proc.env.get("PORT") != str(rec.port):
        out.append(f"{name}: engine PORT {proc.env.get('PORT')} but record port {rec.port}")
    ids = ",".join(d.partition(":")[2] for d in rec.devices)
    if proc.env.get("CUDA_VISIBLE_DEVICES") != ids:
        out.append(f"{name}: engine sees {proc.env.get('CUDA_VISIBLE_DEVICES')}, record {ids}")
    return out


def _waiting(rec: Record) -> bool:
    return rec.backoff_until is not None and rec.backoff_until > datetime.now(UTC)


def violations(
    cluster: Cluster,
    *,
    declared: Mapping[str, set[str]] | None = None,
    quarantine_ok: bool = False,
) -> list[str]:
    declared = cluster.declared() if declared is None else declared
    records, out = read_records(cluster.state)
    out += stale_tmp(cluster.state) + double_bookings(records)
    out += [] if quarantine_ok else quarantined(cluster.state)
    procs = marked(cluster.node)
    nonces = {r.nonce for r in records.values() if r.nonce}
    for proc in procs:
        if proc.nonce not in nonces:
            out.append(f"engine pid {proc.pid} ({proc.name}/{proc.nonce}) has no record")
    for rec in records.values():
        if rec.phase is Phase.RESERVED and rec.ref is None and same_process(rec.reserved_by):
            continue  # a live maker's reservation is its own business
        if rec.phase is Phase.RESERVED:
            out.append(f"{rec.name}: reservation outlived its maker {rec.reserved_by}")
    wanted = {
        (cluster.owner(s), replica_name(n, i))
        for s, names in declared.items()
        for n in names
        for i in range(cluster.replicas(n, s))
    }
    for rec in records.values():
        if (rec.owner, rec.name) not in wanted:
            out.append(f"{rec.name}: record left for an undeclared deployment ({rec.phase})")
    for _, name in sorted(wanted, key=lambda w: w[1]):
        rec = records.get(name)
        out += _engine_problems(name, rec, [p for p in procs if p.name == name])
    return out


def describe(cluster: Cluster) -> str:
    """What a failing assertion shows: the records and the marker processes."""
    records, _ = read_records(cluster.state)
    shown = {
        n: {k: v for k, v in json.loads(to_json(r)).items() if k != "spec"}
        for n, r in records.items()
    }
    procs = [(p.pid, p.name, p.nonce) for p in marked(cluster.node)]
    return f"records: {json.dumps(shown, indent=1)[:6000]}\nprocesses: {procs}"
