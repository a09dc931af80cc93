"""The state dir's side files (``activation/``, ``restart/``, ``scale/``, ``events/``): one
rule for a folder that is not one and a file that cannot be used.

What they hold is input a pass can do without (a demand, a restart asked, a count, a
history), so a reader names the file at warning level and goes on as if it were absent
(once per version of the file: a daemon reads them every pass); a file that opens but
does not decode is quarantined instead by a pass, named and left by a read verb
(``documents.py``); a writer that cannot
write raises :class:`SideFileError` naming the path and the next move, and its caller
decides whether that fails a command (the CLI, the gateway's request) or is a warning.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

from controller.errors import ReconcileError
from controller.logsetup import get_logger

log = get_logger("reconcile")

_said: set[tuple[str, str]] = set()  # (path, problem) already warned about
_lock = threading.Lock()  # the gateway reads from its worker threads


class SideFileError(ReconcileError, OSError):
    """A side file or its folder cannot be written; the message names it and the fix."""


def folder_for_write(folder: Path) -> Path:
    """``folder``, made (0700) if missing; a file in its place is named, never guessed at."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        raise SideFileError(not_a_folder(folder)) from None
    return folder


def listed(folder: Path, pattern: str) -> Iterator[Path]:
    """The files of ``folder`` matching ``pattern``, sorted; a folder that is a file is
    warned about and lists nothing."""
    if folder.exists() and not folder.is_dir():
        warn(folder, not_a_folder(folder))
        return iter(())
    try:
        return iter(sorted(folder.glob(pattern)))
    except OSError as exc:
        warn(folder, f"cannot be listed: {exc.strerror or exc}")
        return iter(())


def skipped(path: Path, exc: Exception) -> None:
    """A side file that cannot be used: named once, then read as absent."""
    detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    problem = f"{type(exc).__name__}: {detail}" if isinstance(exc, KeyError) else detail
    warn(path, f"unreadable ({problem}); ignored until it is rewritten or removed")


def warn(path: Path, problem: str) -> None:
    key = (str(path), problem)
    with _lock:
        if key in _said:
            return
        _said.add(key)
    log.warning("state file skipped", file=str(path), problem=problem)


def not_a_folder(folder: Path) -> str:
    """What to say of a folder that is a file."""
    return (
        f"{folder} is not a folder: reconcile keeps its {folder.name} files there. Move it "
        "away (the next write makes the folder)"
    )
