"""`reconcile describe NAME`: the record, the spec (secrets redacted), the events, the log.

Laid out like ``kubectl describe``: fields first, then the spec, then the events
(oldest first, with ages), then the last lines of the engine's log. The last exit
keeps the log lines that preceded it (the journal stores them), so the first
failure's cause survives any number of restarts and log rotations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from controller.cli.render import pullshow
from controller.cli.render.views import (
    age,
    deployment_item,
    event_reason,
    iso,
    placed_on,
    table,
    until,
)
from controller.core import statusjson
from controller.core.manifest.names import base_name, instance_of
from controller.core.manifest.quantity import format_bytes
from controller.core.replicaset import ReplicaSet, group
from controller.core.state import EXITED, ContainerRef, Phase, Record
from controller.redact import redact_spec
from controller.store.instances import logfiles
from controller.store.instances.events import Journal
from controller.store.instances.records import RecordStore
from controller.store.side import measured, observed
from controller.store.statedir import StateDir


# ``describe``'s Memory line: what the record leases on each device beside what its
# engine was measured to use there (NVML hosts: store/side/measured.py).
def memory_line(rec: Record, state_dir: Path) -> str:
    if not rec.devices:
        return "-"
    spec_devices = rec.stored_spec.get("devices")
    auto = isinstance(spec_devices, dict) and spec_devices.get("memory") == "auto"
    requested = "whole device" if rec.memory is None else f"{format_bytes(rec.memory)} per device"
    if auto:
        requested += " (memory: auto)"
    peak = measured.peek(state_dir).get(rec.spec_hash or "")
    if peak is None:
        return f"requested {requested}; not measured"
    when = peak.at.isoformat(timespec="seconds")
    return f"requested {requested}; measured peak {format_bytes(peak.peak)} per device ({when})"


LOG_LINES = 20
EVENTS = 20
INDENT = "  "


def describe_deployment(
    state_dir: Path,
    rs: ReplicaSet,
    now: datetime | None = None,
    selector: Callable[[Record], bool] = lambda _: True,
    remote_log: Callable[[Record], list[str]] | None = None,
) -> str | None:
    """A deployment: its one record as ever, or the counts, then a section per instance
    (each replica, each rolling ``@next``) with that instance's events and log."""
    if not selector(rs.first):
        return None
    alone = len(rs.records) == 1
    sections = [describe(state_dir, r, now, remote_log=remote_log, alone=alone) for r in rs.records]
    text = "\n\n".join(s for s in sections if s is not None)
    if alone:
        return text or None
    head = [
        f"{'Deployment:':<14}{rs.name}",
        f"{'Replicas:':<14}{rs.desired} desired, {rs.ready} ready",
    ]
    return "\n".join(head) + "\n\n" + text


def describe_document(
    state_dir: Path,
    rs: ReplicaSet,
    selector: Callable[[Record], bool] = lambda _: True,
    remote_log: Callable[[Record], list[str]] | None = None,
) -> dict[str, Any] | None:
    """``describe -o json|yaml``: the status item, the spec (redacted), and per instance
    its events and last log lines."""
    if not selector(rs.first):
        return None
    noted = observed.views(observed.peek_all(state_dir), rs.records)
    (rs,) = group(noted.as_read(r) for r in rs.records)  # no stale spec-invalid mark, as status
    doc = {**deployment_item(rs), **statusjson.observed(rs, noted.seen, noted.conditions)}
    doc["spec"] = redact_spec(rs.first.stored_spec)
    alone = len(rs.records) == 1
    for shown, rec in zip(doc["instances"], rs.records, strict=True):
        shown["events"] = _journal(state_dir, rec.name, alone)
        shown["log"] = _log_lines(state_dir, rec, remote_log)
    return doc


def _log_lines(
    state_dir: Path, rec: Record, remote_log: Callable[[Record], list[str]] | None
) -> list[str]:
    if rec.on_cluster and remote_log is not None:
        return remote_log(rec)
    path = RecordStore(state_dir).log_path(rec.name)
    return [b.decode("utf-8", "replace").rstrip("\n") for b in logfiles.tail_lines(path, LOG_LINES)]


