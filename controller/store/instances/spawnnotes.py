"""Spawn notes: ``<state>/spawnnotes/<nonce>.json``, what an engine's spawn knew of it.

A process engine's marker (``RECONCILE_INSTANCE``) is in its environment, and only root
outside any user namespace reads the environment of a process that is not dumpable (a
file-capability or setuid program, one that calls ``prctl(PR_SET_DUMPABLE, 0)``). Such
an engine whose record is lost (deleted, a state dir restored from a backup, a pass
killed between the spawn and the record's write) would be found by no other user's
scan. So the spawn notes, before its child execs the engine (no engine runs unnoted:
``backends/local/execgate.py``), the engine's identity (pid and start time, invariant 6)
and the few variables a pass reads from an environment (the marker, the state dir, the
owner, ``PORT``, the device lists): a scan that may not read a live engine's
environment reads them here (``LocalBackend.scan``). A note is a file
under the state dir, as a record is: it lets a pass adopt its engine, never signal it.

A note whose process is gone is nothing (that identity never runs again): the next
teardown removes it (a scan only reads). No secret is noted: only the variables named
by the caller. A note also names the engine's cgroup, where it has one
(``host/cgroups.py``): a note lives from the spawn to the teardown after the engine's
end, as long as the cgroup must be found (its escaped children killed, then removed).
Kept here, not in the record: a record's reader refuses a field it does not know, so
an older daemon running through an upgrade would quarantine the record; a note's
reader reads the fields it knows.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.core.state import ProcessRef
from controller.store.documents import Folder, check_version, peek_document
from controller.store.statedir import StateDir

VERSION = 1


@dataclass(frozen=True, slots=True)
class SpawnNote:
    nonce: str
    ref: ProcessRef
    env: Mapping[str, str]  # the variables the spawn noted, as it gave them
    cgroup: str | None = None  # the engine's cgroup v2 folder (None: it runs in none)

    def environ(self) -> bytes:
        """``env`` spelled as ``/proc/<pid>/environ`` spells an environment."""
        return b"".join(f"{k}={v}".encode(errors="surrogateescape") + b"\0"
                        for k, v in self.env.items())  # fmt: skip


def _decode(data: Any, nonce: str) -> SpawnNote:
    check_version(data, VERSION)
    ref, env = data["ref"], data["env"]
    if not all(isinstance(v, str) for v in (*env, *env.values())):
        raise TypeError("env holds a value that is not a string")
    process = ProcessRef(
        pid=_typed(ref["pid"], int),
        start_time=float(_typed(ref["start_time"], (int, float))),
        start_ticks=_maybe(ref.get("start_ticks"), int),
        boot_id=_maybe(ref.get("boot_id"), str),
    )
    return SpawnNote(nonce=nonce, ref=process, env=dict(env),
                     cgroup=_maybe(data.get("cgroup"), str))  # fmt: skip


def _typed(value: Any, kind: type | tuple[type, ...]) -> Any:
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(f"{value!r} is not a {kind}")
    return value


def _maybe(value: Any, kind: type) -> Any:
    return None if value is None else _typed(value, kind)


def _encode(note: SpawnNote) -> dict[str, Any]:
    ref = note.ref
    return {
        "version": VERSION,
        "ref": {"pid": ref.pid, "start_time": ref.start_time, "start_ticks": ref.start_ticks,
                "boot_id": ref.boot_id},
        "env": dict(note.env),
        **({"cgroup": note.cgroup} if note.cgroup is not None else {}),
    }  # fmt: skip


class SpawnNotes:
    """The spawn notes of one state dir. A note is written once, so one read of it is kept
    by its file's inode: a scan (every sweep's poll) lists the folder and reads only new
    notes."""

    def __init__(self, state_dir: Path) -> None:
        state = StateDir(state_dir)
        self._folder = Folder(state, state.spawn_notes, _decode, _encode)
        self._read: dict[str, tuple[int, SpawnNote | None]] = {}  # nonce -> (inode, note)

    def write(self, note: SpawnNote) -> None:
        self._folder.write(note.nonce, note)

    def read_all(self) -> list[SpawnNote]:
        """Every note that decodes; one that does not is named once and left in place (a
        reader's scan reads them too, and must move nothing)."""
        read: dict[str, tuple[int, SpawnNote | None]] = {}
        for nonce, path in self._folder.files():
            try:
                inode = path.stat().st_ino
            except OSError:
                continue  # removed meanwhile: its process is gone
            kept = self._read.get(nonce)
            if kept is None or kept[0] != inode:
                kept = (inode, peek_document(path, functools.partial(_decode, nonce=nonce)))
            read[nonce] = kept
        self._read = read
        return [note for _, note in read.values() if note is not None]

    def forget(self, nonce: str) -> None:
        """Remove ``nonce``'s note; one this user may not remove stays (its reader goes on)."""
        with contextlib.suppress(OSError):
            self._folder.forget(nonce)
