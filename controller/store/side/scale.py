"""The autoscaler's counts: ``<state>/scale/<deployment>.json``.

Observed state beside ``activation/`` and ``inflight/``, never written into the manifest
(the folder stays the user's). Written by the pass that decides (under the pass lock) and
read by every pass and by ``reconcile plan``; a torn or foreign file is quarantined and
counts as none (the deployment starts again from the replicas its records hold: the
autoscaler's ``_counted``).

```json
{"version": 1, "count": 3, "low_since": null, "low_wants": 0,
 "changed_at": 1764490000.5, "reason": "scaled 1→3: 11.2 in flight on 1 Ready replica, target 4"}
```
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from controller.core.scaling.autoscale import Scale
from controller.store.documents import Folder, check_version
from controller.store.statedir import StateDir

VERSION = 1


def _encode(scale: Scale) -> dict[str, Any]:
    return {
        "version": VERSION,
        "count": scale.count,
        "low_since": scale.low_since,
        "low_wants": scale.low_wants,
        "changed_at": scale.changed_at,
        "reason": scale.reason,
    }


def _decode(data: Any, name: str) -> Scale:
    check_version(data, VERSION)
    since = data.get("low_since")
    return Scale(
        count=max(0, int(data["count"])),
        low_since=None if since is None else float(since),
        low_wants=int(data.get("low_wants", 0)),
        changed_at=float(data.get("changed_at", 0.0)),
        reason=str(data.get("reason", "")),
    )


def _folder(state_dir: Path) -> Folder[Scale]:
    state = StateDir(state_dir)
    return Folder(state, state.scale, _decode, _encode)


def write(state_dir: Path, name: str, scale: Scale) -> None:
    _folder(state_dir).write(name, scale)  # invariant 9: only deployment names


def read_all(state_dir: Path, *, peek: bool = False) -> dict[str, Scale]:
    """Every readable count; a torn or foreign file is none (named; quarantined unless
    ``peek``)."""
    return _folder(state_dir).read_all(peek=peek)


def forget(state_dir: Path, name: str) -> None:
    """The deployment is gone, or no longer autoscaled: its count is no one's."""
    _folder(state_dir).forget(name)
