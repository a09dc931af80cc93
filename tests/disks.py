"""A real small disk for a test: a tmpfs mounted on a folder (root, or CAP_SYS_ADMIN).

A full disk is not something to fake: ENOSPC, the free space a pull sees and a record
write that fails all come from the kernel here. Without the right to mount, the test
is skipped with the reason (as tests/integration's small_disk is).
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """``folder`` (created) as a tmpfs of ``size`` (``20m``), mode 0700, until the end."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=700", "tmpfs", str(folder)],
        capture_output=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def fill(folder: Path, name: str = "filler") -> Path:
    """Write ``folder/name`` until the disk is full (ENOSPC): what a runaway log does."""
    filler = folder / name
    with filler.open("ab", buffering=0) as out, contextlib.suppress(OSError):
        while True:
            out.write(b"\0" * 4096)
    return filler
