"""A real small disk for a test: a tmpfs mounted on a folder (root, or CAP_SYS_ADMIN).

A full disk is not something to fake: ENOSPC, the free space a pull sees and a record
write that fails all come from the kernel here. Without the right to mount, the test
is skipped with the reason (as tests/integration's small_disk is).
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(folder: Path, size: str, inodes: int | None = None) -> Iterator[Path]:
    """``folder`` (created) as a tmpfs of ``size`` (``20m``), mode 0700, until the end;
    ``inodes``: that many files at most."""
    folder.mkdir(parents=True, exist_ok=True)
    options = f"size={size},mode=700" + (f",nr_inodes={inodes}" if inodes else "")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[Path]:
    """``folder`` bind-mounted on itself read-only until the end: writes through its path
    fail with EROFS, as on a disk the kernel remounted read-only after an error (root)."""
    steps = (
        ["mount", "--bind", str(folder), str(folder)],
        ["mount", "-o", "remount,ro,bind", str(folder)],
    )
    for step in steps:
        done = _mount(step)
        if done.returncode != 0:
            if step is not steps[0]:
                subprocess.run(["umount", str(folder)], check=True)
            pytest.skip(f"cannot mount {folder} read-only here: {done.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def _mount(step: list[str]) -> subprocess.CompletedProcess[bytes]:
    """Run ``step``; a remount read-only that a write in progress through the mount makes
    fail ("mount point is busy": a daemon writing a record that instant) is tried again
    until that write is done, 10 s at most (it skipped a test under load, once its engine
    had started)."""
    deadline = time.monotonic() + 10
    while True:
        done = subprocess.run(step, capture_output=True)
        if done.returncode == 0 or b"busy" not in done.stderr or time.monotonic() > deadline:
            return done
        time.sleep(0.05)


def fill_inodes(folder: Path) -> Path:
    """Make empty files in ``folder/inodes`` until no inode is left: bytes stay free."""
    many = folder / "inodes"
    many.mkdir()
    with contextlib.suppress(OSError):
        for n in range(1 << 20):
            (many / str(n)).touch()
    return many


def fill(folder: Path, name: str = "filler") -> Path:
    """Write ``folder/name`` until the disk is full (ENOSPC): what a runaway log does."""
    filler = folder / name
    with filler.open("ab", buffering=0) as out, contextlib.suppress(OSError):
        while True:
            out.write(b"\0" * 4096)
    return filler
