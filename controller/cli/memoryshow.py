"""``describe``'s Memory line: what the record leases on each device beside what its
engine was measured to use there (NVML hosts: store/measured.py)."""

from __future__ import annotations

from pathlib import Path

from controller.core.quantity import format_bytes
from controller.core.state import Record
from controller.store import measured


def memory_line(rec: Record, state_dir: Path) -> str:
    if not rec.devices:
        return "-"
    spec_devices = rec.stored_spec.get("devices")
    auto = isinstance(spec_devices, dict) and spec_devices.get("memory") == "auto"
    requested = "whole device" if rec.memory is None else f"{format_bytes(rec.memory)} per device"
    if auto:
        requested += " (memory: auto)"
    peak = measured.read(state_dir).get(rec.spec_hash or "")
    if peak is None:
        return f"requested {requested}; not measured"
    when = peak.at.isoformat(timespec="seconds")
    return f"requested {requested}; measured peak {format_bytes(peak.peak)} per device ({when})"
