"""Read-only views of records: tables and ages for people, JSON and YAML for machines.

Machine output spells every time in ISO 8601 (UTC) and never an age; tables show
ages (``41s``, ``5m``, ``3h12m``) the way kubectl does.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from controller.core.elapsed import BootClock
from controller.core.manifest.quantity import format_age
from controller.core.replicaset import group, total_restarts
from controller.core.state import Drain, Phase, Record

# The machine items live in core (the gateway's web page builds the same ones); the
# CLI's modules import them from here as before.
from controller.core.statusjson import deployment_item as deployment_item
from controller.core.statusjson import instance_item as instance_item
from controller.core.statusjson import iso as iso
from controller.core.statusjson import next_retry as next_retry
from controller.core.statusjson import running_pid
from controller.core.statusjson import status_item as status_item
from controller.redact import printable

FORMATS = ("table", "wide", "json", "yaml", "name")


# -- times ------------------------------------------------------------------------------------


def age(value: datetime | None, now: datetime) -> str:
    return format_age((now - value).total_seconds()) if value else "-"


def until(value: datetime, now: datetime) -> str:
    """``in 8s`` / ``8s ago``."""
    seconds = (value - now).total_seconds()
    return f"in {format_age(seconds)}" if seconds >= 0 else f"{format_age(-seconds)} ago"


def short_rev(revision: str | None) -> str:
    """Each commit cut to 12 hex digits, its ``+dirty`` kept: cut with the rest, an
    uncommitted edit read as the clean commit."""
    if not revision:
        return "-"
    return ",".join(
        r[:12] + ("+dirty" if r.endswith("+dirty") else "") for r in revision.split(",")
    )


def event_reason(event: Mapping[str, Any]) -> str:
    """An event's REASON column: its reason, and why it failed when it says (``error``: a
    pull's 404 or both digests, a runtime's refusal, an exit at its start, an image
    `Never` will not pull), which the JSON keeps apart and a reason alone ("spawn",
    "placement") does not say; once when it repeats the reason (a URL's failure names
    the URL)."""
    reason, error = str(event.get("reason", "")), event.get("error")
    if not error:
        return reason
    return str(error) if not reason or reason in str(error) else f"{reason}: {error}"


# -- status ------------------------------------------------------------------------------------


def table(rows: Sequence[Sequence[str]], widths: Sequence[int] | None = None) -> str:
    """Columns padded to ``widths`` (`status -w`'s, kept from its header), else to fit."""
    rows = [[printable(c) for c in row] for row in rows]  # an engine's text, never acted on
    widths = widths or widths_of(rows)
    lines = ["   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def widths_of(rows: Sequence[Sequence[str]], at_least: Sequence[int] = ()) -> list[int]:
    """Each column's width: its widest cell as shown (escaped), never less than
    ``at_least``'s."""
    cells = [[len(printable(c)) for c in r] for r in rows]
    return [max([r[i] for r in cells] + list(at_least[i : i + 1])) for i in range(len(rows[0]))]


def _devices(recs: Sequence[Record]) -> str:
    devices = [d for r in recs for d in r.devices]
    kinds = {d.partition(":")[0] for d in devices}
    if len(kinds) > 1:
        return ",".join(devices)
    return ",".join(d.partition(":")[2] or d for d in devices) or "-"


def _node(rec: Record) -> str:
    """A cluster node id (Ray: 56 hex digits): its first 8 name it (`-o json` has all of it)."""
    return placed_on(rec)[:8] if rec.on_cluster else rec.node


def placed_on(rec: Record) -> str:
    """The node a record runs on. A cluster's Pending record is on none: its ``node`` is
    the controller's host name (NODE said `vm` for a deployment no Ray node holds)."""
    return "-" if rec.on_cluster and rec.phase is Phase.PENDING else rec.node


def _restarts(recs: Sequence[Record], now: datetime) -> str:
    count = total_restarts(recs)
    exits = [r.last_exit.at for r in recs if r.restarts and r.last_exit is not None]
    if count and exits:
        return f"{count} ({age(max(exits), now)} ago)"
    return str(count)


def _phase(rec: Record) -> str:
    """``Ready``; ``Ready?`` while its cluster does not answer (the phase is the last
    look's: ``Record.state_unknown``, its message says since when)."""
    doubt = "?" if rec.state_unknown else ""
    return str(rec.phase) + doubt + ("" if rec.spec_valid else " (spec invalid)")


def _joined(values: Iterable[str]) -> str:
    """Each value once, in order: a deployment's replicas on one node show it once."""
    return ",".join(dict.fromkeys(values)) or "-"


def _message(recs: Sequence[Record]) -> str:
    """The first replica's message, else the first one any replica has (named)."""
    if recs[0].message or len(recs) == 1:
        return recs[0].message
    said = next((r for r in recs if r.message), None)
    return f"{said.name}: {said.message}" if said else ""


def status_table(
    records: Iterable[Record],
    now: datetime | None = None,
    wide: bool = False,
    seen: Mapping[str, datetime] | None = None,
) -> str:
    """A row per deployment, READY as ready/desired; ``wide`` adds a row per instance
    (each replica, each ``@next``) under a deployment that has more than one. ``seen``
    (record name -> when a pass last observed it) adds SEEN: how old the view is."""
    return table(status_rows(records, now, wide, seen))


def status_rows(
    records: Iterable[Record],
    now: datetime | None = None,
    wide: bool = False,
    seen: Mapping[str, datetime] | None = None,
    show_rev: bool | None = None,
) -> list[list[str]]:
    """``status_table``'s cells, the header first. ``show_rev`` (default: when a record has
    a revision) is fixed by `status -w`, whose later rows keep the header's columns."""
    now = now or datetime.now(UTC)
    sets = group(records)
    if show_rev is None:
        show_rev = wide or any(r.revision for rs in sets for r in rs.records)
    head = ["NAME", "ENGINE", "NODE", "DEVICES", "PORT", "PHASE", "READY", "RESTARTS", "AGE"]
    head += ["SEEN"] if seen is not None else []
    head += ["PID", "SOURCE"] if wide else []
    head += ["REVISION"] if show_rev else []
    rows = [[*head, "MESSAGE"]]
    for rs in sets:
        ready = f"{rs.ready}/{rs.desired}"
        cols = _Columns(wide=wide, show_rev=show_rev, seen=seen)
        rows.append(_row(rs.name, rs.records, ready, now, cols))
        if wide and len(rs.records) > 1:
            for rec in rs.records:
                one = "1/1" if rec.phase is Phase.READY else "0/1"
                rows.append(_row(f"  {rec.name}", (rec,), one, now, cols))
    return rows


@dataclass(frozen=True, slots=True)
class _Columns:
    """The optional columns a table shows."""

    wide: bool
    show_rev: bool
    seen: Mapping[str, datetime] | None


def _row(name: str, recs: Sequence[Record], ready: str, now: datetime, cols: _Columns) -> list[str]:
    """One line of the table over ``recs``: a deployment's records, or one of them."""
    first = recs[0]
    row = [
        name,
        first.engine,
        _joined(_node(r) for r in recs),
        _devices(recs),
        _joined(str(r.port) for r in recs if r.port),
        _joined(_phase(r) for r in recs),
        ready,
        _restarts(recs, now),
        age(first.reserved_at or first.started_at, now),
    ]
    if cols.seen is not None:  # the oldest view of them: what the row can vouch for
        times = [cols.seen[r.name] for r in recs if r.name in cols.seen]
        row.append(age(min(times), now) if times else "-")
    wide = cols.wide
    pids = (str(pid) for r in recs if (pid := running_pid(r)) is not None)  # as -o json's pid
    row += [_joined(pids), first.source or "-"] if wide else []
    row += [short_rev(first.revision)] if cols.show_rev else []
    return [*row, _message(recs)]


def drain_line(
    node: str, drain: Drain | None, now: datetime, clock: BootClock | None = None
) -> str | None:
    """The banner above a table while the node is drained (``clock``: the boot clock now,
    which its ttl runs on)."""
    if drain is None or not drain.active(now, clock):
        return None
    ends = drain.ends(now, clock)
    by = f" by {printable(drain.by)}" if drain.by else ""
    why = f" ({printable(drain.reason)})" if drain.reason else ""
    evict = ", evicting" if drain.evict else ""
    stamp = ends.astimezone(UTC).strftime("%H:%M:%S UTC")
    return (
        f"node {node} is drained{by}{why}{evict} until {stamp} ({until(ends, now)}): "
        "nothing new starts or restarts; `reconcile uncordon` ends it"
    )


def dump(items: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(items, indent=2)
    import yaml

    return yaml.safe_dump(items, sort_keys=False, allow_unicode=True).rstrip()
