"""Process identity and liveness on this node: a pid plus its start time (and boot id),
so a reused pid is never taken for the process a record names (invariant 6)."""

from __future__ import annotations

import signal

from controller.core.state import ProcessRef
from controller.host import procstat


def identity(pid: int) -> ProcessRef | None:
    st = procstat.stat(pid)
    return None if st is None else ref_of(pid, st)


def live_identity(pid: int) -> ProcessRef | None:
    """``identity``, but None for a zombie too: a process that has ended holds nothing
    (store/sources/git/orphan.py asks this of a git and of the reconcile that started it)."""
    st = procstat.stat(pid)
    return None if st is None or st.state == "Z" else ref_of(pid, st)


def process_alive(ref: ProcessRef | None) -> bool:
    """Invariant 6 for any local process (e.g. a reservation's maker), engine or not."""
    if ref is None:
        return False
    st = procstat.stat(ref.pid)
    return st is not None and st.state != "Z" and ref.same_process(ref_of(ref.pid, st))


def ref_of(pid: int, st: procstat.Stat) -> ProcessRef:
    """The identity of ``pid`` from a stat already read (one read, no race with a second)."""
    boot = procstat.boot_id() if st.start_ticks is not None else None
    return ProcessRef(pid=pid, start_time=st.start_time, start_ticks=st.start_ticks, boot_id=boot)


def age(ref: ProcessRef | None) -> float | None:
    """Seconds ``ref`` has run by the boot clock, unmoved by wall-clock steps; None when
    unknown (no ticks, or another boot: an engine on another host)."""
    if ref is None or ref.start_ticks is None or ref.boot_id is None:
        return None
    if ref.boot_id != procstat.boot_id():
        return None
    up = procstat.uptime()
    return None if up is None else max(0.0, up - ref.start_ticks / procstat.CLOCK_TICKS)


def catches(pid: int, sig: signal.Signals) -> bool | None:
    """Whether ``pid`` has a handler for ``sig`` (``SigCgt`` in ``/proc/<pid>/status``);
    None where that cannot be read. A process that does not catch SIGUSR1 dies of it: a
    daemon of a reconcile from before SIGUSR1 asked for a pass did."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith(b"SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return None
