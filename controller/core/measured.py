"""Measured memory: ``devices.memory: auto`` resolved from the engine's last measured peak.

On NVML hosts each pass records the peak GPU memory an engine's processes used, per
spec hash and device (``store/measured.py``). A spec that says ``memory: auto`` leases
whole devices until there is a measurement, then the peak plus 10%: estimates (weights,
KV cache, CUDA graphs) are what every estimator gets wrong, the engine's own use is not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from controller.core.devicefaults import Measured
from controller.core.quantity import format_bytes
from controller.core.specs import Entry


def with_headroom(peak: int) -> int:
    """The peak + 10%, rounded up (never below)."""
    return peak + (peak + 9) // 10


def resolve(entry: Entry, measured: Mapping[str, Measured]) -> tuple[Entry, str]:
    """``entry`` with an ``auto`` memory request resolved, and what to say about it
    (the Start's reason); any other entry unchanged, with nothing to say."""
    devices = entry.deployment.spec.devices
    found = measured.get(entry.hash)
    if not devices.memory_auto:
        if found is None or devices.count == 0:
            return entry, ""
        asked = "whole devices" if devices.memory is None else format_bytes(devices.memory)
        return entry, f" (memory {asked} requested, measured {format_bytes(found.peak)})"
    if found is None:
        return entry, " (memory auto: not measured yet, whole devices)"
    lease = with_headroom(found.peak)
    spec = entry.deployment.spec
    resolved = spec.model_copy(update={"devices": devices.model_copy(update={"memory": lease})})
    deployment = entry.deployment.model_copy(update={"spec": resolved})
    note = f" (memory auto: measured {format_bytes(found.peak)} + 10% = {format_bytes(lease)})"
    return dataclasses.replace(entry, deployment=deployment), note
