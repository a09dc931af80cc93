"""Device discovery: NVML, then nvidia-smi, then amd-smi; none found -> no devices.

Every probe degrades quietly and fast on a machine without GPUs: a missing
library or tool is "no devices", never an error. A static inventory
(``--devices`` / ``RECONCILE_DEVICES``) skips discovery entirely.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

from controller.core.devices.inventory import Device, GpuMemory, Inventory, parse_static

TOOL_TIMEOUT = 5.0


def resolve(static: str | None) -> Inventory:
    if static is not None:
        return parse_static(static)
    return discover()


Probe = Callable[[], list[Device]]


def default_sources(nvml: Any = None) -> list[tuple[str, Probe]]:
    """The discovery order. ``nvml``: a pynvml-like module (default: ``import pynvml``),
    so tests can give a box with GPUs or without a driver alike any answer they need."""
    return [
        ("nvml", lambda: _nvml(nvml)),
        ("nvidia-smi", _nvidia_smi),
        ("amd-smi", _amd_smi),
    ]


def discover(sources: Sequence[tuple[str, Probe]] | None = None) -> Inventory:
    """The first source that finds a device names the inventory (default: NVML, then
    nvidia-smi, then amd-smi)."""
    for source, probe in default_sources() if sources is None else sources:
        try:
            found = probe()
        except Exception:  # a broken driver must not stop the reconciler
            found = []
        if found:
            return Inventory(tuple(found), source=source)
    return Inventory((), source="none")


def _nvml(nvml: Any = None) -> list[Device]:
    if nvml is None:
        try:
            import pynvml  # type: ignore[import-not-found,import-untyped,unused-ignore]
        except ImportError:
            return []
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:
        return []
    try:
        out = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            out.append(
                Device(
                    kind="nvidia",
                    id=str(index),
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    memory_total_mb=int(memory.total) // (1 << 20),
                    memory_free_mb=int(memory.free) // (1 << 20),
                    memory=int(memory.total),
                )
            )
        return out
    finally:
        nvml.nvmlShutdown()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _run(argv: list[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    done = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT, check=False)
    return done.stdout if done.returncode == 0 else None


def _nvidia_smi() -> list[Device]:
    query = "index,uuid,name,memory.total,memory.free"
    text = _run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"])
    return parse_nvidia_smi(text or "")


def parse_nvidia_smi(text: str) -> list[Device]:
    out = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5:
            continue
        index, uuid, name, total, free = parts
        out.append(
            Device(
                kind="nvidia",
                id=index,
                uuid=uuid or None,
                name=name,
                memory_total_mb=int(total) if total.isdigit() else None,
                memory_free_mb=int(free) if free.isdigit() else None,
                memory=int(total) << 20 if total.isdigit() else None,  # nounits: MiB
            )
        )
    return out


def _amd_smi() -> list[Device]:
    text = _run(["amd-smi", "list", "--json"])
    if not text:
        return []
    data = json.loads(text)
    out = []
    for item in data if isinstance(data, list) else []:
        gpu = item.get("gpu")
        if isinstance(gpu, int):
            out.append(Device(kind="amd", id=str(gpu), uuid=item.get("uuid") or None))
    return out


def _per_gpu(uuids: tuple[str, ...], read: Callable[[Any, Any], Any]) -> dict[str, Any] | None:
    """``read(pynvml, handle)`` for each GPU by UUID, or None where NVML is missing/fails."""
    try:
        import pynvml  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        return {u: read(pynvml, pynvml.nvmlDeviceGetHandleByUUID(u)) for u in uuids}
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def gpu_pids(uuids: tuple[str, ...]) -> set[int] | None:
    """Pids holding memory on these NVIDIA GPUs (NVML), or None where NVML is missing."""
    found = _per_gpu(uuids, lambda nv, h: nv.nvmlDeviceGetComputeRunningProcesses(h))
    if found is None:
        return None
    return {int(proc.pid) for procs in found.values() for proc in procs}


def wait_gpu_release(uuids: tuple[str, ...], pids: set[int], timeout: float = 15.0) -> bool:
    """Wait (bounded) until none of ``pids`` holds memory on the GPUs; True when free.

    The driver frees an exited process's memory asynchronously: releasing the lease
    before that would let the next engine start on a GPU that is still full.
    """
    import time

    if not uuids or not pids:
        return True
    deadline = time.monotonic() + timeout
    while True:
        holding = gpu_pids(uuids)
        if holding is None or not holding & pids:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def gpu_memory(uuids: tuple[str, ...]) -> dict[str, GpuMemory] | None:
    """Free memory and holders of these GPUs (NVML), or None where NVML is missing."""

    def read(nv: Any, handle: Any) -> tuple[int, tuple[tuple[int, int], ...]]:
        procs = nv.nvmlDeviceGetComputeRunningProcesses(handle)
        free = int(nv.nvmlDeviceGetMemoryInfo(handle).free)
        return free, tuple((int(p.pid), int(p.usedGpuMemory or 0)) for p in procs)

    found = _per_gpu(uuids, read)
    if found is None:
        return None
    return {uuid: GpuMemory(uuid, free, procs) for uuid, (free, procs) in found.items()}
