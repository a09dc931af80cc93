"""The labels a pass last read in node.yaml: ``<state>/node-labels.json``.

A node.yaml that was there and is gone (a disk not mounted, a config management run
that removed it, a `rm` in the wrong folder) is not a node that lost its labels: with
no labels every deployment with a `nodeSelector` was stopped as another node's, by the
next `--once` and by the daemon's next reload alike. The pass keeps the labels it last
read here, and while the file is missing every reader (a pass, a reload, `plan`,
`status`) takes these, with a warning naming the file and the moves.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.store.documents import Document
from controller.store.statedir import StateDir


@dataclass(frozen=True, slots=True)
class SeenLabels:
    file: str  # the node.yaml they were read from
    labels: dict[str, str]


def _document(state_dir: Path) -> Document[SeenLabels]:
    state = StateDir(state_dir)
    return Document(state, state.node_labels, _decode, _encode)


def _encode(seen: SeenLabels) -> dict[str, Any]:
    return {"file": seen.file, "labels": seen.labels}


def _decode(data: Any) -> SeenLabels:
    file, labels = data["file"], data["labels"]
    if not isinstance(file, str) or not isinstance(labels, dict):
        raise TypeError("file must be a string and labels an object")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise TypeError("labels must map strings to strings")
    return SeenLabels(file, dict(labels))


def remember(state_dir: Path, file: Path, labels: dict[str, str]) -> None:
    """A pass read ``labels`` in ``file``: kept (written only when they changed)."""
    seen = SeenLabels(str(file), dict(labels))
    if _document(state_dir).peek() != seen:
        _document(state_dir).write(seen)


def last_seen(state_dir: Path, file: Path) -> dict[str, str] | None:
    """The labels a pass last read in ``file`` (None: none was read there)."""
    seen = _document(state_dir).peek()
    return seen.labels if seen is not None and seen.file == str(file) else None


def missing(state_dir: Path, file: Path, labels: dict[str, str]) -> str:
    """The warning while ``file`` is missing and its last labels are kept."""
    said = ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "none"
    kept = StateDir(state_dir).node_labels
    return (
        f"{file} is missing, though a pass read it before: its last labels ({said}) are "
        "kept, so no deployment with a nodeSelector is stopped for want of them (a disk "
        "not mounted, a removal by mistake); put the file back, or write `labels: {}` in "
        f"it to mean no labels (or remove {kept} to run without node.yaml again)"
    )
