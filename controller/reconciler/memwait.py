"""Before an engine with a memory request starts: wait until its GPUs really have it free.

The ledger says the memory is ours, but the driver frees an exited engine's memory
late, and a process reconcile does not manage (a leaked engine, a notebook) may
hold some. Starting anyway would over-commit the card silently, so the start waits,
bounded, and when the memory never comes it fails with a message that names who
holds it. Where NVML is missing (a static inventory, no driver) the ledger is all
there is and nothing waits. A stop asked meanwhile (the daemon's SIGTERM) ends the wait
at once: the start is given up, unfailed, for the next run to make.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from controller.core.devices.inventory import GpuMemory
from controller.core.manifest.quantity import format_bytes
from controller.core.state import Record

ReadMemory = Callable[[tuple[str, ...]], Mapping[str, GpuMemory] | None]


class Stopped:
    """What ``MemoryGate.wait`` answers when a stop ended it: neither free nor short."""


STOPPED = Stopped()
DEFAULT_WAIT = 30.0  # seconds: longer than a driver takes to free an exited engine's memory


@dataclass(kw_only=True)
class MemoryGate:
    # NVML on the local backend (run.py passes devices.gpu_memory); None: nothing to ask.
    read: ReadMemory = field(default=lambda uuids: None)
    # The GPUs asked for by their keys (``nvidia:0``), not their UUIDs: the fake source,
    # whose lines name devices as the static inventory does (host/gpuhealth.py).
    by_key: bool = False
    timeout: float = DEFAULT_WAIT
    period: float = 0.5
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    # pid -> the deployment it belongs to (None: not ours); filled by the executor
    owner_of: Callable[[int], str | None] = field(default=lambda pid: None)
    # The daemon's stop flag (``Reconciler.interrupted``): a SIGTERM must not wait out
    # the timeout (systemd's TimeoutStopSec SIGKILLs a daemon that ignores its stop).
    interrupted: Callable[[], bool] = field(default=lambda: False)

    def short(self, record: Record) -> list[GpuMemory]:
        """The record's GPUs that lack its memory now; [] when fine or unknowable."""
        ids = record.devices if self.by_key else tuple(u for u in record.device_uuids if u)
        if record.memory is None or not ids or len(ids) != len(record.devices):
            return []
        seen = self.read(ids)
        if seen is None:
            return []
        return [m for m in seen.values() if m.free < record.memory]

    def wait(self, record: Record, report: Callable[[str], None]) -> str | Stopped | None:
        """None once every GPU has the memory free; else (after the timeout) why not;
        STOPPED as soon as a stop is asked while it waits."""
        deadline = self.clock() + self.timeout
        short = self.short(record)
        if short:
            report(self.explain(record, short) + f"; waiting up to {self.timeout:g}s")
        while short:
            if self.interrupted():
                return STOPPED
            if self.clock() >= deadline:
                return self.explain(record, short)
            self.sleep(self.period)
            short = self.short(record)
        return None

    def explain(self, record: Record, short: list[GpuMemory]) -> str:
        assert record.memory is not None
        keys = dict(zip(record.device_uuids, record.devices, strict=False))
        parts = []
        for m in short:
            held = ", ".join(self._holder(pid, used) for pid, used in m.processes) or "unknown"
            parts.append(
                f"{keys.get(m.uuid, m.uuid)} has {format_bytes(m.free)} free, "
                f"needs {format_bytes(record.memory)} (held by {held})"
            )
        return "; ".join(parts)

    def _holder(self, pid: int, used: int) -> str:
        owner = self.owner_of(pid)
        who = f"deployment {owner}" if owner else "not managed by reconcile"
        return f"pid {pid} {format_bytes(used) if used else ''} ({who})".replace("  ", " ")
