"""`reconcile describe NAME`: spec (secrets redacted), record, events, last log lines."""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path

from controller.events import Journal
from controller.records import RecordStore
from controller.views import redact_spec

LOG_LINES = 20
EVENTS = 20


def describe(state_dir: Path, name: str) -> str | None:
    store = RecordStore(state_dir)
    rec = store.read(name)
    if rec is None:
        return None
    out = [
        f"Name:       {rec.name}",
        f"Engine:     {rec.engine}",
        f"Node:       {rec.node}",
        f"Source:     {rec.source}" + (f" @ {rec.revision}" if rec.revision else ""),
        f"Phase:      {rec.phase}" + ("" if rec.spec_valid else "  (spec invalid)"),
        f"Message:    {rec.message or '-'}",
        f"PID:        {rec.ref.pid if rec.ref else '-'}",
        f"Port:       {rec.port or '-'}",
        f"Devices:    {', '.join(rec.devices) or '-'}",
        f"Restarts:   {rec.restarts}",
        f"Last exit:  {rec.last_exit or '-'}",
        "Spec:",
        *("  " + line for line in json.dumps(redact_spec(rec.spec), indent=2).splitlines()),
        "Events:",
    ]
    for event in Journal(state_dir).read(name, last=EVENTS):
        out.append(
            f"  {event.get('time', '?')}  {event.get('action', '?'):<10} "
            f"{event.get('outcome', '')}  ({event.get('reason', '')})"
        )
    out.append(f"Last {LOG_LINES} log lines ({store.log_path(name)}):")
    out.extend("  " + line for line in tail(store.log_path(name), LOG_LINES))
    return "\n".join(out)


def tail(path: Path, count: int) -> list[str]:
    try:
        with open(path, "rb") as f:
            lines = deque(f, maxlen=count)
    except FileNotFoundError:
        return []
    return [line.decode("utf-8", "replace").rstrip("\n") for line in lines]
