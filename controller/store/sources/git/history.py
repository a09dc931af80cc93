"""Pins and rollbacks' memory: ``<state>/git/history.json``, one entry per application of
a commit and how its deployments converged; the last good commit a rollback returns to,
and what a commit changed (autoRollback's deadline looks at those alone)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from controller.store.documents import Document
from controller.store.statedir import StateDir

HISTORY_KEEP = 200  # entries kept (the oldest go first)


def _decode_history(data: Any) -> list[dict[str, Any]]:
    if not isinstance(data, list):
        raise ValueError(f"a {type(data).__name__}, not a list")
    return [e for e in data if isinstance(e, dict) and "revision" in e]


def _history(state_dir: Path) -> Document[list[dict[str, Any]]]:
    state = StateDir(state_dir)
    keep = lambda entries: entries[-HISTORY_KEEP:]  # noqa: E731
    return Document(state, state.git_history, _decode_history, keep, indent=1)


def read_history(state_dir: Path) -> list[dict[str, Any]]:
    """The applied commits, oldest first (a torn file: quarantined, a new history)."""
    return _history(state_dir).read() or []


def peek_history(state_dir: Path) -> list[dict[str, Any]]:
    """``read_history`` for `reconcile history`: a torn file is named, read as none, and
    left for the next pass to set aside."""
    return _history(state_dir).peek() or []


def write_history(state_dir: Path, entries: list[dict[str, Any]]) -> None:
    _history(state_dir).write(entries)


def add_history(state_dir: Path, entry: dict[str, Any]) -> None:
    entries = read_history(state_dir)
    if (
        entries
        and entries[-1]["outcome"] not in ("Ready",)
        and entry["by"] in ("rollback", "auto-rollback")
    ):
        entries[-1]["outcome"] = "RolledBack"  # the commit that was left for an older one
    write_history(state_dir, [*entries, entry])


def changed_by(entries: list[dict[str, Any]], newest: dict[str, Any]) -> set[str]:
    """The deployments whose spec ``newest``'s commit changed: added, or another hash than
    the last earlier entry that knew its specs had (every one when none did)."""
    specs: dict[str, str] = newest.get("specs") or {}
    before = next(
        (e["specs"] for e in reversed(entries[:-1]) if isinstance(e.get("specs"), dict)), None
    )
    if before is None:
        return set(specs)
    return {name for name, digest in specs.items() if before.get(name) != digest}


def outcome_of(phases: list[str]) -> str:
    if any(p == "Failed" for p in phases):
        return "Failed"
    if any(p in ("BackOff", "Pending") for p in phases):
        return "Degraded"
    if all(p in ("Ready", "Idle") for p in phases):
        return "Ready"
    return "Progressing"


def last_good(state_dir: Path, but: str | None) -> str | None:
    """The newest commit whose deployments were all Ready, other than ``but``."""
    for entry in reversed(read_history(state_dir)):
        if entry["outcome"] == "Ready" and entry["revision"] != but:
            return str(entry["revision"])
    return None


def paused(entry: dict[str, Any], drained: bool, now: datetime) -> bool:
    """The history entry's progress deadline paused while the node is drained, and
    started again from the drain's end: nothing new starts on a drained node (a spec
    change waits, its engine on the old spec), so a drain must not make a good commit
    late. Kubernetes does the same for a paused Deployment: no progress check while
    paused, and ``progressDeadlineSeconds`` counts again from the resume. Whether the
    entry changed (then it is written)."""
    if drained and "paused_at" not in entry:
        entry["paused_at"] = now.isoformat()
        return True
    if not drained and "paused_at" in entry:
        del entry["paused_at"]
        entry["resumed_at"] = now.isoformat()
        return True
    return False
