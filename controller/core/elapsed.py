"""Time since a stamped event, judged so that a wall-clock step moves nothing it can avoid.

A drain's ``--ttl`` and an OnDemand engine's ``idleTimeout`` count from an event written
to a file (the drain, the gateway's activation) that outlives the process that wrote it.
Its wall-clock time is what people read; beside it the writer keeps a reading of the
kernel's boot clock, which NTP never steps (docs/design.md, "Clock steps"). Pure: the
readings come in (``controller.host.bootclock`` takes them).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class BootClock:
    """A reading of the kernel's boot clock: seconds since boot, and which boot."""

    boot_id: str
    seconds: float


def elapsed(now: datetime, at: datetime, clock: BootClock | None, stamp: BootClock | None) -> float:
    """Seconds from an event (``at`` on the wall clock, ``stamp`` on the boot clock) to now
    (``now``, ``clock``).

    * the same boot: the boot clock alone, exact whatever the wall clock did;
    * another boot: the event came before this boot, so at least this boot's uptime has
      passed (a step back across a reboot still ends the count), or more if the wall clock
      says so;
    * no stamp (an old file) or no boot clock here: the wall clock, a stamp in the future
      (the clock went back) counting as now.
    """
    wall = max(0.0, (now - at).total_seconds())
    if clock is None or stamp is None:
        return wall
    if stamp.boot_id == clock.boot_id:
        return max(0.0, clock.seconds - stamp.seconds)
    return max(wall, clock.seconds)


def later(
    at: datetime,
    stamp: BootClock | None,
    than: datetime,
    than_stamp: BootClock | None,
    clock: BootClock | None,
) -> bool:
    """Did the event at ``at`` (``stamp``) come after the one at ``than`` (``than_stamp``)?

    * both stamped in one boot: their boot-clock readings, whatever the wall clock did
      between them (an hour's step back does not put a request before the park it
      follows);
    * stamped in two boots, one of them this boot (``clock``): that one is the later;
    * else the wall clock.
    """
    if stamp is not None and than_stamp is not None:
        if stamp.boot_id == than_stamp.boot_id:
            return stamp.seconds > than_stamp.seconds
        if clock is not None and clock.boot_id in (stamp.boot_id, than_stamp.boot_id):
            return stamp.boot_id == clock.boot_id
    return at > than
