"""The marker scan's memory of unmarked processes: what it reads again, and what it skips."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from procs import execed

from controller.host import procscan
from controller.host.procscan import EnvironScan


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait(timeout=10)


def _sleeper(procs: list[subprocess.Popen[bytes]], **env: str) -> int:
    proc = subprocess.Popen(["sleep", "600"], env={**os.environ, **env})
    procs.append(proc)
    return execed(proc.pid)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every pid whose environment the scanner reads."""
    seen: list[int] = []
    real = procscan.environ

    def counting(pid: int) -> bytes | None:
        seen.append(pid)
        return real(pid)

    monkeypatch.setattr(procscan, "environ", counting)
    return seen


def _now(monkeypatch: pytest.MonkeyPatch, value: float) -> None:
    monkeypatch.setattr(procscan.time, "monotonic", lambda: value)


def test_marked_processes_are_found_and_read_every_time(
    children: Any, reads: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    needle = f"BENCH_T_{uuid.uuid4().hex}=x".encode()
    marked = _sleeper(children, **{needle.decode().split("=")[0]: "x"})
    scan = EnvironScan()
    for t in (0.0, 5.0, 10.0):
        _now(monkeypatch, t)
        assert [pid for pid, _ in scan(needle)] == [marked]
    assert reads.count(marked) == 3


def test_an_unmarked_process_is_skipped_once_a_late_read_settled_it(
    children: Any, reads: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = _sleeper(children)
    scan = EnvironScan()
    needle = f"BENCH_T_{uuid.uuid4().hex}=x".encode()
    _now(monkeypatch, 100.0)
    list(scan(needle))  # first seen: maybe between fork and exec, so not trusted yet
    _now(monkeypatch, 100.5)
    list(scan(needle))
    assert reads.count(plain) == 2
    _now(monkeypatch, 101.5)
    list(scan(needle))  # read SETTLE s after first seen: now trusted
    _now(monkeypatch, 200.0)
    list(scan(needle))
    assert reads.count(plain) == 3


def test_a_new_process_on_a_known_pid_is_read_again(
    children: Any, reads: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = _sleeper(children)
    scan = EnvironScan()
    needle = b"BENCH_T_NEVER=x"
    for t in (0.0, 2.0):
        _now(monkeypatch, t)
        list(scan(needle))
    settled = scan._unmarked[plain]
    # The same pid under another /proc inode is another process: read it again.
    scan._unmarked[plain] = procscan._Unmarked(settled.inode + 1, 0.0, True)
    _now(monkeypatch, 4.0)
    list(scan(needle))
    assert reads.count(plain) == 3


def test_a_new_needle_forgets_what_it_knew(
    children: Any, reads: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = _sleeper(children)
    scan = EnvironScan()
    for t in (0.0, 2.0):
        _now(monkeypatch, t)
        list(scan(b"BENCH_T_A=x"))
    _now(monkeypatch, 4.0)
    list(scan(b"BENCH_T_B=x"))
    assert reads.count(plain) == 3


def test_the_scanner_skips_itself() -> None:
    needle = f"{sys.executable}".encode()  # in our own environment? never reported
    assert os.getpid() not in {pid for pid, _ in EnvironScan()(needle)}
