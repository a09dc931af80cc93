"""The node's device health, observed state: ``<state>/devices/health.json``.

Written atomically like a record (tmp, fsync, rename, fsync dir) under
``devices/health.lock``, so a pass's update and ``reconcile devices --clear`` never
lose each other's change. A torn or foreign file is quarantined with the reason and
named in a warning event (``documents.py``): each GPU's health is then read again by
the next pass, which is what deleting it by hand used to do.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from controller.core.devicefaults import DeviceFault, DeviceHealth
from controller.store.documents import Document, check_version
from controller.store.statedir import StateDir

VERSION = 1


def _document(state_dir: Path) -> Document[DeviceHealth]:
    state = StateDir(state_dir)
    return Document(state, state.device_health, _from_json, _to_json, indent=1)


def read(state_dir: Path) -> DeviceHealth:
    """The device health on record (all healthy when there is no file)."""
    return _document(state_dir).read() or DeviceHealth()


def peek(state_dir: Path) -> DeviceHealth:
    """``read`` for a reader that must change nothing (``devices``): a torn file is none."""
    return _document(state_dir).peek() or DeviceHealth()


def update(state_dir: Path, change: Callable[[DeviceHealth], DeviceHealth]) -> DeviceHealth:
    """Apply ``change`` under the lock; written only when it changed anything."""
    return _document(state_dir).update(change, DeviceHealth(), "device health lock")


def _to_json(health: DeviceHealth) -> dict[str, Any]:
    return {
        "version": VERSION,
        "unhealthy": {
            key: {"reason": f.reason, "since": f.since.isoformat()}
            for key, f in sorted(health.faults.items())
        },
        "cleared": {key: when.isoformat() for key, when in sorted(health.cleared.items())},
        "ecc_uncorrected": dict(sorted(health.ecc.items())),
    }


def _from_json(data: Any) -> DeviceHealth:
    check_version(data, VERSION)
    faults = {
        str(key): DeviceFault(str(key), str(f["reason"]), datetime.fromisoformat(f["since"]))
        for key, f in data["unhealthy"].items()
    }
    cleared = {str(k): datetime.fromisoformat(v) for k, v in data["cleared"].items()}
    ecc = {str(k): int(v) for k, v in data["ecc_uncorrected"].items()}
    return DeviceHealth(faults, cleared, ecc)
