"""Records: the observed state of each deployment, one JSON file each, and their store.

Records ARE the lease on devices and ports. Writes are atomic and durable
(tmp -> fsync -> rename -> fsync(dir)); a record that cannot be parsed is moved
to ``quarantine/`` with the reason, never guessed at.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller import failpoints
from controller.core.manifest.names import next_name, record_name_ok
from controller.core.state import VERSION, Record
from controller.errors import RecordError
from controller.store import diskspace, sidefiles
from controller.store.documents import fsync_dir, quarantine, sweep_tmp, write_atomic
from controller.store.instances.recordjson import (
    READERS,
    NotJSON,
    RecordInvalid,
    UnknownVersion,
    from_json,
    to_json,
)
from controller.store.sources import security
from controller.store.statedir import StateDir


@dataclass(frozen=True, slots=True)
class RecordProblem:
    path: str
    message: str
    name: str | None = None
    # Devices and ports a record of an unknown version seems to hold: still leased.
    devices: tuple[str, ...] = ()
    ports: tuple[int, ...] = ()
    nonce: str | None = None  # its engine's marker nonce: that engine is no orphan
    kept: bool = False  # a pass leaves it in place too (unknown version): never planned over

    @property
    def torn(self) -> bool:
        """A record that cannot be read at all (not one of an unknown version, which says
        what it holds): what it held only its engine's environment tells."""
        return not self.kept

    @property
    def holder(self) -> str:
        """Who holds its devices and ports, as a pass's messages and `devices` name it."""
        return f"{self.name} (unreadable record)"


def held_by_unreadable(problems: Iterable[RecordProblem]) -> tuple[dict[str, str], dict[int, str]]:
    """The devices and ports records of an unknown version hold (each -> its holder): held
    for every pass, and shown held by `devices` and the page, since their engines run on."""
    devices: dict[str, str] = {}
    ports: dict[int, str] = {}
    for problem in problems:
        devices.update(dict.fromkeys(problem.devices, problem.holder))
        ports.update(dict.fromkeys(problem.ports, problem.holder))
    return devices, ports


@dataclass
class Snapshot:
    records: dict[str, Record] = field(default_factory=dict)
    problems: list[RecordProblem] = field(default_factory=list)
    # name -> (mtime_ns, size): cheap change detection for the lock's re-read
    stamps: dict[str, tuple[int, int]] = field(default_factory=dict)


# What a scan does with a record it cannot read: (path, the snapshot, why) -> None.
SetAside = Callable[[Path, "Snapshot", str], None]


def check_name(name: str) -> str:
    """Invariant 9: only DNS-1123 labels (plus the reserved ``@next``) become file names."""
    if not record_name_ok(name):
        raise RecordError(f"refusing unsafe deployment name {name!r}")
    return name


