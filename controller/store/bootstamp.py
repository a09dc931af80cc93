"""A boot-clock reading in a JSON file (the drain, an activation): two optional keys, so
files written before them, and readers from before them, still work."""

from __future__ import annotations

from typing import Any

from controller.core.elapsed import BootClock


def fields(boot: BootClock | None) -> dict[str, Any]:
    return {} if boot is None else {"boot_id": boot.boot_id, "boot_seconds": boot.seconds}


def read(data: dict[str, Any]) -> BootClock | None:
    """The stamp, or None where it is missing or malformed (judged by the wall clock)."""
    boot, seconds = data.get("boot_id"), data.get("boot_seconds")
    if not isinstance(boot, str) or not boot or isinstance(seconds, bool):
        return None
    if not isinstance(seconds, int | float):
        return None
    return BootClock(boot_id=boot, seconds=float(seconds))
