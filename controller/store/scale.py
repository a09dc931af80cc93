"""The autoscaler's counts: ``<state>/scale/<deployment>.json``.

Observed state beside ``activation/`` and ``inflight/``, never written into the manifest
(the folder stays the user's). Written by the pass that decides (under the pass lock) and
read by every pass and by ``reconcile plan``; a torn or foreign file counts as none (the
deployment starts again from its spec's count).

```json
{"version": 1, "count": 3, "low_since": null, "low_wants": 0,
 "changed_at": 1764490000.5, "reason": "scaled 1→3: 11.2 in flight on 1 Ready replica, target 4"}
```
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from controller.core.manifest.names import is_dns1123
from controller.core.scaling.autoscale import Scale
from controller.store import sidefiles
from controller.store.records import write_atomic

FOLDER = "scale"
VERSION = 1


def folder(state_dir: Path) -> Path:
    return state_dir / FOLDER


def _path(state_dir: Path, name: str) -> Path:
    if not is_dns1123(name):  # invariant 9: only deployment names become file names
        raise ValueError(f"not a deployment name: {name!r}")
    return folder(state_dir) / f"{name}.json"


def write(state_dir: Path, name: str, scale: Scale) -> None:
    path = _path(state_dir, name)
    sidefiles.folder_for_write(path.parent)
    data = {
        "version": VERSION,
        "count": scale.count,
        "low_since": scale.low_since,
        "low_wants": scale.low_wants,
        "changed_at": scale.changed_at,
        "reason": scale.reason,
    }
    write_atomic(path, json.dumps(data).encode())


def read_all(state_dir: Path) -> dict[str, Scale]:
    """Every readable count; a torn or foreign file is none (named at warning level)."""
    out: dict[str, Scale] = {}
    for path in sidefiles.listed(folder(state_dir), "*.json"):
        if not is_dns1123(path.stem):
            continue  # not a file this tool wrote: never read by a name it did not give
        try:
            data = json.loads(path.read_text())
            if data["version"] != VERSION:
                raise ValueError(f"version {data['version']!r}, not {VERSION}")
            since = data.get("low_since")
            out[path.stem] = Scale(
                count=max(0, int(data["count"])),
                low_since=None if since is None else float(since),
                low_wants=int(data.get("low_wants", 0)),
                changed_at=float(data.get("changed_at", 0.0)),
                reason=str(data.get("reason", "")),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            sidefiles.skipped(path, exc)
    return out


def forget(state_dir: Path, name: str) -> None:
    """The deployment is gone, or no longer autoscaled: its count is no one's."""
    if is_dns1123(name):
        with contextlib.suppress(FileNotFoundError):
            _path(state_dir, name).unlink()
