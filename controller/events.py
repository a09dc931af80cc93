"""The per-deployment event journal: append-only JSON lines, bounded in size.

A half-written last line (a crash mid-append) is skipped on read, never guessed at.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from controller import failpoints
from controller.records import check_name, write_atomic

MAX_BYTES = 64 * 1024  # past this the oldest half is dropped


class Journal:
    def __init__(self, state_dir: Path) -> None:
        self.folder = state_dir / "events"

    def path(self, name: str) -> Path:
        return self.folder / f"{check_name(name)}.jsonl"

    def append(self, name: str, action: str, reason: str, outcome: str, **extra: Any) -> None:
        event = {
            "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "action": action,
            "reason": reason,
            "outcome": outcome,
            **extra,
        }
        line = (json.dumps(event, default=str) + "\n").encode()
        failpoints.hit("events.append.before_write")
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self.path(name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, line)
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if size > MAX_BYTES:
            self._trim(path)

    def _trim(self, path: Path) -> None:
        data = path.read_bytes()
        keep = data[len(data) - MAX_BYTES // 2 :]
        keep = keep[keep.find(b"\n") + 1 :]  # start on a whole line
        write_atomic(path, keep)

    def read(self, name: str, last: int | None = None) -> list[dict[str, Any]]:
        try:
            lines = self.path(name).read_bytes().splitlines()
        except FileNotFoundError:
            return []
        events = []
        for line in lines:
            try:
                value = json.loads(line)
            except ValueError:
                continue  # a torn write: skip it rather than guess
            if isinstance(value, dict):
                events.append(value)
        return events[-last:] if last else events

    def remove(self, name: str) -> None:
        self.path(name).unlink(missing_ok=True)
