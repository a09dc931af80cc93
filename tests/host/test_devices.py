"""Device inventory: static lists, discovery fallbacks, visibility variables."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from controller.core.devices.inventory import Device, parse_static, visibility_env
from controller.errors import ConfigError
from controller.host import devices


@pytest.mark.parametrize(
    ("text", "keys"),
    [
        pytest.param("nvidia:0,nvidia:1", ("nvidia:0", "nvidia:1"), id="two-nvidia"),
        pytest.param(" amd:0 , cpu:0 ", ("amd:0", "cpu:0"), id="spaces-mixed"),
        pytest.param("", (), id="empty"),
        pytest.param("none", (), id="none"),
    ],
)
def test_static_inventory(text: str, keys: tuple[str, ...]) -> None:
    assert parse_static(text).keys() == keys


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("gpu0", id="no-kind"),
        pytest.param("tpu:0", id="unknown-kind"),
        pytest.param("nvidia:", id="no-id"),
        pytest.param("nvidia:0,nvidia:0", id="duplicate"),
    ],
)
def test_static_inventory_errors_say_how(text: str) -> None:
    with pytest.raises(ConfigError, match=r"nvidia|twice"):
        parse_static(text)


def test_nvidia_visibility_prefers_uuid_and_bus_order() -> None:
    env = visibility_env(
        [Device(kind="nvidia", id="1", uuid="GPU-abc"), Device(kind="nvidia", id="3")]
    )
    assert env == {"CUDA_VISIBLE_DEVICES": "GPU-abc,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_amd_visibility_never_mixes_cuda() -> None:
    env = visibility_env([Device(kind="amd", id="0"), Device(kind="amd", id="2")])
    assert env == {"HIP_VISIBLE_DEVICES": "0,2", "ROCR_VISIBLE_DEVICES": "0,2"}


def test_no_devices_hides_every_gpu() -> None:
    assert visibility_env([]) == {"CUDA_VISIBLE_DEVICES": ""}
    assert visibility_env([Device(kind="cpu", id="0")]) == {"CUDA_VISIBLE_DEVICES": ""}


class _NVMLError(Exception):
    pass


class NoDriverNVML:
    """pynvml as it behaves where the library is installed but no NVIDIA driver is."""

    NVMLError = _NVMLError

    @staticmethod
    def nvmlInit() -> None:
        raise _NVMLError("NVML Shared Library Not Found")


class OneGpuNVML:
    """pynvml on a box with one 80 GiB GPU (bytes, as older pynvml returns them)."""

    NVMLError = _NVMLError
    shut_down = False

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"handle-{index}"

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> SimpleNamespace:
        return SimpleNamespace(total=80 << 30, free=79 << 30)

    def nvmlDeviceGetUUID(self, handle: str) -> bytes:
        return b"GPU-0000-aaaa"

    def nvmlDeviceGetName(self, handle: str) -> bytes:
        return b"NVIDIA H100"


def without_driver() -> list[tuple[str, devices.Probe]]:
    """The default sources, NVML answering as on a box with no NVIDIA driver."""
    return devices.default_sources(nvml=NoDriverNVML)


def test_discovery_degrades_to_none_without_gpus(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Whatever this box has: NVML raises NVMLError, nvidia-smi and amd-smi are missing
    # -> no devices, no exception.
    monkeypatch.setenv("PATH", str(tmp_path))
    inventory = devices.discover(without_driver())
    assert inventory.devices == ()
    assert inventory.source == "none"


def test_nvml_without_a_driver_is_no_devices() -> None:
    assert devices._nvml(NoDriverNVML) == []  # the NVMLError path, on any host


def test_nvml_devices_are_read_and_nvml_shut_down() -> None:
    nvml = OneGpuNVML()
    inventory = devices.discover(devices.default_sources(nvml=nvml))
    assert inventory.source == "nvml"
    (gpu,) = inventory.devices
    assert (gpu.key, gpu.uuid, gpu.name) == ("nvidia:0", "GPU-0000-aaaa", "NVIDIA H100")
    assert (gpu.memory_total_mb, gpu.memory_free_mb) == (80 << 10, 79 << 10)
    assert nvml.shut_down


def test_a_source_that_raises_is_skipped() -> None:
    def broken() -> list[Device]:
        raise RuntimeError("driver/library version mismatch")

    found = [Device(kind="amd", id="0")]
    inventory = devices.discover([("nvml", broken), ("amd-smi", lambda: found)])
    assert inventory.source == "amd-smi" and list(inventory.devices) == found


def test_nvidia_smi_output_is_parsed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # A real executable named nvidia-smi on PATH, printing what the real one prints.
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\n"
        "echo '0, GPU-11111111-2222, NVIDIA H200, 143771, 143000'\n"
        "echo '1, GPU-33333333-4444, NVIDIA H200, 143771, 100'\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    inventory = devices.discover(without_driver())  # NVML would win on a GPU box
    assert inventory.source == "nvidia-smi"
    assert [d.key for d in inventory.devices] == ["nvidia:0", "nvidia:1"]
    assert inventory.devices[0].uuid == "GPU-11111111-2222"
    assert inventory.devices[1].memory_free_mb == 100


def test_gpu_release_wait_is_immediate_without_nvml() -> None:
    assert devices.wait_gpu_release(("GPU-x",), {os.getpid()}, timeout=5) is True


def test_gpu_memory_and_pids_read_nvml_per_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    """The NVML readers on a fake pynvml: free memory and holders per GPU, shut down after."""
    import types

    calls: list[str] = []

    class NVMLError(Exception):
        pass

    proc = types.SimpleNamespace
    fake = types.SimpleNamespace(
        NVMLError=NVMLError,
        nvmlInit=lambda: calls.append("init"),
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetHandleByUUID=lambda uuid: uuid,
        nvmlDeviceGetMemoryInfo=lambda h: proc(free=5 << 30 if h == "GPU-a" else 0),
        nvmlDeviceGetComputeRunningProcesses=lambda h: (
            [proc(pid=7, usedGpuMemory=1 << 30)] if h == "GPU-a" else []
        ),
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    memory = devices.gpu_memory(("GPU-a", "GPU-b"))
    assert memory is not None
    assert (memory["GPU-a"].free, memory["GPU-a"].processes) == (5 << 30, ((7, 1 << 30),))
    assert memory["GPU-b"].free == 0 and memory["GPU-b"].processes == ()
    assert devices.gpu_pids(("GPU-a", "GPU-b")) == {7}
    assert calls == ["init", "shutdown", "init", "shutdown"]

    def broken(uuid: str) -> str:
        raise NVMLError("gone")

    monkeypatch.setattr(fake, "nvmlDeviceGetHandleByUUID", broken)
    assert devices.gpu_memory(("GPU-a",)) is None and calls[-1] == "shutdown"
