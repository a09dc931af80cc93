"""A real daemon whose wall clock is stepped (libfaketime): an hour back while an engine
waits out its back-off, an hour forward while one is Starting, an hour back during a
`reconcile drain --ttl` (docs/design.md, "Clock steps"). The back-off ends at once instead
of an hour later; the Starting engine is not killed for a deadline it has not had; the
drain ends its ttl later by the boot clock. The kernel's clocks are left alone: only the
daemon's (and its children's, and the CLI's) view of the wall clock moves.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import faketime
import pytest

from controller.core.state import Phase, Record
from controller.store.config.node import read_drain

from .cluster import PYTHON, Cluster
from .invariants import read_records

WAIT = 90.0  # seconds any one step may take on a loaded box: far below the hour stepped
DRAIN_TTL = 4.0  # seconds: `reconcile drain --ttl 4s`, stepped an hour back at once


@pytest.fixture(scope="module")
def preload(tmp_path_factory: pytest.TempPathFactory) -> str:
    return faketime.preload(tmp_path_factory.mktemp("faketime"))


def _until(
    what: str, cluster: Cluster, check: Callable[[dict[str, Record]], bool]
) -> dict[str, Record]:
    """The records once ``check`` holds for them: those it judged, not a later read (the
    daemon may have moved on meanwhile)."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        records = read_records(cluster.state)[0]
        if check(records):
            return records
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {WAIT:g}s\n{read_records(cluster.state)[0]}")


def test_a_stepped_wall_clock_neither_kills_nor_strands(cluster: Cluster, preload: str) -> None:
    clock = cluster.tmp / "clock"
    cluster.env.update(faketime.env(preload, clock))
    crash = [PYTHON, "-S", "-I", "-c", "raise SystemExit(3)"]
    cluster.write("crash", command=crash)
    cluster.write("slow", readiness={"httpGet": {}, "deadlineSeconds": 60, "periodSeconds": 0.2})
    daemon = cluster.start("--resync", "1s")

    # An hour back during a 10 s back-off (the first that waits: the restart before it is
    # immediate): it ends at once, not an hour later.
    _until("crash in its 10 s back-off", cluster, lambda r: _backing_off(r.get("crash"), 1))
    before = read_records(cluster.state)[0]["crash"]
    clock.write_text("-1h\n")
    after = _until("crash restarted", cluster, lambda r: _restarted(r["crash"], before))["crash"]
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


def test_a_drain_ends_its_ttl_later_by_the_boot_clock_though_the_clock_went_back(
    cluster: Cluster, preload: str
) -> None:
    """`reconcile drain --ttl 4s`, then the wall clock an hour back: the node is drained
    4 s by the boot clock, not an hour and 4 s."""
    clock = cluster.tmp / "clock"
    cluster.env.update(faketime.env(preload, clock))
    daemon = cluster.start("--resync", "1s")
    asked = time.monotonic()
    drained = cluster.run("drain", "--ttl", f"{DRAIN_TTL:g}s", "--reason", "clock test")
    assert drained.code == 0, drained
    clock.write_text("-1h\n")
    assert time.monotonic() - asked < DRAIN_TTL  # stepped while drained
    cluster.write("late")  # held back while drained, started once the drain ends
    _until("late ready", cluster, lambda r: _ready(r.get("late")))
    took = time.monotonic() - asked
    assert took >= DRAIN_TTL, took  # the drain held it for its whole ttl ...
    assert took < DRAIN_TTL + 30, took  # ... and no longer (an hour, on the wall clock)
    drain, late = read_drain(cluster.state), read_records(cluster.state)[0]["late"]
    assert drain is not None and late.started_at is not None
    assert late.started_at + timedelta(minutes=50) < drain.until  # the step took
    assert daemon.poll() is None, cluster.stderr(daemon)[-3000:]
    assert "Traceback" not in cluster.stderr(daemon)


# Two threads taking turns at the GIL (a wait on a condition at each turn), then what the
# process's reads were: libfaketime's own pthread_cond_timedwait read the clock file at
# each wait (~0.6-1.2 million reads in this loop; a gateway with a Ready engine spent ~0.2
# of a core on them, and test_clock_idle.py's two tests ~13 s of CPU each).
TURNS = """
import sys, threading, time
def reads():
    return int(next(x for x in open('/proc/self/io') if x.startswith('syscr:')).split()[1])
def spin():
    x = 0
    for i in range(1_000_000):
        x += i
sys.setswitchinterval(0.001)
threads = [threading.Thread(target=spin) for _ in range(2)]
before = reads()
for t in threads: t.start()
for t in threads: t.join()
print(reads() - before - 1, time.time())
"""


def test_a_faked_process_reads_its_clock_file_when_it_reads_the_clock_only(
    tmp_path: Path, preload: str
) -> None:
    clock = tmp_path / "clock"
    env = {**os.environ, **faketime.env(preload, clock)}
    clock.write_text("+1h\n")
    out = subprocess.run(
        [PYTHON, "-S", "-c", TURNS], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    reads, wall = out.stdout.split()
    assert abs(float(wall) - time.time() - 3600) < 600, out.stdout  # the clock is faked
    assert int(reads) < 50, out.stdout  # and the waits for the GIL read no file


def _backing_off(rec: Record | None, restarts: int) -> bool:
    return rec is not None and rec.phase is Phase.BACKOFF and rec.restarts == restarts


def _restarted(rec: Record, before: Record) -> bool:
    """Spawned again: the reservation's write counts the restart and clears started_at
    (None) before the spawn's write sets it, so a read between the two is not yet
    restarted (under load that gap outlasts a 0.1 s poll)."""
    return (
        rec.restarts > before.restarts
        and rec.started_at is not None
        and rec.started_at != before.started_at
    )


def _ready(rec: Record | None) -> bool:
    return rec is not None and rec.phase is Phase.READY
