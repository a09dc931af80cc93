"""When each manifest set's last pass observed its node: ``<state>/observed.json``.

`status` reads records, which a pass writes only when something changes: a cron pass
from an hour ago still says Ready over an engine killed since. Each pass notes here when
it looked (and whether its folders held no manifest, so it pruned nothing), so `status`
can say how old its view is and why a removed manifest still runs. Written under the
pass lock; one entry per (node, owner); a torn or foreign file reads as no entries.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from controller.store.records import write_atomic

FILE = "observed.json"


@dataclass(frozen=True, slots=True)
class Seen:
    node: str
    owner: str
    at: datetime
    prune_blocked: str | None = None  # the folders held no manifest: nothing was pruned


def note(state_dir: Path, seen: Seen) -> None:
    """Record ``seen``, replacing that (node, owner)'s previous entry (pass lock held)."""
    kept = [s for s in read_all(state_dir) if (s.node, s.owner) != (seen.node, seen.owner)]
    doc = [_doc(s) for s in (*kept, seen)]
    write_atomic(state_dir / FILE, json.dumps(doc).encode())


def read_all(state_dir: Path) -> list[Seen]:
    try:
        data = json.loads((state_dir / FILE).read_text())
    except (OSError, ValueError):
        return []
    out = []
    for item in data if isinstance(data, list) else []:
        with contextlib.suppress(KeyError, TypeError, ValueError, AttributeError):
            blocked = item.get("prune_blocked")
            out.append(
                Seen(
                    node=str(item["node"]),
                    owner=str(item["owner"]),
                    at=datetime.fromisoformat(item["at"]),
                    prune_blocked=str(blocked) if blocked else None,
                )
            )
    return out


def _doc(seen: Seen) -> dict[str, Any]:
    return {
        "node": seen.node,
        "owner": seen.owner,
        "at": seen.at.isoformat(),
        "prune_blocked": seen.prune_blocked,
    }