def describe(
    state_dir: Path,
    rec: Record,
    now: datetime | None = None,
    selector: Callable[[Record], bool] = lambda _: True,
    remote_log: Callable[[Record], list[str]] | None = None,
    alone: bool = True,
) -> str | None:
    """None when the selector leaves ``rec`` (as the verb read it: nothing re-read) out.

    ``remote_log``: the last lines of an engine whose log lives on another node (Ray).
    ``alone``: the deployment's only record, so every event of its journal is its own.
    """
    if not selector(rec):
        return None
    name = rec.name
    now = now or datetime.now(UTC)
    events = _journal(state_dir, name, alone)
    if rec.source:  # a git source's file as the repository names it
        rec = replace(rec, source=StateDir(state_dir).in_repo(rec.source))
    noted = observed.views(observed.peek_all(state_dir), [rec])
    rec = noted.as_read(rec)  # no stale spec-invalid mark, as status
    fields = [*_fields(rec, now), ("Memory", memory_line(rec, state_dir))]
    held = noted.conditions[rec.name]
    if held:  # what status leads its MESSAGE with, under the Message
        fields.insert([k for k, _ in fields].index("Message") + 1, ("Conditions", "; ".join(held)))
    fields += pullshow.describe_lines(rec, state_dir, now)  # Pulling
    out = [f"{k + ':':<14}{v}" for k, v in fields]
    out += _last_exit(rec, events, now)
    out += [
        "Spec:",
        *_indent(yaml.safe_dump(redact_spec(rec.stored_spec), sort_keys=False).rstrip()),
    ]
    out += ["Events:", *_indent(_events(events, now))]
    log_path = RecordStore(state_dir).log_path(name)  # a rolling @next's own until promoted
    if rec.on_cluster and remote_log is not None:
        out.append(f"Log (last {LOG_LINES} lines, on node {rec.node[:8]} {rec.host}):")
        lines = [line.encode() for line in remote_log(rec)]
    else:
        out.append(f"Log (last {LOG_LINES} lines of {log_path}):")
        lines = _tail(log_path)
    out += [INDENT + line.decode("utf-8", "replace").rstrip("\n") for line in lines] or [
        INDENT + "<none>"
    ]
    return "\n".join(out)


def _tail(log_path: Path) -> list[bytes]:
    try:
        return logfiles.tail_lines(log_path, LOG_LINES)
    except OSError as exc:  # a folder in its place, EIO: the spec, record and events still
        return [f"<not read: {exc.filename or log_path}: {exc.strerror or exc}>".encode()]


def _journal(state_dir: Path, name: str, alone: bool) -> list[dict[str, Any]]:
    """The events of record ``name``: the deployment's journal holds every replica's, each
    step of one beside replica 0 naming its ``instance``."""
    deployment = base_name(name)
    events = Journal(state_dir).read(deployment)
    if not alone:
        mine = instance_of(name)
        events = [e for e in events if instance_of(str(e.get("instance", deployment))) == mine]
    return events[-EVENTS:]


def _fields(rec: Record, now: datetime) -> list[tuple[str, str]]:
    fields = [
        ("Name", rec.name),
        ("Node", placed_on(rec)),
        ("Engine", rec.engine),
        ("Source", rec.source or "-"),
        ("Revision", rec.revision or "-"),
        ("Owner", rec.owner),
        ("Phase", _phase(rec, now)),
        ("Ready", "true" if rec.phase is Phase.READY else "false"),
        ("Spec valid", "true" if rec.spec_valid else "false"),
        ("Message", rec.message or "-"),
        ("PID", _pid(rec, now)),
        ("Instance", rec.nonce or "-"),
        ("Address", _address(rec)),
        ("Devices", _devices(rec)),
        ("Restarts", str(rec.restarts)),
        ("Readiness", _readiness(rec, now)),
        ("Liveness", _liveness(rec)),
    ]
    if rec.container is not None:  # after PID: the container that process is the main of
        fields.insert(11, ("Container", _container(rec.container)))
    return fields


def _container(kept: ContainerRef) -> str:
    """``podman abc123def456, image X (sha256:…)``: runtime, short id, image, digest."""
    return f"{kept.runtime} {kept.id[:12]}, image {kept.image} ({kept.digest or 'no digest'})"


def _address(rec: Record) -> str:
    if rec.port is None:
        return "-"
    extra = f" (also ports {','.join(map(str, rec.extra_ports))})" if rec.extra_ports else ""
    return f"{rec.host}:{rec.port}{extra}"


def _phase(rec: Record, now: datetime) -> str:
    text = str(rec.phase)
    if rec.phase is Phase.READY and rec.ready_at:
        text += f" since {iso(rec.ready_at)} ({age(rec.ready_at, now)})"
    if rec.phase is Phase.BACKOFF and rec.backoff_until:
        text += f", next try {until(rec.backoff_until, now)} ({iso(rec.backoff_until)})"
    return text


