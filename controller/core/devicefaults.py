"""GPU health as values: which Xids make a device Unhealthy, and the pure step that
turns what NVML reported into the node's device health (no I/O, no clock).

The Xids taken are the ones NVIDIA's Xid catalog resolves with a GPU reset (or a node
reboot) or reads as a lost GPU; application Xids (13, 31, 43, 45: a kernel's own fault)
and informational ones are left out, since restarting the engine elsewhere would not
cure them. A rise of the uncorrectable (double-bit) ECC count since the last reading
counts the same: the memory can no longer be trusted. ``reconcile devices --clear``
returns a device; readings from before the clear are not held against it again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

# Xid -> what NVIDIA's documentation says it means (all: reset the GPU or it is lost).
CRITICAL_XIDS: Mapping[int, str] = {
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remap recorded: a reset applies it",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}


@dataclass(frozen=True, slots=True)
class DeviceFault:
    """Why a device is Unhealthy, and since when."""

    device: str  # kind:id
    reason: str
    since: datetime


@dataclass(frozen=True, slots=True)
class Measured:
    """An engine's peak GPU memory on each of its devices (bytes), as of ``at``
    (``devices.memory: auto`` leases it + 10%: core/planner/ledger.py)."""

    peak: int
    at: datetime
    name: str = ""  # the record it was measured on


@dataclass(frozen=True, slots=True)
class XidEvent:
    device: str
    xid: int
    time: datetime


@dataclass(frozen=True, slots=True)
class Reading:
    """One look at the GPUs: Xid events since the last look, ECC counts now, and what
    each process holds (pid -> bytes used, summed over its GPUs)."""

    xids: tuple[XidEvent, ...] = ()
    ecc: Mapping[str, int] = field(default_factory=dict)  # device -> uncorrected errors
    memory: Mapping[int, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    """The node's device health (``<state>/devices/health.json``)."""

    faults: Mapping[str, DeviceFault] = field(default_factory=dict)
    cleared: Mapping[str, datetime] = field(default_factory=dict)  # device -> last --clear
    ecc: Mapping[str, int] = field(default_factory=dict)  # the last uncorrected counts

    def cleared_now(self, device: str, now: datetime) -> DeviceHealth:
        """``devices --clear``: healthy again; the ECC count read next is the new base."""
        faults = {k: v for k, v in self.faults.items() if k != device}
        ecc = {k: v for k, v in self.ecc.items() if k != device}
        return DeviceHealth(faults, {**self.cleared, device: now}, ecc)


def observe(health: DeviceHealth, reading: Reading, now: datetime) -> DeviceHealth:
    """``health`` with ``reading`` applied: new faults for critical Xids and ECC rises."""
    faults = dict(health.faults)
    for event in reading.xids:
        meaning = CRITICAL_XIDS.get(event.xid)
        cleared = health.cleared.get(event.device)
        if meaning is None or event.device in faults or (cleared and event.time <= cleared):
            continue
        reason = f"Xid {event.xid} ({meaning})"
        faults[event.device] = DeviceFault(event.device, reason, event.time)
    for device, count in reading.ecc.items():
        before = health.ecc.get(device)
        if before is not None and count > before and device not in faults:
            reason = f"uncorrectable ECC errors rose from {before} to {count}"
            faults[device] = DeviceFault(device, reason, now)
    return replace(health, faults=faults, ecc={**health.ecc, **reading.ecc})


def describe(fault: DeviceFault) -> str:
    since = fault.since.isoformat(timespec="seconds")
    return f"device {fault.device} Unhealthy since {since}: {fault.reason}"


def health_fields(fault: DeviceFault | None) -> dict[str, str | None]:
    """A device's health as ``devices -o json`` shows it."""
    if fault is None:
        return {"health": "Healthy", "health_reason": None, "unhealthy_since": None}
    since = fault.since.isoformat(timespec="seconds")
    return {"health": "Unhealthy", "health_reason": fault.reason, "unhealthy_since": since}
