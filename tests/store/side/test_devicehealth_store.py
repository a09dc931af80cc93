"""``<state>/devices/health.json`` (store/side/devicehealth.py): no file is all healthy, an
update writes only a change, a clear survives a round trip, and a file that does not
parse is quarantined and named (what deleting it by hand did: every GPU is read again),
and the CLI goes on."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from controller.core.devicefaults import DeviceFault, DeviceHealth
from controller.store.side import devicehealth
from controller.store.statedir import StateDir

NOW = datetime(2026, 1, 1, tzinfo=UTC)
SICK = DeviceHealth(faults={"nvidia:1": DeviceFault("nvidia:1", "Xid 79 (lost)", NOW)})


def test_round_trip_and_only_changes_are_written(tmp_path: Path) -> None:
    assert devicehealth.read(tmp_path) == DeviceHealth()
    devicehealth.update(tmp_path, lambda h: h)
    assert not StateDir(tmp_path).device_health.exists()  # nothing changed: nothing written
    devicehealth.update(tmp_path, lambda h: SICK)
    assert devicehealth.read(tmp_path) == SICK
    cleared = devicehealth.update(tmp_path, lambda h: h.cleared_now("nvidia:1", NOW))
    assert devicehealth.read(tmp_path) == cleared and cleared.cleared == {"nvidia:1": NOW}


def test_a_broken_file_is_quarantined_named_and_read_as_all_healthy(
    tmp_path: Path, reconcile: Any
) -> None:
    health = StateDir(tmp_path).device_health
    health.parent.mkdir()
    health.write_text("{not json")
    assert devicehealth.read(tmp_path) == DeviceHealth()
    assert not health.exists()
    (aside,) = StateDir(tmp_path).quarantine.glob("documents/devices~health.json.*[0-9]")
    assert aside.read_text() == "{not json"
    health = StateDir(reconcile.state).device_health
    health.parent.mkdir(parents=True)
    health.write_text('{"version": 1, "unhealthy": []}')
    shown = reconcile("devices")  # a read verb: named, moved by no one but a pass
    assert shown.code == 0 and "state file skipped" in shown.err, shown
    assert "left in place, read as absent (only a pass moves a file aside)" in shown.err, shown
    assert str(health) in shown.err and "Traceback" not in shown.err
    assert health.read_text() == '{"version": 1, "unhealthy": []}'
