"""A process's start time, parent and state from one read of ``/proc/<pid>/stat``.

The start time is psutil's ``create_time()`` to the bit (the stat file's start time in
clock ticks over ``CLK_TCK``, plus the boot time ``/proc/stat`` gives), without
psutil's two opens and a ``/proc/stat`` read per call: a pass asks this of every
engine. The boot time is re-read at most once a second: it moves only when the
clock is stepped, and then psutil's figures move with it too.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass

from controller.host import bootclock, procpsutil

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
BOOT_TIME_TTL = 1.0  # seconds
PF_EXITING = 0x4  # include/linux/sched.h

_boot: tuple[float, float] | None = None  # (monotonic when read, boot time)


@dataclass(frozen=True, slots=True)
class Stat:
    start_time: float  # seconds since the epoch, as psutil.Process.create_time()
    ppid: int
    state: str  # one letter: R, S, D, Z (zombie), T, ...
    # clock ticks after boot: unmoved when the wall clock is stepped (None: psutil's path)
    start_ticks: int | None = None


def stat(pid: int) -> Stat | None:
    """None when the process is gone (or its stat file cannot be read)."""
    if procpsutil.ACTIVE:
        facts = procpsutil.stat(pid)
        return None if facts is None else Stat(*facts)
    fields = _fields(pid)
    if fields is None or len(fields) < 20:
        return None
    # fields[0] is field 3 (state), [1] field 4 (ppid), [19] field 22 (start time).
    ticks = int(fields[19])
    start = ticks / CLOCK_TICKS + boot_time()
    return Stat(start_time=start, ppid=int(fields[1]), state=fields[0].decode(), start_ticks=ticks)


def exiting(pid: int) -> bool:
    """Whether ``pid`` has begun to exit: a zombie, or ``PF_EXITING`` in its flags (set as
    the kernel's exit begins, before the process's memory is let go). Such a process's
    ``/proc/<pid>/environ`` reads EACCES to any user but root. psutil's path: zombies."""
    if procpsutil.ACTIVE:
        st = stat(pid)
        return st is not None and st.state == "Z"
    fields = _fields(pid)
    # fields[0] is field 3 (state), [6] field 9 (flags).
    return (
        fields is not None
        and len(fields) > 6
        and (fields[0] == b"Z" or int(fields[6]) & PF_EXITING != 0)
    )


def group(pgid: int) -> list[int]:
    """The pids of process group ``pgid``'s live members (a zombie is one until reaped)."""
    pids = procpsutil.pids() if procpsutil.ACTIVE else _pids()
    members = []
    for pid in pids:
        with contextlib.suppress(OSError):  # gone meanwhile
            if os.getpgid(pid) == pgid:
                members.append(pid)
    return members


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _fields(pid: int) -> list[bytes] | None:
    """``/proc/<pid>/stat``'s fields from the third (state) on; None: gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The name (field 2) may hold spaces and parentheses: split after its last ')'.
    return data[data.rfind(b")") + 2 :].split()


def boot_time() -> float:
    global _boot
    now = time.monotonic()
    if _boot is None or now - _boot[0] > BOOT_TIME_TTL:
        _boot = (now, _read_boot_time())
    return _boot[1]


def boot_id() -> str | None:
    """This boot's id, paired with start ticks: ticks after boot identify a process only
    within one boot (bootclock's reading of it)."""
    if procpsutil.ACTIVE:
        return None  # no ticks to pair it with: identities compare start times
    return bootclock.boot_id()


def uptime() -> float | None:
    """Seconds since boot by the kernel's boot clock, the clock of ``start_ticks``: a
    wall-clock step moves neither (nor does libfaketime, which fakes the calls, not /proc)."""
    try:
        with open("/proc/uptime", "rb") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _read_boot_time() -> float:
    with open("/proc/stat", "rb") as f:
        for line in f:
            if line.startswith(b"btime"):
                return float(line.split()[1])
    raise RuntimeError("no 'btime' line in /proc/stat")
