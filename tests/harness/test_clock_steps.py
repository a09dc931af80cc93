"""A real daemon whose wall clock is stepped (libfaketime): an hour back while an engine
waits out its back-off, an hour forward while one is Starting (docs/design.md, "Clock
steps"). The back-off ends at once instead of an hour later; the Starting engine is not
killed for a deadline it has not had. The kernel's clocks are left alone: only the
daemon's (and its children's) view of the wall clock moves.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from controller.core.state import Phase, Record

from .cluster import PYTHON, Cluster
from .invariants import read_records

FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")
WAIT = 90.0  # seconds any one step may take on a loaded box: far below the hour stepped
# libfaketime 0.9.10 answers EINVAL to clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME),
# which Python 3.11's time.sleep calls: this shim, preloaded first, makes the real call
# (the monotonic clock is not faked here).
SHIM = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
int clock_nanosleep(clockid_t c, int flags, const struct timespec *t, struct timespec *r) {
    return syscall(SYS_clock_nanosleep, c, flags, t, r) == 0 ? 0 : errno;
}
"""


@pytest.fixture(scope="module")
def preload(tmp_path_factory: pytest.TempPathFactory) -> str:
    if not FAKETIME.exists():
        pytest.skip(f"libfaketime is not installed ({FAKETIME}): apt-get install libfaketime")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the clock_nanosleep shim libfaketime needs here")
    folder = tmp_path_factory.mktemp("faketime")
    (folder / "shim.c").write_text(SHIM)
    shim = folder / "shim.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(shim), str(folder / "shim.c")], check=True)
    return f"{shim}:{FAKETIME}"


def _until(what: str, cluster: Cluster, check: Callable[[dict[str, Record]], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if check(read_records(cluster.state)[0]):
            return
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {WAIT:g}s\n{read_records(cluster.state)[0]}")


def test_a_stepped_wall_clock_neither_kills_nor_strands(cluster: Cluster, preload: str) -> None:
    clock = cluster.tmp / "clock"
    clock.write_text("+0\n")
    cluster.env.update(
        LD_PRELOAD=preload,
        FAKETIME_TIMESTAMP_FILE=str(clock),
        FAKETIME_NO_CACHE="1",  # the file is re-read at every call (a cache timed on the
        # faked clock outlives a step back: the next step was never read)
        FAKETIME_DONT_FAKE_MONOTONIC="1",  # timers keep real time: only the wall clock steps
        NO_FAKE_STAT="1",  # file times stay real
    )
    crash = [PYTHON, "-S", "-I", "-c", "raise SystemExit(3)"]
    cluster.write("crash", command=crash)
    cluster.write("slow", readiness={"httpGet": {}, "deadlineSeconds": 60, "periodSeconds": 0.2})
    daemon = cluster.start("--resync", "1s")

    # An hour back during a 20 s back-off: it ends at once, not an hour later.
    _until("crash in its 20 s back-off", cluster, lambda r: _backing_off(r.get("crash"), 2))
    before = read_records(cluster.state)[0]["crash"]
    clock.write_text("-1h\n")
    _until("crash restarted", cluster, lambda r: _restarted(r["crash"], before))
    after = read_records(cluster.state)[0]["crash"]
    assert before.backoff_until is not None and after.started_at is not None
    # started (on the stepped clock) before its back-off was over even on the old clock
    assert after.started_at + timedelta(hours=1) < before.backoff_until, (before, after)

    # An hour forward (from when it started) while `slow` starts (its probe never passes):
    # not killed for a deadline it has not had.
    slow = read_records(cluster.state)[0]["slow"]
    assert slow.phase is Phase.STARTING and slow.ref is not None, slow
    clock.write_text("+1h\n")
    cluster.write("witness")  # Ready once the daemon has run passes on the new clock
    _until("witness ready", cluster, lambda r: _ready(r.get("witness")))
    records = read_records(cluster.state)[0]
    witness, now_slow = records["witness"], records["slow"]
    assert witness.started_at is not None and slow.started_at is not None
    assert witness.started_at - slow.started_at > timedelta(minutes=50)  # the step took
    assert now_slow.phase is Phase.STARTING, now_slow
    assert now_slow.ref == slow.ref and now_slow.restarts == slow.restarts, now_slow
    assert daemon.poll() is None, cluster.stderr(daemon)[-3000:]
    assert "Traceback" not in cluster.stderr(daemon)


def _backing_off(rec: Record | None, restarts: int) -> bool:
    return rec is not None and rec.phase is Phase.BACKOFF and rec.restarts == restarts


def _restarted(rec: Record, before: Record) -> bool:
    """Spawned again (the reservation's write counts the restart before the spawn)."""
    return rec.restarts > before.restarts and rec.started_at != before.started_at


def _ready(rec: Record | None) -> bool:
    return rec is not None and rec.phase is Phase.READY
