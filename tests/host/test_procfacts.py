"""The psutil path for process facts (hosts without /proc): the same answers as /proc."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator

import psutil
import pytest
from procs import execed, proc_state, wait_for

from controller.errors import ConfigError
from controller.host import procpsutil, procscan, procstat
from controller.host.procscan import EnvironScan


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    marker = f"RECONCILE_TEST_MARK={uuid.uuid4().hex}"
    key, _, value = marker.partition("=")
    proc = subprocess.Popen(["sleep", "600"], env={**os.environ, key: value})
    proc.marker = marker.encode()  # type: ignore[attr-defined]
    execed(proc.pid)  # the environment is the new one
    wait_for(lambda: proc_state(proc.pid) == "S", what="sleep asleep")  # past its loader
    yield proc
    proc.kill()
    proc.wait(timeout=10)


@pytest.fixture
def forced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(procpsutil, "ACTIVE", True)


def test_stat_matches_proc(child: subprocess.Popen[bytes], forced: None) -> None:
    fast = _proc_stat(child.pid)
    slow = procstat.stat(child.pid)
    assert slow is not None and slow.start_ticks is None  # no ticks: start times compare
    assert abs(slow.start_time - fast.start_time) < 0.05
    assert (slow.ppid, slow.state) == (os.getpid(), "S")
    child.kill()
    time.sleep(0.2)
    gone = procstat.stat(child.pid)
    assert gone is not None and gone.state == "Z"  # not reaped yet: a zombie, like /proc
    child.wait()
    assert procstat.stat(child.pid) is None


def _proc_stat(pid: int) -> procstat.Stat:
    active, procpsutil.ACTIVE = procpsutil.ACTIVE, False
    try:
        st = procstat.stat(pid)
    finally:
        procpsutil.ACTIVE = active
    assert st is not None
    return st


def test_environ_and_the_marker_scan(child: subprocess.Popen[bytes], forced: None) -> None:
    marker: bytes = child.marker  # type: ignore[attr-defined]
    env = procscan.environ(child.pid)
    assert env is not None and marker + b"\0" in env
    with open(f"/proc/{child.pid}/environ", "rb") as f:
        assert set(env.split(b"\0")) == set(f.read().split(b"\0"))
    found = dict(EnvironScan()(marker))
    assert list(found) == [child.pid]
    assert procscan.environ(1 << 30) is None


def test_a_bad_choice_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(procpsutil, "_choice", "sysctl")
    with pytest.raises(ConfigError, match="RECONCILE_PROCFS='sysctl'"):
        procpsutil.check_supported()


def test_a_platform_neither_path_supports_is_refused(
    monkeypatch: pytest.MonkeyPatch, forced: None
) -> None:
    def unsupported(self: psutil.Process) -> float:
        raise NotImplementedError("create_time")

    monkeypatch.setattr(psutil.Process, "create_time", unsupported)
    monkeypatch.setattr(procpsutil.sys, "platform", "plan9")
    with pytest.raises(ConfigError, match=r"on this platform \(plan9\).*Supported: Linux, macOS"):
        procpsutil.check_supported()


def test_the_fast_path_stays_the_default_on_linux() -> None:
    if os.environ.get("RECONCILE_PROCFS") == "psutil":
        pytest.skip("the psutil run of the suite")
    assert procpsutil.ACTIVE is False
