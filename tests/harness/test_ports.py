"""Test ports (procs.free_ports) are held, not only found free: a block one test process
holds is never handed to another, whichever worker or run asks, until it is given back.
Found free alone let two xdist workers take overlapping ranges at once (a CI flake:
a test's gateway found its port taken by another test's engine)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import procs
import pytest
from procs import BLOCK, PORTS, free_ports, held_ports, release_ports

# Takes a block's lock as another test process would; exit 0 if it got it, 1 if held.
TAKE = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError:
    sys.exit(1)
"""


@pytest.fixture(autouse=True)
def _locks_of_our_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This test's locks in a folder of its own: another worker taking a block just given
    back here would read as not given back."""
    monkeypatch.setattr(procs, "PORT_LOCKS", tmp_path / "locks")


def _taken_elsewhere(base: int) -> bool:
    lock = procs.PORT_LOCKS / f"{(base - PORTS[0]) // BLOCK}.lock"
    return subprocess.run([sys.executable, "-c", TAKE, str(lock)], check=False).returncode == 1


def test_a_held_block_is_no_other_process_s_until_given_back() -> None:
    one = free_ports()
    many = free_ports(40)  # three blocks
    try:
        assert one % BLOCK == many % BLOCK == PORTS[0] % BLOCK  # aligned blocks
        assert not set(range(one, one + BLOCK)) & set(range(many, many + 3 * BLOCK))
        assert {one, many} <= held_ports()
        for base in (one, many, many + BLOCK, many + 2 * BLOCK):
            assert _taken_elsewhere(base)
    finally:
        release_ports([one, many])
    assert not {one, many} & held_ports()
    for base in (one, many, many + BLOCK, many + 2 * BLOCK):
        assert not _taken_elsewhere(base)


def test_this_process_never_gets_a_block_it_holds_twice() -> None:
    bases = [free_ports(1) for _ in range(30)]
    try:
        assert len({b // BLOCK for b in bases}) == len(bases)
    finally:
        release_ports(bases)
