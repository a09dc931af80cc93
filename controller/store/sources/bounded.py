"""Bounded file reads and the paths of values in a document, with their lines (no yaml).

A manifest file costs at most MAX_FILE_BYTES to read; what YAML makes of it is
store/sources/yamlread.py's (imported only when a file is not in the parse cache).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from controller.core.manifest import excerpt
from controller.store.sources import security

MAX_FILE_BYTES = 1 << 20  # 1 MiB: a manifest is a few hundred bytes

Path_ = tuple[str | int, ...]
Document = tuple[Any, dict[Path_, int], int]  # (value, line of each path, first line)


def field_path(loc: Sequence[str | int]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + excerpt.key(item))
    return "".join(parts)


def line_for(lines: dict[Path_, int], loc: Sequence[str | int]) -> int | None:
    # Pydantic reports paths like ('spec', 'devices', 'count'); fall back to the
    # nearest ancestor that exists in the YAML (a missing field points at its parent).
    probe = tuple(loc)
    while probe:
        if probe in lines:
            return lines[probe]
        probe = probe[:-1]
    return lines.get(())


def _inside_folder(path: Path) -> Path:
    """The target of a symlinked manifest, if it stays in the manifest's folder.

    A symlink within the folder is fine (a Kubernetes ConfigMap mount is made of
    them); one that leaves it is refused unread, so no error message can ever quote
    a file the folder does not own (``ln -s /etc/shadow m/x.yaml``).
    """
    target = path.resolve()
    if not target.is_relative_to(path.parent.resolve()):
        raise OSError(
            f"a symlink to {excerpt.short(str(target), 80)}, outside the manifests folder: "
            "refused unread (put the file itself in the folder)"
        )
    return target


# The move for a file past a bound: a folder's files are read together, so its documents
# may as well be in several (a thousand deployments in one file passed none).
SPLIT = " of a file: split its documents into several files"


def read_bounded(path: Path, strict: bool = False) -> bytes:
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        fd = os.open(_inside_folder(path), flags)
    try:
        info = os.fstat(fd)
        if strict:  # as root: the file we opened, not a path someone could swap
            security.check_manifest(info)
        if stat.S_ISDIR(info.st_mode):  # `-f` reads a folder's files, not its subfolders'
            raise OSError("a folder, not a file: name it its own -f, or rename it")
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"not a regular file (mode {stat.filemode(info.st_mode)})")
        if info.st_size > MAX_FILE_BYTES:
            raise OSError(f"{info.st_size} bytes is over the {MAX_FILE_BYTES}-byte limit{SPLIT}")
        data = os.read(fd, MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise OSError(f"over the {MAX_FILE_BYTES}-byte limit{SPLIT}")
    return data