class RecordStore:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.layout = StateDir(state_dir)
        self.instances = self.layout.instances
        self.logs = self.layout.logs
        self.quarantine_dir = self.layout.quarantine
        self.runs = self.layout.runs  # engines' runtime dirs (runtime_dir)

    def ensure(self) -> None:
        events, notes = self.layout.events, self.layout.spawn_notes
        # Before creating anything in them: root must not write where another user can
        # (a spawn note is written at every spawn, as root where root runs reconcile).
        security.check_state_dir((self.state_dir, self.instances, self.logs, events, notes))
        # The runtime dirs' parent too: mkdir(parents=True) under it would use 0777.
        for folder in (self.state_dir, self.instances, self.logs, self.quarantine_dir, self.runs):
            try:
                folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            except FileExistsError:  # a file in its place: mkdir's "File exists" said no more
                raise RecordError(sidefiles.not_a_folder(folder)) from None
        if self.state_dir.stat().st_mode & 0o777 != 0o700:  # a chmod is an event in a watch
            os.chmod(self.state_dir, 0o700)
        for folder in (self.state_dir, self.instances, events, notes):
            sweep_tmp(folder)
        diskspace.Ballast(self.instances).keep()

    def path(self, name: str) -> Path:
        return self.instances / f"{check_name(name)}.json"

    def runtime_dir(self, name: str) -> Path:
        """An instance's private scratch folder (unix sockets, caches), given to its recipe."""
        return self.runs / check_name(name)

    def remove_runtime_dirs(self, instance: str) -> None:
        """Once no record of ``instance`` is left: its runtime dir and its ``@next``'s,
        which its engine keeps using once promoted (what an engine left there is its
        scratch, of no use to the next)."""
        for name in (instance, next_name(instance)):
            shutil.rmtree(self.runtime_dir(name), ignore_errors=True)

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
        self._read_one(self.path(name), snap, self._quarantine)
        return snap.records.get(name)

    def load(self) -> Snapshot:
        """Every record, for a pass: one that cannot be read is quarantined (named)."""
        return self._scan(self._quarantine)

    def peek(self) -> Snapshot:
        """Every record, for a reader that must change nothing (``status``, ``describe``,
        ``devices``, ``plan``): one that cannot be read is named where it lies, and left
        there for the next pass to set aside (kubectl get never mutates either)."""
        return self._scan(self._left_in_place)

    def older(self, owner: str) -> list[str]:
        """``owner``'s records that an older reconcile wrote (a pass writes them back as
        this version), by the version their files say; a file that cannot be read is the
        pass's to set aside, not named here."""
        names = []
        for path in sorted(self.instances.glob("*.json")):
            with contextlib.suppress(OSError, ValueError):
                data = json.loads(path.read_bytes())
                if not isinstance(data, dict) or data.get("owner") != owner:
                    continue
                version = data.get("version")
                if isinstance(version, int) and version < VERSION:
                    names.append(path.stem)
        return names

    def _scan(self, bad: SetAside) -> Snapshot:
        snap = Snapshot()
        try:
            entries = list(os.scandir(self.instances))
        except FileNotFoundError:
            return snap
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.name.endswith(".json") and not entry.name.startswith("."):
                self._read_one(Path(entry.path), snap, bad)
        return snap

    def _read_one(self, path: Path, snap: Snapshot, bad: SetAside) -> None:
        try:
            info = path.stat()
            raw = path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as exc:  # a folder in its place, EIO: as a torn record, not the
            bad(path, snap, f"unreadable: {exc.strerror or exc}")  # whole node's failure
            return
        name = path.name.removesuffix(".json")
        try:
            record = from_json(raw)
        except UnknownVersion as exc:
            snap.problems.append(_unknown_version(path, name, exc.data))
            return
        except NotJSON as exc:
            bad(path, snap, str(exc))
            return
        except RecordInvalid as exc:
            bad(path, snap, f"not a valid record: {exc}")
            return
        if record.name != name:
            bad(path, snap, f"holds name {record.name!r}, file says {name!r}")
            return
        snap.records[name] = record
        snap.stamps[name] = (info.st_mtime_ns, info.st_size)

    def torn_since(self, name: str) -> float | None:
        """Since when ``name``'s record is known torn: quarantined by a pass (then), or
        torn where it lies, as a reader's ``peek`` leaves it (now); None: neither."""
        since = self.quarantined_at(name)
        if since is not None:
            return since
        torn: list[str] = []
        self._read_one(self.instances / f"{name}.json", Snapshot(), lambda *a: torn.append(a[2]))
        return time.time() if torn else None

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
        target = quarantine(self.layout, path, reason)
        if target is not None:
            name = path.name.removesuffix(".json")
            message = f"record moved to {target}: {reason}"
            snap.problems.append(RecordProblem(str(path), message, name))

    def _left_in_place(self, path: Path, snap: Snapshot, reason: str) -> None:
        """Name a record we cannot trust, touching nothing: a pass moves it aside."""
        message = (
            f"record {path} cannot be read ({reason}); left as it is: the next pass "
            f"(`reconcile --once`, or the daemon's) moves it to {self.quarantine_dir}/ and "
            "takes back its engine if one still runs"
        )
        snap.problems.append(RecordProblem(str(path), message, path.name.removesuffix(".json")))


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
