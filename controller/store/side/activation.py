"""The gateway's demand for OnDemand deployments: ``<state>/activation/<name>.json``.

Desired state on disk, not a side channel: the gateway writes when a request
arrives (and refreshes while requests are in flight); every pass (and `reconcile
plan`) reads it as input. A crashed daemon leaves a file whose timestamp simply
ages past the deployment's ``idleTimeout``: nothing leaks. A torn or foreign file is
quarantined (``documents.py``) and counts as a request at its own mtime: the gateway
writes it at each request (and while requests are in flight), so that is when demand was
last seen. Read as no demand, it parked a Ready engine with a request in flight at once.
It is written back only where no file is: the gateway takes no pass lock, and its write of
a request between the set-aside and the write-back is the newer one.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from controller import failpoints
from controller.core.state import Activation
from controller.store import bootstamp
from controller.store.documents import Folder
from controller.store.statedir import StateDir


def _encode(activation: Activation) -> dict[str, Any]:
    return {
        "last_request_at": activation.last_request_at.isoformat(),
        "inflight": activation.inflight,
        "released": activation.released,
        **bootstamp.fields(activation.boot),
    }


def _decode(data: Any, name: str) -> Activation:
    return Activation(
        last_request_at=datetime.fromisoformat(data["last_request_at"]),
        inflight=int(data.get("inflight", 0)),
        released=data.get("released") is True,
        boot=bootstamp.read(data),
    )


def _folder(state_dir: Path) -> Folder[Activation]:
    state = StateDir(state_dir)
    return Folder(state, state.activation, _decode, _encode)


def write(state_dir: Path, name: str, activation: Activation) -> None:
    _folder(state_dir).write(name, activation)  # invariant 9: only deployment names


def read_all(state_dir: Path, *, peek: bool = False) -> dict[str, Activation]:
    """Every activation; one whose file does not decode (named; quarantined unless
    ``peek``) is a request at the file's mtime, written back so the next pass reads it."""
    folder = _folder(state_dir)
    seen = {name: path for name, path in folder.files()}
    out = folder.read_all(peek=peek)
    for name in seen.keys() - out.keys():
        at = _written_at(seen[name], peek, folder.state.quarantined_documents)
        if at is None:
            continue  # gone meanwhile (forgotten by a pass): no demand
        out[name] = Activation(last_request_at=at)
        if not peek:  # set aside: kept for the next pass
            _write_back(folder, name, out)
    return out


def _write_back(folder: Folder[Activation], name: str, out: dict[str, Activation]) -> None:
    """The torn file's request written where it was, unless a writer put a file there
    since: the gateway writes at each request, whatever the pass lock (a check then a
    write replaced a request in flight by the hour-old mtime, and the pass parked its
    engine). That newer file is what the pass goes on with."""
    failpoints.hit("activation.write_back.before")
    with contextlib.suppress(OSError):
        if folder.write_new(name, out[name]):
            return
    newer = folder.read(name)
    if newer is not None:
        out[name] = newer


def _written_at(path: Path, peek: bool, aside: Path) -> datetime | None:
    """When the gateway last wrote ``path``: its mtime where it lies (a peek leaves it),
    else its quarantined copy's (a move keeps the mtime)."""
    candidates = (
        [path] if peek or path.exists() else sorted(aside.glob(f"activation~{path.name}.*[0-9]"))
    )
    for found in reversed(candidates):
        with contextlib.suppress(OSError):
            return datetime.fromtimestamp(found.stat().st_mtime, UTC)
    return None


def forget(state_dir: Path, name: str) -> None:
    _folder(state_dir).forget(name)
