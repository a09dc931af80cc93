"""Measured GPU memory, observed state: ``<state>/devices/measured.json``.

Per spec hash, the highest per-device GPU memory its engine's processes were seen to
use (``core/measured.py`` leases it + 10% for ``devices.memory: auto``). A peak only
rises; a new spec hash starts over (its engine may need another amount). Written
atomically under ``devices/measured.lock``, and only when a peak rose; bounded to the
newest ``KEEP`` hashes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from controller.core.devicefaults import Measured
from controller.store.lock import FileLock
from controller.store.records import write_atomic

KEEP = 256  # spec hashes remembered
LOCK_WAIT = 10.0


def path(state_dir: Path) -> Path:
    return state_dir / "devices" / "measured.json"


def read(state_dir: Path) -> dict[str, Measured]:
    """Spec hash -> its peak; a file that does not parse counts as no measurement
    (``memory: auto`` then leases whole devices, the safe side)."""
    try:
        data = json.loads(path(state_dir).read_bytes())
        return {str(h): _measured(m) for h, m in data.items()}
    except (FileNotFoundError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def note(state_dir: Path, seen: Mapping[str, Measured]) -> dict[str, Measured]:
    """Keep each of ``seen`` that is a new or higher peak; the peaks on record after."""
    if not seen:
        return read(state_dir)
    path(state_dir).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    lock = FileLock(path(state_dir).with_name("measured.lock"), what="measured memory lock")
    lock.acquire(LOCK_WAIT)
    try:
        peaks = read(state_dir)
        risen = {h: m for h, m in seen.items() if h not in peaks or m.peak > peaks[h].peak}
        if risen:
            peaks.update(risen)
            newest = sorted(peaks.items(), key=lambda hm: hm[1].at, reverse=True)[:KEEP]
            peaks = dict(newest)
            write_atomic(path(state_dir), json.dumps(_to_json(peaks), indent=1).encode())
        return peaks
    finally:
        lock.release()


def _to_json(peaks: Mapping[str, Measured]) -> dict[str, Any]:
    return {
        h: {"peak": m.peak, "at": m.at.isoformat(), "name": m.name}
        for h, m in sorted(peaks.items())
    }


def _measured(data: dict[str, Any]) -> Measured:
    return Measured(int(data["peak"]), datetime.fromisoformat(data["at"]), str(data["name"]))
