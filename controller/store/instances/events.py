"""The per-deployment event journal: append-only JSON lines, bounded in size.

One event is one ``\\n``-terminated JSON object, appended with a single ``write`` on
an ``O_APPEND`` descriptor. A crash mid-append leaves a last line without its
``\\n``: reads skip it (never guessed at), and the next append first terminates it,
so the torn bytes can never glue themselves to a good event. Past ``MAX_BYTES`` the
file is rewritten atomically with its newest whole lines (at most half the bound).
Writers are serialised by the pass lock (every action runs inside a pass).

A journal outlives its deployment: when a pass prunes a deployment's last record (its
manifest removed) the journal says so with a ``removed`` event, and a later deployment
of the same name is a new one (Kubernetes ties events to the object's uid). Read by
name (``events NAME``, ``describe``), a journal gives the deployment now under that name
its own events only: those after the last ``removed``, or, while none came after it,
the removed one's, ending with its removal. The whole file stays, bounded, for ``events``.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from controller import failpoints
from controller.store import diskspace, sidefiles
from controller.store.documents import write_atomic
from controller.store.instances.records import check_name
from controller.store.statedir import StateDir

MAX_BYTES = 64 * 1024  # past this the oldest lines are dropped, down to half
MAX_FIELD = 2048  # characters of one string field (an error, a log line...)
MAX_ITEMS = 20  # items of one list field (log lines)
REMOVED = "removed"  # the action of the event that ends a deployment's history
# Said to people (`events`): what happened, that it is as asked, and what comes after it
# (it read "a later one of this name has a history of its own", which said none of that).
REMOVED_OUTCOME = (
    "removed with its manifest, nothing of it runs now: its events end here"
    " (a new deployment of this name starts its own)"
)


def _clip(value: Any) -> Any:
    """Bound one field so a single event can never crowd the journal out."""
    if isinstance(value, str) and len(value) > MAX_FIELD:
        return value[: MAX_FIELD - 1] + "…"
    if isinstance(value, list | tuple):
        return [_clip(v) for v in list(value)[-MAX_ITEMS:]]
    return value


class Journal:
    def __init__(self, state_dir: Path) -> None:
        self.folder = StateDir(state_dir).events

    def path(self, name: str) -> Path:
        return self.folder / f"{check_name(name)}.jsonl"

    def append(self, name: str, action: str, reason: str, outcome: str, **extra: Any) -> None:
        """Journal one event; a journal that cannot be written is named at warning level
        and the action goes on (the journal is its history, never its condition)."""
        try:
            self._append(name, action, reason, outcome, **extra)
        except OSError as exc:
            if diskspace.full(exc):
                # dropped on a full disk so that the pass writing the records goes on
                diskspace.dropped(self.path(name))
            else:
                sidefiles.warn(self.path(name), f"events not journaled: {exc}")

    def problem(self) -> str | None:
        """Why the journals cannot be read at all (the folder is a file), or None."""
        folder = self.folder
        return sidefiles.not_a_folder(folder) if folder.exists() and not folder.is_dir() else None

    def _append(self, name: str, action: str, reason: str, outcome: str, **extra: Any) -> None:
        event = {
            "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "action": action,
            "reason": reason,
            "outcome": outcome,
            **extra,
        }
        line = (json.dumps({k: _clip(v) for k, v in event.items()}, default=str) + "\n").encode()
        failpoints.hit("events.append.before_write")
        self._write(self.path(name), line)

    def _write(self, path: Path, line: bytes) -> None:
        sidefiles.folder_for_write(self.folder)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line  # terminate a torn last line: it stays skipped
            _write_all(fd, line)
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if size > MAX_BYTES:
            self._trim(path)

    def _trim(self, path: Path) -> None:
        data = path.read_bytes()
        keep = data[len(data) - MAX_BYTES // 2 :]
        if len(keep) < len(data):
            keep = keep[keep.find(b"\n") + 1 :]  # start on a whole line
        write_atomic(path, keep)

    def names(self) -> list[str]:
        """The deployments that have a journal (only names this tool could have given:
        a file it did not write is never read by a name it did not give)."""
        out = []
        for path in sidefiles.listed(self.folder, "*.jsonl"):
            try:
                out.append(check_name(path.stem))
            except ValueError:
                continue
        return out

    def read(
        self, name: str, last: int | None = None, *, history: bool = False
    ) -> list[dict[str, Any]]:
        """The events of the deployment under ``name`` (``history``: of every deployment
        it named), oldest first (the newest ``last`` of them when given)."""
        try:
            data = self.path(name).read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:  # the folder is a file, the journal unreadable: none, named
            sidefiles.skipped(self.path(name), exc)
            return []
        events = []
        for line in data.split(b"\n")[:-1]:  # the part after the last \n is torn
            try:
                value = json.loads(line)
            except ValueError:
                continue  # a torn write: skip it rather than guess
            if isinstance(value, dict):
                events.append(value)
        if not history:
            events = _current(events)
        if last is None:
            return events
        return events[-last:] if last > 0 else []

    def remove(self, name: str) -> None:
        self.path(name).unlink(missing_ok=True)


def _current(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events since the last ``removed`` one; the removed deployment's history, up to
    and with its ``removed``, while no later deployment has an event."""
    ends = [i for i, event in enumerate(events) if event.get("action") == REMOVED]
    if not ends:
        return events
    if ends[-1] < len(events) - 1:
        return events[ends[-1] + 1 :]
    return events[ends[-2] + 1 :] if len(ends) > 1 else events


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
