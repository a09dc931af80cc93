"""The gateway's demand for OnDemand deployments: ``<state>/activation/<name>.json``.

Desired state on disk, not a side channel: the gateway writes when a request
arrives (and refreshes while requests are in flight); every pass (and `reconcile
plan`) reads it as input. A crashed daemon leaves a file whose timestamp simply
ages past the deployment's ``idleTimeout``: nothing leaks. A torn or foreign file is
quarantined (``documents.py``) and counts as no demand.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

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
    """Every readable activation; a torn or foreign file counts as no demand (named;
    quarantined unless ``peek``)."""
    return _folder(state_dir).read_all(peek=peek)


def forget(state_dir: Path, name: str) -> None:
    _folder(state_dir).forget(name)
