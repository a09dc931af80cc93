"""What the GPUs report, read through NVML: critical Xid events, uncorrectable ECC counts
and each process's GPU memory (one :class:`Reading` per look).

The source is injectable: ``RECONCILE_FAKE_NVML=FILE`` names a JSON-lines file read in
place of NVML (tests, and machines without a GPU), one fact per line::

    {"device": "nvidia:1", "xid": 79, "time": "2026-01-01T00:00:00+00:00"}
    {"device": "nvidia:1", "ecc_uncorrected": 2}
    {"pid": 4242, "used": 21474836480}
    {"device": "nvidia:0", "free": 1073741824}

An Xid line is an event at its ``time``; an ECC line is the count now (the last line of
a device wins); a ``pid`` line is that process's GPU memory now, in bytes; a ``free``
line is the device's free memory now, in bytes, which the memory gate reads before a
start (``fake_free_memory``: by device key, as the fake names devices; a device no line
names is not known, so nothing waits for it).

NVML delivers Xid events only to an event set registered before they happen, so the
daemon, whose source lives as long as it does, sees them; a ``--once`` pass registers
its set when it starts and reads the ECC counts, which NVML keeps. Without pynvml or a
driver every look is empty: nothing is ever marked Unhealthy by a missing library.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from controller.core.devicefaults import Reading, XidEvent
from controller.core.devices.inventory import GpuMemory, Inventory
from controller.errors import ConfigError

FAKE_ENV = "RECONCILE_FAKE_NVML"


class HealthSource(Protocol):
    """Where a pass reads the GPUs' health (Xid, ECC) from: NVML, a fake for tests, none."""

    def read(self) -> Reading: ...


class NoSource:
    def read(self) -> Reading:
        return Reading()


def choose(inventory: Inventory, environ: Mapping[str, str] = os.environ) -> HealthSource:
    """The fake file when ``RECONCILE_FAKE_NVML`` names one, else NVML for the NVIDIA
    devices discovery found (by UUID, as the memory gate reads them); a static inventory
    (``--devices``) names no UUID, so nothing loads NVML for it."""
    fake = environ.get(FAKE_ENV)
    if fake:
        return FileSource(Path(fake))
    keys = {d.key: d.uuid for d in inventory.devices if d.kind == "nvidia" and d.uuid}
    return NvmlSource(keys) if keys else NoSource()


class FileSource:
    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> Reading:
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return Reading()
        xids: list[XidEvent] = []
        ecc: dict[str, int] = {}
        memory: dict[int, int] = {}
        for number, line in enumerate(lines, 1):
            if line.strip():
                _fact(json.loads(line), xids, ecc, memory, f"{self.path}:{number}")
        return Reading(tuple(xids), ecc, memory)


def _fact(
    fact: Any,
    xids: list[XidEvent],
    ecc: dict[str, int],
    memory: dict[int, int],
    where: str,
    free: dict[str, int] | None = None,
) -> None:
    free = {} if free is None else free
    try:
        if "xid" in fact:
            when = datetime.fromisoformat(fact["time"])
            xids.append(XidEvent(str(fact["device"]), int(fact["xid"]), when))
        elif "ecc_uncorrected" in fact:
            ecc[str(fact["device"])] = int(fact["ecc_uncorrected"])
        elif "pid" in fact:
            memory[int(fact["pid"])] = int(fact["used"])
        elif "free" in fact:  # the memory gate's (fake_free_memory), not health's
            free[str(fact["device"])] = int(fact["free"])
        else:
            raise KeyError("xid, ecc_uncorrected, pid or free")
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: not a fake NVML fact ({exc}); see host/gpuhealth.py") from exc


class NvmlSource:
    """NVML itself: initialised once, its Xid event set registered on the first look."""

    def __init__(self, devices: Mapping[str, str], nvml: Any = None) -> None:
        self.devices = dict(devices)  # kind:id -> GPU UUID
        self._nvml = nvml
        self._events: Any = None
        self._handles: dict[str, Any] = {}
        self._failed = False  # no library or driver: not asked again by this source

    def read(self) -> Reading:
        nv = self._open()
        if nv is None:
            return Reading()
        return Reading(self._xids(nv), self._ecc(nv), self._memory(nv))

    def _open(self) -> Any:
        if self._handles or self._failed:
            return self._nvml if self._handles else None
        try:
            if self._nvml is None:
                import pynvml  # type: ignore[import-not-found,import-untyped,unused-ignore]

                self._nvml = pynvml
            nv = self._nvml
            nv.nvmlInit()  # kept: NVML counts inits, another caller's shutdown leaves ours
            for key, uuid in self.devices.items():
                self._handles[key] = nv.nvmlDeviceGetHandleByUUID(uuid)
            self._events = nv.nvmlEventSetCreate()
            for handle in self._handles.values():
                self._register(nv, handle)
        except Exception:  # no library, no driver, a broken GPU: no reading, never a crash
            self._handles.clear()
            self._failed = True
            return None
        return nv

    def _register(self, nv: Any, handle: Any) -> None:
        # A GPU that delivers no events (NotSupported): its ECC count still counts.
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, self._events)

    def _xids(self, nv: Any) -> tuple[XidEvent, ...]:
        by_uuid = {_text(nv.nvmlDeviceGetUUID(h)): k for k, h in self._handles.items()}
        found: list[XidEvent] = []
        while True:
            try:
                event = nv.nvmlEventSetWait(self._events, 0)  # 0 ms: only what is there
            except nv.NVMLError:
                return tuple(found)  # Timeout: nothing more (or events unsupported)
            key = by_uuid.get(_text(nv.nvmlDeviceGetUUID(event.device)))
            if key is not None:
                found.append(XidEvent(key, int(event.eventData), datetime.now(UTC)))

    def _ecc(self, nv: Any) -> dict[str, int]:
        counts: dict[str, int] = {}
        for key, handle in self._handles.items():
            try:
                counts[key] = int(
                    nv.nvmlDeviceGetTotalEccErrors(
                        handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
                    )
                )
            except nv.NVMLError:
                continue  # no ECC on this GPU (or it is off): nothing to compare
        return counts

    def _memory(self, nv: Any) -> dict[int, int]:
        used: dict[int, int] = {}
        for handle in self._handles.values():
            try:
                procs = nv.nvmlDeviceGetComputeRunningProcesses(handle)
            except nv.NVMLError:
                continue
            for proc in procs:
                used[int(proc.pid)] = used.get(int(proc.pid), 0) + int(proc.usedGpuMemory or 0)
        return used


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def fake_free_memory(
    environ: Mapping[str, str] = os.environ,
) -> Callable[[tuple[str, ...]], dict[str, GpuMemory] | None] | None:
    """The memory gate's reader of the fake file's ``free`` lines (by device key), or
    None when ``RECONCILE_FAKE_NVML`` names no file: the gate asks NVML then."""
    fake = environ.get(FAKE_ENV)
    if not fake:
        return None
    path = Path(fake)

    def read(keys: tuple[str, ...]) -> dict[str, GpuMemory] | None:
        free = _free_lines(path)
        if not all(k in free for k in keys):
            return None
        return {k: GpuMemory(k, free[k], ()) for k in keys}

    return read


def _free_lines(path: Path) -> dict[str, int]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return {}
    found: dict[str, int] = {}
    for number, line in enumerate(lines, 1):
        if line.strip():
            _fact(json.loads(line), [], {}, {}, f"{path}:{number}", found)
    return found
