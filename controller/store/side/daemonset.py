"""Which manifest set the daemon on a state dir runs: ``<state>/daemon.json``.

`reconcile restart` hands a restart to the daemon, and `reconcile down` warns that the
daemon starts again what it stopped; both hold only for deployments of the daemon's own
set: a cron set's beside it is never touched by the daemon's passes. The daemon writes
its pid and owner here once it holds ``daemon.lock``; a reader trusts the note only
while its pid is the lock's holder (a note left by a daemon that died says nothing).
Its inventory too: `status` judges an engine's devices by the daemon's, not by the
shell's RECONCILE_DEVICES, which may differ.
The note also says the newest record version the daemon reads: a `--once` of an upgraded
package must not rewrite records into a version the daemon still running cannot read.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.store.documents import Document
from controller.store.statedir import StateDir

# What a note without ``records`` says: the note came after record version 3 did.
_NOTED_SINCE = 3


@dataclass(frozen=True, slots=True)
class DaemonDevices:
    """The inventory the daemon runs with: ``static`` as its --devices / RECONCILE_DEVICES
    gave it ("" lists no device), None where it discovers the node's (NVML, nvidia-smi)."""

    static: str | None


@dataclass(frozen=True, slots=True)
class DaemonSet:
    pid: int
    owner: str
    # node.yaml's labels as the daemon runs with them (loaded at its start or last reload;
    # None: unknown, a note from before this field or a node file it could not read)
    labels: dict[str, str] | None = None
    devices: DaemonDevices | None = None  # None: unknown, a note from before this field
    # the newest record version the daemon reads
    records: int = _NOTED_SINCE


def _document(state_dir: Path) -> Document[DaemonSet]:
    state = StateDir(state_dir)
    return Document(state, state.daemon, _decode, _encode)


def _encode(d: DaemonSet) -> dict[str, Any]:
    doc: dict[str, Any] = {"pid": d.pid, "owner": d.owner, "labels": d.labels, "records": d.records}
    if d.devices is not None:
        doc["devices"] = {"static": d.devices.static}
    return doc


def note(state_dir: Path, running: DaemonSet) -> None:
    """Say which set the daemon runs (it holds ``daemon.lock``)."""
    _document(state_dir).write(running)


def owner_of(state_dir: Path, pid: int) -> str | None:
    """The owner the daemon of ``pid`` (the lock's holder) runs; None when its note is
    missing or another pid's (a daemon from before this note: its set is unknown)."""
    found = _document(state_dir).peek()
    return found.owner if found is not None and found.pid == pid else None


def labels_of(state_dir: Path, pid: int) -> dict[str, str] | None:
    """The labels the daemon of ``pid`` (the lock's holder) runs with; None when unknown."""
    found = _document(state_dir).peek()
    return found.labels if found is not None and found.pid == pid else None


def devices_of(state_dir: Path, pid: int) -> DaemonDevices | None:
    """The inventory the daemon of ``pid`` (the lock's holder) runs with; None: unknown."""
    found = _document(state_dir).peek()
    return found.devices if found is not None and found.pid == pid else None


def records_read_by(state_dir: Path, pid: int) -> int | None:
    """The newest record version the daemon of ``pid`` (the lock's holder) reads; None when
    its note is missing or another pid's (a daemon from before this note: unknown)."""
    found = _document(state_dir).peek()
    return found.records if found is not None and found.pid == pid else None


def _decode(data: Any) -> DaemonSet:
    pid, owner, labels = data["pid"], data["owner"], data.get("labels")
    records = data.get("records", _NOTED_SINCE)
    if not isinstance(pid, int) or isinstance(pid, bool) or not isinstance(owner, str):
        raise TypeError("pid must be an integer and owner a string")
    if not isinstance(records, int) or isinstance(records, bool):
        raise TypeError("records must be an integer")
    if labels is not None and not (
        isinstance(labels, dict) and all(isinstance(v, str) for v in labels.values())
    ):
        raise TypeError("labels must map strings to strings")
    return DaemonSet(
        pid=pid,
        owner=owner,
        labels=labels,
        devices=_devices(data.get("devices")),
        records=records,
    )


def _devices(data: Any) -> DaemonDevices | None:
    if data is None:  # a note from before this field
        return None
    if not isinstance(data, dict) or not isinstance(data.get("static", 0), str | None):
        raise TypeError("devices must be {static: a string or null}")
    return DaemonDevices(static=data["static"])


def daemon_pid(state_dir: Path) -> int | None:
    """The daemon holding ``<state>/daemon.lock``, or None when none runs (a shared
    ``flock`` probe: it conflicts with the daemon's only for its own instant)."""
    path = StateDir(state_dir).daemon_lock
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 32, 0).decode(errors="replace").strip()
            return int(text) if text.isdigit() else 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
