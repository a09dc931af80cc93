"""``<state>/devices/health.json`` (store/devicehealth.py): no file is all healthy, an
update writes only a change, a clear survives a round trip, and a file that does not
parse is an error that names it and the way out (the CLI prints it, no traceback)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from controller.core.devicefaults import DeviceFault, DeviceHealth
from controller.errors import ConfigError
from controller.store import devicehealth

NOW = datetime(2026, 1, 1, tzinfo=UTC)
SICK = DeviceHealth(faults={"nvidia:1": DeviceFault("nvidia:1", "Xid 79 (lost)", NOW)})


def test_round_trip_and_only_changes_are_written(tmp_path: Path) -> None:
    assert devicehealth.read(tmp_path) == DeviceHealth()
    devicehealth.update(tmp_path, lambda h: h)
    assert not devicehealth.path(tmp_path).exists()  # nothing changed: nothing written
    devicehealth.update(tmp_path, lambda h: SICK)
    assert devicehealth.read(tmp_path) == SICK
    cleared = devicehealth.update(tmp_path, lambda h: h.cleared_now("nvidia:1", NOW))
    assert devicehealth.read(tmp_path) == cleared and cleared.cleared == {"nvidia:1": NOW}


def test_a_broken_file_names_itself_and_the_way_out(tmp_path: Path, reconcile: Any) -> None:
    devicehealth.folder(tmp_path).mkdir()
    devicehealth.path(tmp_path).write_text("{not json")
    with pytest.raises(ConfigError, match=r"health\.json is unreadable .*delete it"):
        devicehealth.read(tmp_path)
    devicehealth.folder(reconcile.state).mkdir(parents=True)
    devicehealth.path(reconcile.state).write_text('{"version": 9}')
    shown = reconcile("devices")
    assert shown.code != 0 and "health.json is unreadable" in shown.err, shown
