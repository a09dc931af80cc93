"""The kernel's boot clock now (``CLOCK_BOOTTIME``) and this boot's id.

NTP and operators step the wall clock, never this one (it counts suspend too, as the
wall clock does): a drain's ttl and an OnDemand engine's idleTimeout are counted on it
(core/elapsed.py). The same clock as ``/proc/uptime`` and a process's start ticks, read
through the vDSO: cheap enough for the gateway to stamp every request.
"""

from __future__ import annotations

import functools
import time

from controller.core.elapsed import BootClock

BOOT_ID = "/proc/sys/kernel/random/boot_id"


def read() -> BootClock | None:
    """None where there is no boot clock or no boot id (not Linux): the wall clock counts."""
    boot = boot_id()
    clock = getattr(time, "CLOCK_BOOTTIME", None)
    if boot is None or clock is None:
        return None
    return BootClock(boot_id=boot, seconds=time.clock_gettime(clock))


@functools.cache
def boot_id() -> str | None:
    """This boot's id: a boot-clock reading means nothing in another boot."""
    try:
        with open(BOOT_ID) as f:
            return f.read().strip() or None
    except OSError:
        return None
