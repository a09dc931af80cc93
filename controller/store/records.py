"""Records: the observed state of each deployment, one JSON file each, and their store.

Records ARE the lease on devices and ports. Writes are atomic and durable
(tmp -> fsync -> rename -> fsync(dir)); a record that cannot be parsed is moved
to ``quarantine/`` with the reason, never guessed at.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller import failpoints
from controller.core.manifest.names import record_name_ok
from controller.core.state import VERSION, Record
from controller.errors import RecordError
from controller.store import diskspace, security
from controller.store.recordjson import READERS, RecordInvalid, to_json


@dataclass(frozen=True, slots=True)
class RecordProblem:
    path: str
    message: str
    name: str | None = None
    # Devices and ports a record of an unknown version seems to hold: still leased.
    devices: tuple[str, ...] = ()
    ports: tuple[int, ...] = ()
    nonce: str | None = None  # its engine's marker nonce: that engine is no orphan
    kept: bool = False  # left in place (unknown version), not quarantined


@dataclass
class Snapshot:
    records: dict[str, Record] = field(default_factory=dict)
    problems: list[RecordProblem] = field(default_factory=list)
    # name -> (mtime_ns, size): cheap change detection for the lock's re-read
    stamps: dict[str, tuple[int, int]] = field(default_factory=dict)


def check_name(name: str) -> str:
    """Invariant 9: only DNS-1123 labels (plus the reserved ``@next``) become file names."""
    if not record_name_ok(name):
        raise RecordError(f"refusing unsafe deployment name {name!r}")
    return name


def write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    # Unique per writer thread too (the gateway writes from a pool); the pid stays the
    # last field before ".tmp": sweep_tmp reads it to find a dead writer's leftovers.
    tmp = path.with_name(f".{path.name}.{threading.get_ident()}.{os.getpid()}.tmp")
    try:
        _write_tmp(tmp, data, mode)
    except OSError as exc:  # a full disk: the ballast's room, then once more
        if not diskspace.full(exc) or not diskspace.release_for(path):
            raise
        _write_tmp(tmp, data, mode)
    try:
        failpoints.hit("records.write.before_rename")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    failpoints.hit("records.write.before_dir_fsync")
    fsync_dir(path.parent)


def _write_tmp(tmp: Path, data: bytes, mode: int) -> None:
    """The whole of ``data`` in ``tmp``, synced; on failure no tmp file is left."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data)
        while view:  # a short write is what a nearly full disk gives
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    os.close(fd)


def sweep_tmp(folder: Path) -> None:
    """Remove the tmp files of writers that died between write and rename (SIGKILL).
    A folder that is a file has none (events/: the journal names it when it writes)."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in os.scandir(folder):
            pid = entry.name.rsplit(".", 2)[-2] if entry.name.endswith(".tmp") else ""
            if entry.name.startswith(".") and pid.isdigit() and not _pid_alive(int(pid)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class RecordStore:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.instances = state_dir / "instances"
        self.logs = self.instances / "logs"
        self.quarantine_dir = state_dir / "quarantine"
        self.runs = state_dir / "run"  # engines' runtime dirs (runtime_dir)

    def ensure(self) -> None:
        events = self.state_dir / "events"
        # Before creating anything in them: root must not write where another user can.
        security.check_state_dir((self.state_dir, self.instances, self.logs, events))
        # The runtime dirs' parent too: mkdir(parents=True) under it would use 0777.
        for folder in (self.state_dir, self.instances, self.logs, self.quarantine_dir, self.runs):
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.state_dir, 0o700)
        for folder in (self.state_dir, self.instances, events):
            sweep_tmp(folder)
        diskspace.Ballast(self.instances).keep()

    def path(self, name: str) -> Path:
        return self.instances / f"{check_name(name)}.json"

    def runtime_dir(self, name: str) -> Path:
        """An instance's private scratch folder (unix sockets, caches), given to its recipe."""
        return self.runs / check_name(name)

    def log_path(self, name: str) -> Path:
        return self.logs / f"{check_name(name)}.log"

    def write(self, record: Record) -> None:
        write_atomic(self.path(record.name), to_json(record))

    def delete(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path(name).unlink()
            failpoints.hit("records.delete.after_unlink")
            fsync_dir(self.instances)

    def read(self, name: str) -> Record | None:
        snap = Snapshot()
        self._read_one(self.path(name), snap)
        return snap.records.get(name)

    def load(self) -> Snapshot:
        snap = Snapshot()
        try:
            entries = list(os.scandir(self.instances))
        except FileNotFoundError:
            return snap
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.name.endswith(".json") and not entry.name.startswith("."):
                self._read_one(Path(entry.path), snap)
        return snap

    def _read_one(self, path: Path, snap: Snapshot) -> None:
        try:
            info = path.stat()
            raw = path.read_bytes()
        except FileNotFoundError:
            return
        name = path.name.removesuffix(".json")
        try:
            data = json.loads(raw)
        except ValueError as exc:
            self._quarantine(path, snap, f"not valid JSON: {exc}")
            return
        # Not an object at all: no version to respect, so a corrupt record of ours.
        version = data.get("version") if isinstance(data, dict) else VERSION
        reader = READERS.get(version) if isinstance(version, int) else None
        if reader is None:
            snap.problems.append(_unknown_version(path, name, data))
            return
        try:
            record = reader(data)
        except RecordInvalid as exc:
            self._quarantine(path, snap, f"not a valid record: {exc}")
            return
        if record.name != name:
            self._quarantine(path, snap, f"holds name {record.name!r}, file says {name!r}")
            return
        snap.records[name] = record
        snap.stamps[name] = (info.st_mtime_ns, info.st_size)

    def quarantined_at(self, name: str) -> float | None:
        """When ``name``'s record was last quarantined (its reason file's mtime), or None."""
        stamps = []
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.quarantine_dir):
                if entry.name.startswith(f"{name}.json.") and entry.name.endswith(".reason"):
                    with contextlib.suppress(FileNotFoundError):
                        stamps.append(entry.stat().st_mtime)
        return max(stamps, default=None)

    def _quarantine(self, path: Path, snap: Snapshot, reason: str) -> None:
        """Move a record we cannot trust aside (with the reason beside it), never guess."""
        self.quarantine_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S")
        target = self.quarantine_dir / f"{path.name}.{stamp}.{os.getpid()}"
        try:
            os.replace(path, target)
            write_atomic(target.with_name(target.name + ".reason"), reason.encode() + b"\n")
        except FileNotFoundError:
            return
        name = path.name.removesuffix(".json")
        message = f"record moved to {target}: {reason}"
        snap.problems.append(RecordProblem(str(path), message, name))


def _unknown_version(path: Path, name: str, data: Any) -> RecordProblem:
    version = data.get("version") if isinstance(data, dict) else None
    devices = data.get("devices") if isinstance(data, dict) else None
    port = data.get("port") if isinstance(data, dict) else None
    message = (
        f"record {path} has version {version!r}; this reconcile understands versions "
        f"{', '.join(map(str, sorted(READERS)))}. Run the reconcile that wrote it, or stop "
        "its engine and move the file away"
    )
    held = tuple(d for d in devices if isinstance(d, str)) if isinstance(devices, list) else ()
    ports = (port,) if isinstance(port, int) else ()
    nonce = data.get("nonce") if isinstance(data, dict) else None
    nonce = nonce if isinstance(nonce, str) else None
    return RecordProblem(str(path), message, name, held, ports, nonce, kept=True)
