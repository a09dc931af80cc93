"""The node's device health, observed state: ``<state>/devices/health.json``.

Written atomically like a record (tmp, fsync, rename, fsync dir) under
``devices/health.lock``, so a pass's update and ``reconcile devices --clear`` never
lose each other's change. A file that does not parse is named in the error with the
way out (``--clear`` every device, or delete it): guessing would hide a broken GPU.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from controller.core.devicefaults import DeviceFault, DeviceHealth
from controller.errors import ConfigError
from controller.store.lock import FileLock
from controller.store.records import write_atomic

VERSION = 1
LOCK_WAIT = 10.0  # seconds: the update is a read and a write


def folder(state_dir: Path) -> Path:
    return state_dir / "devices"


def path(state_dir: Path) -> Path:
    return folder(state_dir) / "health.json"


def read(state_dir: Path) -> DeviceHealth:
    """The device health on record (all healthy when there is no file)."""
    try:
        data = json.loads(path(state_dir).read_bytes())
        return _from_json(data)
    except FileNotFoundError:
        return DeviceHealth()
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(
            f"{path(state_dir)} is unreadable ({exc}): delete it to start over "
            "(each GPU's health is read again on the next pass)"
        ) from exc


def update(state_dir: Path, change: Callable[[DeviceHealth], DeviceHealth]) -> DeviceHealth:
    """Apply ``change`` under the lock; written only when it changed anything."""
    folder(state_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
    lock = FileLock(folder(state_dir) / "health.lock", what="device health lock")
    lock.acquire(LOCK_WAIT)
    try:
        before = read(state_dir)
        after = change(before)
        if after != before:
            write_atomic(path(state_dir), json.dumps(_to_json(after), indent=1).encode())
        return after
    finally:
        lock.release()


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


def _from_json(data: dict[str, Any]) -> DeviceHealth:
    if data.get("version") != VERSION:
        raise ValueError(f"version {data.get('version')!r}, expected {VERSION}")
    faults = {
        str(key): DeviceFault(str(key), str(f["reason"]), datetime.fromisoformat(f["since"]))
        for key, f in data["unhealthy"].items()
    }
    cleared = {str(k): datetime.fromisoformat(v) for k, v in data["cleared"].items()}
    ecc = {str(k): int(v) for k, v in data["ecc_uncorrected"].items()}
    return DeviceHealth(faults, cleared, ecc)
