"""Read-only views of records for people (tables, ages) and machines (JSON, YAML)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from controller.durations import format_age
from controller.state import Phase, Record

SECRET_WORDS = ("TOKEN", "SECRET", "KEY", "PASSWORD")
REDACTED = "<redacted>"


def redact_env(env: dict[str, Any]) -> dict[str, Any]:
    return {k: REDACTED if any(w in k.upper() for w in SECRET_WORDS) else v for k, v in env.items()}


def redact_spec(spec: dict[str, Any]) -> dict[str, Any]:
    if isinstance(spec.get("env"), dict):
        return {**spec, "env": redact_env(spec["env"])}
    return spec


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def status_item(rec: Record) -> dict[str, Any]:
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
        "owner": rec.owner,
        "source": rec.source,
        "revision": rec.revision,
        "started_at": _iso(rec.started_at),
        "ready_at": _iso(rec.ready_at),
        "next_retry_at": _iso(rec.backoff_until) if rec.phase is Phase.BACKOFF else None,
        "last_exit": rec.last_exit.model_dump(mode="json") if rec.last_exit else None,
    }


def table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def status_table(records: Iterable[Record], now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    rows = [
        [
            "NAME",
            "ENGINE",
            "NODE",
            "DEVICES",
            "PORT",
            "PHASE",
            "READY",
            "RESTARTS",
            "AGE",
            "MESSAGE",
        ]
    ]
    for rec in records:
        since = rec.started_at or rec.reserved_at
        rows.append(
            [
                rec.name,
                rec.engine,
                rec.node,
                ",".join(d.split(":", 1)[1] if ":" in d else d for d in rec.devices) or "-",
                str(rec.port) if rec.port else "-",
                str(rec.phase) + ("" if rec.spec_valid else " (spec invalid)"),
                "1/1" if rec.phase is Phase.READY else "0/1",
                str(rec.restarts),
                format_age((now - since).total_seconds()) if since else "-",
                rec.message,
            ]
        )
    return table(rows)


def dump(items: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(items, indent=2)
    import yaml

    return yaml.safe_dump(items, sort_keys=False).rstrip()
