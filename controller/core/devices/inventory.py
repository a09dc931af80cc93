"""The node's device inventory as plain values (pure: no discovery, no I/O).

Discovery lives in :mod:`controller.host.devices`; the planner and the recipes only
ever see these frozen values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from controller.core.manifest.quantity import format_bytes, parse_quantity
from controller.errors import ConfigError

KINDS = ("nvidia", "amd", "apple", "cpu")
# The kinds an engine computes on (CUDA, ROCm/HIP, Metal). A cpu device is a slot of the
# node's inventory: the engine sees nothing of it (no visibility variable).
GPU_KINDS = frozenset({"nvidia", "amd", "apple"})


@dataclass(frozen=True, kw_only=True, order=True)
class Device:
    """One device of the node, addressed as ``kind:id`` in records."""

    kind: str
    id: str
    uuid: str | None = None
    name: str | None = None
    memory_total_mb: int | None = None
    memory_free_mb: int | None = None
    # Total memory in bytes: declared (--devices nvidia:0=80Gi) or read from NVML.
    # None: unknown, and then the device takes no memory request.
    memory: int | None = None
    # The machine it is on, for a cluster's inventory (a Ray node); None: this node's.
    # An engine runs on one machine, so a lease's devices are all on one node.
    node: str | None = None
    # That node's labels (a Ray node's `ray start --labels`): spec.nodeSelector picks
    # among a cluster's devices in the plan, as Ray's label filter does at the launch.
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.id}"

    def describe_memory(self) -> str:
        return "unknown" if self.memory is None else format_bytes(self.memory)


@dataclass(frozen=True, slots=True)
class GpuMemory:
    """What NVML says of one GPU at one moment: free bytes and who holds memory on it."""

    uuid: str
    free: int
    processes: tuple[tuple[int, int], ...] = ()  # (pid, bytes used)


@dataclass(frozen=True, slots=True)
class Inventory:
    devices: tuple[Device, ...] = ()
    source: str = "none"

    def by_key(self) -> Mapping[str, Device]:
        return {d.key: d for d in self.devices}

    def keys(self) -> tuple[str, ...]:
        return tuple(d.key for d in self.devices)


def parse_static(text: str) -> Inventory:
    """Parse ``nvidia:0,nvidia:1`` (also ``none`` or an empty string for no devices).

    An entry may declare its memory: ``nvidia:0=80Gi`` (memory requests need it).
    """
    text = text.strip()
    if text in ("", "none"):
        return Inventory((), source="static")
    devices: list[Device] = []
    seen: set[str] = set()
    for item in (part.strip() for part in text.split(",")):
        item, has_size, size = item.partition("=")
        item = item.strip()
        kind, sep, ident = item.partition(":")
        if not sep or not ident or kind not in KINDS:
            raise ConfigError(
                f"device inventory entry {item!r} is not KIND:ID with KIND one of "
                f"{', '.join(KINDS)} (example: --devices nvidia:0,nvidia:1)"
            )
        device = Device(kind=kind, id=ident, memory=_size(item, size) if has_size else None)
        if device.key in seen:
            raise ConfigError(f"device {device.key} is listed twice in the inventory")
        seen.add(device.key)
        devices.append(device)
    return Inventory(tuple(devices), source="static")


def _size(item: str, size: str) -> int:
    try:
        return parse_quantity(size.strip())
    except ValueError as exc:
        raise ConfigError(
            f"device inventory entry {item}={size}: {exc} (example: --devices nvidia:0=80Gi)"
        ) from None


def visibility_env(devices: Iterable[Device]) -> dict[str, str]:
    """The environment that restricts an engine to its devices (DESIGN: engine environment).

    NVIDIA prefers stable UUIDs with PCI bus order, so indices agree with nvidia-smi.
    AMD gets both ROCm variables and never CUDA's. No device at all hides every GPU.
    """
    chosen = list(devices)
    nvidia = [d for d in chosen if d.kind == "nvidia"]
    amd = [d for d in chosen if d.kind == "amd"]
    env: dict[str, str] = {}
    if nvidia:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(d.uuid or d.id for d in nvidia)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if amd:
        ids = ",".join(d.id for d in amd)
        env["HIP_VISIBLE_DEVICES"] = ids
        env["ROCR_VISIBLE_DEVICES"] = ids
    if not nvidia and not amd:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env
