"""The boot-clock stamps in the drain and activation files: written, read back, and files
from before them (or with a torn stamp) still read, judged by the wall clock."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

from strategies import NOW

from controller.core.elapsed import BootClock
from controller.core.state import Activation, Drain
from controller.host import bootclock, procstat
from controller.store.config.node import drain_path, read_drain, write_drain
from controller.store.side import activation
from controller.store.statedir import StateDir

STAMP = BootClock(boot_id="boot-1", seconds=1234.5)


def test_a_drain_keeps_its_ttl_and_boot_clock(tmp_path: Path) -> None:
    asked = Drain.asked(NOW, 60.0, STAMP, reason="kernel", by="ops", evict=True)
    write_drain(tmp_path, asked)
    assert read_drain(tmp_path) == asked
    assert asked.until == NOW + timedelta(seconds=60)


def test_a_drain_file_from_before_the_stamps_reads_as_the_wall_clock_says(tmp_path: Path) -> None:
    until = NOW + timedelta(hours=1)
    drain_path(tmp_path).write_text(json.dumps({"until": until.isoformat(), "by": "ops"}))
    old = read_drain(tmp_path)
    assert old == Drain(until=until, by="ops")
    assert old.active(NOW, STAMP) and not old.active(until, STAMP)


def test_a_torn_stamp_counts_as_none(tmp_path: Path) -> None:
    data = {"until": NOW.isoformat(), "ttl": "60", "boot_id": 7, "boot_seconds": 1.0}
    drain_path(tmp_path).write_text(json.dumps(data))
    assert read_drain(tmp_path) == Drain(until=NOW)


def test_an_activation_keeps_its_boot_clock(tmp_path: Path) -> None:
    act = Activation(last_request_at=NOW, inflight=2, boot=STAMP)
    activation.write(tmp_path, "a", act)
    assert activation.read_all(tmp_path) == {"a": act}


def test_an_activation_from_before_the_stamp_still_reads(tmp_path: Path) -> None:
    StateDir(tmp_path).activation.mkdir()
    old = {"last_request_at": NOW.isoformat(), "inflight": 0, "released": False}
    (StateDir(tmp_path).activation / "a.json").write_text(json.dumps(old))
    assert activation.read_all(tmp_path) == {"a": Activation(last_request_at=NOW)}


def test_the_boot_clock_is_this_boots_and_the_uptimes() -> None:
    """The clock the stamps are read on is the one a process's start ticks count on."""
    now = bootclock.read()
    up = procstat.uptime()
    assert now is not None and up is not None
    assert now.boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert abs(now.seconds - up) < 1.0, (now, up)
