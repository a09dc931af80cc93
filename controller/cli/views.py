"""Read-only views of records: tables and ages for people, JSON and YAML for machines.

Machine output spells every time in ISO 8601 (UTC) and never an age; tables show
ages (``41s``, ``5m``, ``3h12m``) the way kubectl does.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from controller.core.durations import format_age
from controller.core.state import Drain, Phase, Record

FORMATS = ("table", "wide", "json", "yaml", "name")


# -- times ------------------------------------------------------------------------------------


def iso(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat() if value else None


def age(value: datetime | None, now: datetime) -> str:
    return format_age((now - value).total_seconds()) if value else "-"


def until(value: datetime, now: datetime) -> str:
    """``in 8s`` / ``8s ago``."""
    seconds = (value - now).total_seconds()
    return f"in {format_age(seconds)}" if seconds >= 0 else f"{format_age(-seconds)} ago"


def short_rev(revision: str | None) -> str:
    return ",".join(r[:12] for r in revision.split(",")) if revision else "-"


# -- status ------------------------------------------------------------------------------------


def next_retry(rec: Record) -> datetime | None:
    return rec.backoff_until if rec.phase is Phase.BACKOFF else None


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
        }
    return {
        "name": rec.name,
        "phase": str(rec.phase),
        "ready": rec.phase is Phase.READY,
        "pid": rec.ref.pid if rec.ref else None,
        "port": rec.port,
        "devices": list(rec.devices),
        "restarts": rec.restarts,
        "spec_valid": rec.spec_valid,
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
    }


def table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def _devices(rec: Record) -> str:
    kinds = {d.partition(":")[0] for d in rec.devices}
    if len(kinds) > 1:
        return ",".join(rec.devices)
    return ",".join(d.partition(":")[2] or d for d in rec.devices) or "-"


def _node(rec: Record) -> str:
    """A cluster node id (Ray: 56 hex digits): its first 8 name it (`-o json` has all of it)."""
    return rec.node[:8] if rec.on_cluster else rec.node


def _restarts(rec: Record, now: datetime) -> str:
    if rec.restarts and rec.last_exit is not None:
        return f"{rec.restarts} ({age(rec.last_exit.at, now)} ago)"
    return str(rec.restarts)


def _phase(rec: Record) -> str:
    return str(rec.phase) + ("" if rec.spec_valid else " (spec invalid)")


def status_table(records: Iterable[Record], now: datetime | None = None, wide: bool = False) -> str:
    now = now or datetime.now(UTC)
    recs = list(records)
    show_rev = wide or any(r.revision for r in recs)
    head = ["NAME", "ENGINE", "NODE", "DEVICES", "PORT", "PHASE", "READY", "RESTARTS", "AGE"]
    head += ["PID", "SOURCE"] if wide else []
    head += ["REVISION"] if show_rev else []
    rows = [[*head, "MESSAGE"]]
    for rec in recs:
        row = [
            rec.name,
            rec.engine,
            _node(rec),
            _devices(rec),
            str(rec.port) if rec.port else "-",
            _phase(rec),
            "1/1" if rec.phase is Phase.READY else "0/1",
            _restarts(rec, now),
            age(rec.reserved_at or rec.started_at, now),
        ]
        row += [str(rec.ref.pid) if rec.ref else "-", rec.source or "-"] if wide else []
        row += [short_rev(rec.revision)] if show_rev else []
        rows.append([*row, rec.message])
    return table(rows)


def drain_line(node: str, drain: Drain | None, now: datetime) -> str | None:
    """The banner above a table while the node is drained."""
    if drain is None or not drain.active(now):
        return None
    by = f" by {drain.by}" if drain.by else ""
    why = f" ({drain.reason})" if drain.reason else ""
    evict = ", evicting" if drain.evict else ""
    stamp = drain.until.astimezone(UTC).strftime("%H:%M:%S UTC")
    return (
        f"node {node} is drained{by}{why}{evict} until {stamp} ({until(drain.until, now)}): "
        "nothing new starts or restarts; `reconcile uncordon` ends it"
    )


def dump(items: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(items, indent=2)
    import yaml

    return yaml.safe_dump(items, sort_keys=False, allow_unicode=True).rstrip()
