"""The gateway's demand for OnDemand deployments: ``<state>/activation/<name>.json``.

Desired state on disk, not a side channel: the gateway writes when a request
arrives (and refreshes while requests are in flight); every pass (and `reconcile
plan`) reads it as input. A crashed daemon leaves a file whose timestamp simply
ages past the deployment's ``idleTimeout``: nothing leaks.
"""

from __future__ import annotations

import contextlib
import json
from datetime import datetime
from pathlib import Path

from controller.core.manifest.specs import is_dns1123
from controller.core.state import Activation
from controller.store import bootstamp, sidefiles
from controller.store.records import write_atomic

FOLDER = "activation"


def folder(state_dir: Path) -> Path:
    return state_dir / FOLDER


def write(state_dir: Path, name: str, activation: Activation) -> None:
    if not is_dns1123(name):  # invariant 9: only deployment names become file names
        raise ValueError(f"not a deployment name: {name!r}")
    where = sidefiles.folder_for_write(folder(state_dir))
    data = {
        "last_request_at": activation.last_request_at.isoformat(),
        "inflight": activation.inflight,
        "released": activation.released,
        **bootstamp.fields(activation.boot),
    }
    write_atomic(where / f"{name}.json", json.dumps(data).encode())


def read_all(state_dir: Path) -> dict[str, Activation]:
    """Every readable activation; a torn or foreign file counts as no demand (named)."""
    out: dict[str, Activation] = {}
    for path in sidefiles.listed(folder(state_dir), "*.json"):
        try:
            data = json.loads(path.read_text())
            out[path.stem] = Activation(
                last_request_at=datetime.fromisoformat(data["last_request_at"]),
                inflight=int(data.get("inflight", 0)),
                released=data.get("released") is True,
                boot=bootstamp.read(data),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            sidefiles.skipped(path, exc)
    return out


def forget(state_dir: Path, name: str) -> None:
    if is_dns1123(name):
        with contextlib.suppress(FileNotFoundError):
            (folder(state_dir) / f"{name}.json").unlink()
