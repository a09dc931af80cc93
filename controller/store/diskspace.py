"""A full disk must not stop the node: the reserve downloads leave, and the ballast.

A pull that filled the state dir's disk once left every later pass failing with
ENOSPC: an engine killed then was never restarted, and ``down`` could not write the
record that stops one. Two guards:

* Downloads leave :func:`reserve_bytes` free (``RECONCILE_DISK_RESERVE``, default
  1 GiB): a pull that would go below it is refused, or stopped, and its partial file
  dropped (``controller/pull``).
* The records' folder keeps a ballast, ``instances/.reserve`` (1 MiB of allocated
  blocks). When a state write meets a full disk anyway (something else filled it), the
  ballast is released and the write tried once more: records are small, so the passes
  that restart a dead engine and ``down`` still get written. Events are history, not
  state: on a full disk they are dropped. :func:`notes` tells the pass to say so; the
  next :meth:`Ballast.keep` with room to spare takes the ballast back.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path

from controller.errors import ConfigError
from controller.store.statedir import ballast

RESERVE_ENV = "RECONCILE_DISK_RESERVE"
DEFAULT_RESERVE = 1 << 30  # what a pull leaves free: records, journals, logs, the OS
BALLAST_BYTES = 1 << 20  # hundreds of record writes
FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}

# Ballasts this process keeps, by the device they are on (a write to that disk may use them).
_kept: dict[int, Path] = {}
_notes: dict[str, str] = {}  # what to warn of, by what it is about


def full(exc: BaseException) -> bool:
    """The error of a write to a full disk (or a full quota)."""
    return isinstance(exc, OSError) and exc.errno in FULL


def reserve_bytes() -> int:
    """The free space a download must leave (``RECONCILE_DISK_RESERVE``: bytes, or 500M, 2G)."""
    return parse_bytes(os.environ.get(RESERVE_ENV, ""), RESERVE_ENV) or DEFAULT_RESERVE


def parse_bytes(text: str, what: str) -> int | None:
    """``1073741824``, ``512M``, ``2G`` (binary units); empty: None."""
    value = text.strip().lower().removesuffix("ib").removesuffix("b")
    if not value:
        return None
    number, unit = (value[:-1], value[-1]) if value[-1] in UNITS else (value, "")
    if not number.isdigit():
        raise ConfigError(f"{what}={text!r} is not a size: write bytes or e.g. 512M, 2G")
    return int(number) * UNITS[unit]


class Ballast:
    """``<folder>/.reserve``: allocated space to give back when the disk fills up."""

    def __init__(self, folder: Path) -> None:
        self.path = ballast(folder)

    def keep(self) -> None:
        """Take the ballast (back) when the disk has room for it and some more."""
        with contextlib.suppress(OSError):
            _kept[os.stat(self.path.parent).st_dev] = self.path
            if self.path.exists() or shutil.disk_usage(self.path.parent).free < 8 * BALLAST_BYTES:
                return
            tmp = self.path.with_name(self.path.name + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.posix_fallocate(fd, 0, BALLAST_BYTES)  # real blocks, not a sparse file
            finally:
                os.close(fd)
            os.replace(tmp, self.path)


def release_for(path: Path) -> bool:
    """Free the ballast on ``path``'s disk; False when there is none left to free."""
    try:
        ballast = _kept.get(os.stat(path.parent).st_dev)
        if ballast is None:
            return False
        full, move = _ran_out(ballast.parent)  # before the unlink gives an inode back
        ballast.unlink()
    except OSError:
        return False
    _notes[str(ballast)] = (
        f"the disk of {ballast.parent} {full}: its reserve ({ballast}, 1 MiB) was "
        f"released so records can still be written; {move}"
    )
    return True


def dropped(path: Path) -> None:
    """An optional write (an event) was skipped on a full disk."""
    full, move = _ran_out(path.parent)
    _notes[f"dropped {path.parent}"] = (
        f"the disk of {path.parent} {full}: events are not being recorded there; {move}"
    )


def _ran_out(folder: Path) -> tuple[str, str]:
    """What the disk of ``folder`` ran out of, and the move. Out of inodes, it has free
    space (`df` shows it), and "free some space there" sent one looking for bytes."""
    with contextlib.suppress(OSError):
        disk = os.statvfs(folder)
        if disk.f_files > 0 and disk.f_favail == 0:  # f_files 0: a disk without a count
            return "has no free inode left (`df -i`)", "remove files there"
    return "is full", "free some space there"


def notes() -> list[str]:
    """What a full disk cost since the last call, said once per pass (then forgotten)."""
    out = list(_notes.values())
    _notes.clear()
    return out
