"""Each pass's look at the GPUs (host/gpuhealth.py), kept as observed state
(store/side/devicehealth.py): a critical Xid or a rise of uncorrectable ECC errors makes a
device Unhealthy (core/devicefaults.py decides); the planner then moves what holds it.

The source lives as long as the reconciler (the daemon's: its NVML event set sees every
Xid from its start). A look that fails is logged and changes nothing: a broken driver
must not stop a pass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path

from controller.core.devicefaults import DeviceHealth, Measured, Reading, describe, observe
from controller.core.state import Observed
from controller.errors import ConfigError
from controller.host.gpuhealth import HealthSource
from controller.logsetup import get_logger
from controller.store.side import devicehealth, measured

log = get_logger("reconcile")


class DeviceWatch:
    def __init__(self, state_dir: Path, source: HealthSource) -> None:
        self.state_dir = state_dir
        self.source = source
        self.last = Reading()  # the latest reading (its processes' memory: measured.py)
        # Told of each device newly marked Unhealthy (device, why): the notifications.
        self.on_fault: Callable[[str, str], None] = lambda device, why: None

    def look(self) -> None:
        """Read the GPUs and record what changed in their health."""
        try:
            reading = self.source.read()
        except (ConfigError, OSError, ValueError) as exc:
            log.warning("GPU health not read", error=str(exc))
            return
        self.last = reading
        if not reading.xids and not reading.ecc:
            return  # nothing to judge (the common case off NVML): no file written

        def judged(health: DeviceHealth) -> DeviceHealth:
            return observe(health, reading, datetime.now(UTC))

        before = devicehealth.read(self.state_dir).faults
        after = devicehealth.update(self.state_dir, judged).faults
        for key in sorted(set(after) - set(before)):
            log.warning("device unhealthy", device=key, reason=describe(after[key]))
            self.on_fault(key, describe(after[key]))

    def measure(self, observed: Observed, node: str | None) -> None:
        """Record the peak GPU memory of each live engine (the last look's processes)."""
        if self.last.memory:
            measured.note(self.state_dir, engine_peaks(observed, self.last.memory, node))


def engine_peaks(
    observed: Observed, used: Mapping[int, int], node: str | None
) -> dict[str, Measured]:
    """Spec hash -> what each live engine of ours on this node holds per device now:
    its processes' GPU memory (the engine and every process carrying its marker)."""
    now = datetime.now(UTC)
    seen: dict[str, Measured] = {}
    for view in observed.records.values():
        rec = view.record
        if not view.alive or not rec.devices or rec.ref is None or rec.elsewhere(node):
            continue
        pids = {rec.ref.pid} | {m.ref.pid for m in view.markers}
        total = sum(used.get(pid, 0) for pid in pids)
        if total > 0 and rec.spec_hash:
            per_device = -(-total // len(rec.devices))
            best = seen.get(rec.spec_hash)
            if best is None or per_device > best.peak:
                seen[rec.spec_hash] = Measured(per_device, now, rec.name)
    return seen