def _pid(rec: Record, now: datetime) -> str:
    if rec.ref is None:
        return "-"
    if rec.phase in EXITED:  # its `Last exit:` says how; the pid may be another's by now
        return f"- (the last, {rec.ref.pid}, has exited)"
    return f"{rec.ref.pid}, started {iso(rec.started_at)} ({age(rec.started_at, now)} ago)"


def _devices(rec: Record) -> str:
    if not rec.devices:
        return "-"
    uuids = list(rec.device_uuids) + [None] * (len(rec.devices) - len(rec.device_uuids))
    return ", ".join(f"{d} ({u})" if u else d for d, u in zip(rec.devices, uuids, strict=True))


# Phases with no engine placed yet: its probes are decided when it is (the recipe's, or
# the spec's), so the record holds none to show ("none" would say the spec asks for none).
_UNPLACED = (Phase.PENDING, Phase.IDLE, Phase.PULLING)


def _unplaced(rec: Record) -> bool:
    """No engine placed yet: Pending and the like, or a BackOff of a start that never
    got its lease (a failed image pull: its probes default, not the spec's)."""
    return rec.phase in _UNPLACED or rec.nonce is None


def _readiness(rec: Record, now: datetime) -> str:
    if _unplaced(rec):
        return "-"
    probe = rec.probe
    checks = [f"GET {path}" for path, _ in probe.http] or (["tcp connect"] if probe.tcp else [])
    checks = [probe.kind] if probe.completion else checks
    if not checks:  # nothing is asked, so nothing runs every period
        return "none (ready once running)"
    text = " then ".join(checks) + f" every {probe.period_seconds:g}s"
    if rec.phase is Phase.STARTING and rec.ready_deadline_at:
        text += f", deadline {iso(rec.ready_deadline_at)} ({until(rec.ready_deadline_at, now)})"
    return text


def _last_exit(rec: Record, events: list[dict[str, Any]], now: datetime) -> list[str]:
    """How the engine last ended, and the log lines before it (kept in its fail event)."""
    fails = [e for e in events if e.get("action") == "fail"]
    # The journal is the deployment's: a record that never ended a run (a promoted @next,
    # a replica placed anew) shares it with the instances before it, and their fails (an
    # abandoned rolling update's) are no exit of its engine.
    exited = rec.last_exit is not None or rec.restarts > 0 or rec.phase in EXITED
    last = fails[-1] if fails and exited else None
    if rec.last_exit is not None:
        ended = rec.last_exit
        head = f"{ended} at {iso(ended.at)} ({age(ended.at, now)} ago)"
    elif last is not None:  # a pass that did not spawn it cannot read its exit status
        head = f"{last.get('reason', '?')} ({_event_age(last.get('time'), now)} ago)"
    else:
        return [f"{'Last exit:':<14}-"]
    out = [f"{'Last exit:':<14}{head}"]
    if last is not None and last.get("log_tail"):
        out.append(INDENT + "its last log lines:")
        out += [INDENT * 2 + str(line) for line in last["log_tail"]]
    return out


def _events(events: list[dict[str, Any]], now: datetime) -> str:
    if not events:
        return "<none>"
    rows = [["AGE", "ACTION", "OUTCOME", "REASON"]]
    for event in events:
        rows.append(
            [
                _event_age(event.get("time"), now),
                str(event.get("action", "?")),
                str(event.get("outcome", "")),
                event_reason(event),
            ]
        )
    return table(rows)


def _event_age(stamp: Any, now: datetime) -> str:
    try:
        return age(datetime.fromisoformat(str(stamp)), now)
    except ValueError:
        return "?"


def _indent(text: str) -> list[str]:
    return [INDENT + line for line in text.splitlines()]


def _liveness(rec: Record) -> str:
    """The liveness probe and, while any are counted, the failures in a row."""
    probe = rec.liveness
    if probe is None:
        return "-" if _unplaced(rec) else "none"
    kind = "tcp connect" if probe.kind == "tcp" else probe.kind
    text = (
        f"{kind} every {probe.period_seconds:g}s, timeout {probe.timeout_seconds:g}s, "
        f"restart after {probe.failure_threshold} failures in a row"
    )
    if rec.liveness_failures:
        text += f" ({rec.liveness_failures} so far: {rec.message})"
    return text
