"""Measured GPU memory, observed state: ``<state>/devices/measured.json``.

Per spec hash, the highest per-device GPU memory its engine's processes were seen to
use (``core/measured.py`` leases it + 10% for ``devices.memory: auto``). A peak only
rises; a new spec hash starts over (its engine may need another amount). Written
atomically under ``devices/measured.lock``, and only when a peak rose; bounded to the
newest ``KEEP`` hashes. A torn or foreign file is quarantined and counts as no
measurement (``memory: auto`` then leases whole devices, the safe side).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from controller.core.devicefaults import Measured
from controller.store.documents import Document
from controller.store.statedir import StateDir

KEEP = 256  # spec hashes remembered

Peaks = dict[str, Measured]


def _document(state_dir: Path) -> Document[Peaks]:
    state = StateDir(state_dir)
    return Document(state, state.measured, _decode, _encode, indent=1)


def read(state_dir: Path) -> Peaks:
    """Spec hash -> its peak."""
    return _document(state_dir).read() or {}


def peek(state_dir: Path) -> Peaks:
    """``read`` for a reader that must change nothing (``describe``): a torn file is none."""
    return _document(state_dir).peek() or {}


def note(state_dir: Path, seen: Mapping[str, Measured]) -> Peaks:
    """Keep each of ``seen`` that is a new or higher peak; the peaks on record after."""
    if not seen:
        return read(state_dir)

    def rise(peaks: Peaks) -> Peaks:
        risen = {h: m for h, m in seen.items() if h not in peaks or m.peak > peaks[h].peak}
        if not risen:
            return peaks
        newest = sorted({**peaks, **risen}.items(), key=lambda hm: hm[1].at, reverse=True)
        return dict(newest[:KEEP])

    return _document(state_dir).update(rise, {}, "measured memory lock")


def _encode(peaks: Mapping[str, Measured]) -> dict[str, Any]:
    return {
        h: {"peak": m.peak, "at": m.at.isoformat(), "name": m.name}
        for h, m in sorted(peaks.items())
    }


def _decode(data: Any) -> Peaks:
    return {str(h): _measured(m) for h, m in data.items()}


def _measured(data: dict[str, Any]) -> Measured:
    return Measured(int(data["peak"]), datetime.fromisoformat(data["at"]), str(data["name"]))
