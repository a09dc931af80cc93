"""What YAML made of each manifest file, keyed by the file's bytes (sha256).

Parsing is the bulk of a pass that changes nothing: importing PyYAML and composing
node by node (bounded, with lines) costs ~30 ms for 20 files, each pass, for files
that rarely change. The cache holds each file's documents as JSON (values and the
line of each path), under ``<state-dir>/cache/manifests.json``; a file whose bytes
are not there, or whose values JSON cannot hold (a YAML timestamp...), is parsed as
before. Keyed by content, never by mtime: an edit within the same second is seen.
Validation, hashing and every check after it still run on every pass.

Losing the file costs one parse; a torn write is impossible (temp file + rename);
unreadable or foreign content is ignored. Entries of files no longer read are
dropped at the next write, and a pass that parses nothing new writes nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from controller import __version__
from controller.core.digest import sha256_hex
from controller.store.sources.bounded import Document

# Bump when what yamlread returns changes shape or meaning (2: a field's line is its key's).
FORMAT = 2


class ParseCache:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._stored: dict[str, Any] = self._read()
        self._used: dict[str, Any] = {}
        self._added = False

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_bytes())
        except (OSError, ValueError):
            return {}
        fits = isinstance(data, dict) and data.get("key") == _key()
        docs = data.get("docs") if fits else None
        return docs if isinstance(docs, dict) else {}

    def get(self, raw: bytes) -> list[Document] | None:
        digest = sha256_hex(raw)
        entry = self._stored.get(digest)
        if entry is None:
            return None
        try:
            docs = [
                (value, {tuple(p): line for p, line in lines}, first)
                for value, lines, first in entry
            ]
        except (TypeError, ValueError):
            return None  # not ours: parse the file instead
        self._used[digest] = entry
        return docs

    def put(self, raw: bytes, docs: list[Document]) -> None:
        if not all(_plain(value) for value, _, _ in docs):
            return
        entry = [
            [value, [[list(p), line] for p, line in lines.items()], first]
            for value, lines, first in docs
        ]
        self._used[sha256_hex(raw)] = entry
        self._added = True

    def save(self) -> None:
        """Write what this load used, if it parsed something new or dropped an entry."""
        if not (self._added or set(self._stored) - set(self._used)):
            return
        data = json.dumps({"key": _key(), "docs": self._used}, separators=(",", ":")).encode()
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(mode=0o700, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # env may hold secrets
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError:  # a read-only state dir: parse again next time
            with contextlib.suppress(OSError):
                tmp.unlink()


def _key() -> str:
    return f"{FORMAT}/{__version__}"


def _plain(value: Any) -> bool:
    """True when JSON gives ``value`` back as it is (str keys, no dates, no sets...)."""
    if value is None or isinstance(value, str | bool | int):
        return True
    if isinstance(value, float):
        return value == value and value not in (float("inf"), float("-inf"))
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False
