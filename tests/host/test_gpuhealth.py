"""The GPU health sources (host/gpuhealth.py): NVML through a fake pynvml (what a GPU box
answers: an Xid event, ECC counts, processes; NotSupported; no driver), the fake file
``RECONCILE_FAKE_NVML`` names, and which source an inventory gets."""

from __future__ import annotations

import json
import types
from collections import deque
from pathlib import Path
from typing import Any

import pytest

from controller.core.devices.inventory import Device, Inventory
from controller.errors import ConfigError
from controller.host import gpuhealth


class NVMLError(Exception):
    pass


class Timeout(NVMLError):
    pass


class FakeNVML:
    """Two GPUs by UUID; GPU-b has no ECC and no events (NotSupported)."""

    NVMLError = NVMLError
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlEventTypeXidCriticalError = 8

    def __init__(self) -> None:
        self.inits = 0
        self.pending: deque[Any] = deque()
        self.registered: list[str] = []
        self.ecc = {"GPU-a": 0}

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        return uuid

    def nvmlDeviceGetUUID(self, handle: str) -> bytes:
        return handle.encode()

    def nvmlEventSetCreate(self) -> str:
        return "set"

    def nvmlDeviceRegisterEvents(self, handle: str, kinds: int, events: str) -> None:
        if handle == "GPU-b":
            raise NVMLError("Not Supported")
        self.registered.append(handle)

    def nvmlEventSetWait(self, events: str, timeout_ms: int) -> Any:
        if not self.pending:
            raise Timeout("Timeout")
        return self.pending.popleft()

    def nvmlDeviceGetTotalEccErrors(self, handle: str, kind: int, counter: int) -> int:
        if handle not in self.ecc:
            raise NVMLError("Not Supported")
        return self.ecc[handle]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[Any]:
        used = {"GPU-a": [(7, 3 << 30)], "GPU-b": [(7, 1 << 30), (9, None)]}[handle]
        return [types.SimpleNamespace(pid=p, usedGpuMemory=u) for p, u in used]


def test_nvml_xid_events_ecc_counts_and_process_memory_are_read() -> None:
    nv = FakeNVML()
    source = gpuhealth.NvmlSource({"nvidia:0": "GPU-a", "nvidia:1": "GPU-b"}, nvml=nv)
    first = source.read()
    assert first.xids == () and first.ecc == {"nvidia:0": 0}  # GPU-b: no ECC to compare
    assert first.memory == {7: 4 << 30, 9: 0}  # summed over its GPUs
    assert nv.registered == ["GPU-a"] and nv.inits == 1
    nv.pending.append(types.SimpleNamespace(device="GPU-a", eventData=79))
    nv.ecc["GPU-a"] = 2
    second = source.read()
    assert [(x.device, x.xid) for x in second.xids] == [("nvidia:0", 79)]
    assert second.ecc == {"nvidia:0": 2} and nv.inits == 1  # initialised once
    assert source.read().xids == ()  # each event once


def test_nvml_without_a_library_or_driver_reads_nothing_and_stops_asking() -> None:
    nv = FakeNVML()

    def no_driver() -> None:
        nv.inits += 1
        raise NVMLError("Driver Not Loaded")

    nv.nvmlInit = no_driver  # type: ignore[method-assign]
    source = gpuhealth.NvmlSource({"nvidia:0": "GPU-a"}, nvml=nv)
    assert source.read() == source.read() == gpuhealth.Reading()
    assert nv.inits == 1


def test_the_fake_file_gives_xids_ecc_and_process_memory(tmp_path: Path) -> None:
    fake = tmp_path / "nvml.jsonl"
    facts = [
        {"device": "nvidia:1", "xid": 79, "time": "2026-01-01T00:00:00+00:00"},
        {"device": "nvidia:1", "ecc_uncorrected": 1},
        {"device": "nvidia:1", "ecc_uncorrected": 2},
        {"pid": 42, "used": 1 << 30},
    ]
    fake.write_text("\n".join(json.dumps(f) for f in facts) + "\n\n")
    source = gpuhealth.choose(Inventory(), {gpuhealth.FAKE_ENV: str(fake)})
    reading = source.read()
    assert [(x.device, x.xid, x.time.year) for x in reading.xids] == [("nvidia:1", 79, 2026)]
    assert reading.ecc == {"nvidia:1": 2} and reading.memory == {42: 1 << 30}
    fake.write_text('{"device": "nvidia:1", "xid": 79}\n')
    with pytest.raises(ConfigError, match=r"nvml.jsonl:1: not a fake NVML fact"):
        source.read()
    fake.unlink()
    assert source.read() == gpuhealth.Reading()


def test_the_fake_files_free_lines_are_the_memory_gates_by_device_key(tmp_path: Path) -> None:
    fake = tmp_path / "nvml.jsonl"
    assert gpuhealth.fake_free_memory({}) is None  # no fake: the gate asks NVML
    read = gpuhealth.fake_free_memory({gpuhealth.FAKE_ENV: str(fake)})
    assert read is not None and read(("nvidia:0",)) is None  # no file yet: not known
    facts = [{"device": "nvidia:0", "free": 1 << 30}, {"pid": 42, "used": 1 << 30}]
    fake.write_text("\n".join(json.dumps(f) for f in facts) + "\n")
    seen = read(("nvidia:0",))
    assert seen is not None and seen["nvidia:0"].free == 1 << 30
    assert read(("nvidia:0", "nvidia:1")) is None  # a device no line names: not known
    health = gpuhealth.choose(Inventory(), {gpuhealth.FAKE_ENV: str(fake)}).read()
    assert health.memory == {42: 1 << 30} and not health.xids  # health passes it over
    fake.write_text('{"device": "nvidia:0", "free": "lots"}\n')
    with pytest.raises(ConfigError, match=r"nvml.jsonl:1: not a fake NVML fact"):
        read(("nvidia:0",))


def test_which_source_an_inventory_gets() -> None:
    gpus = Inventory((Device(kind="nvidia", id="0", uuid="GPU-a"),))
    assert isinstance(gpuhealth.choose(gpus, {}), gpuhealth.NvmlSource)
    cpu_only = Inventory((Device(kind="amd", id="0"),))
    assert isinstance(gpuhealth.choose(cpu_only, {}), gpuhealth.NoSource)
    static = Inventory((Device(kind="nvidia", id="0", memory=80 << 30),))  # --devices
    assert isinstance(gpuhealth.choose(static, {}), gpuhealth.NoSource)
