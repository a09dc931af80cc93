"""Each pass's look at the GPUs (host/gpuhealth.py), kept as observed state
(store/devicehealth.py): a critical Xid or a rise of uncorrectable ECC errors makes a
device Unhealthy (core/devicefaults.py decides); the planner then moves what holds it.

The source lives as long as the reconciler (the daemon's: its NVML event set sees every
Xid from its start). A look that fails is logged and changes nothing: a broken driver
must not stop a pass.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from controller.core.devicefaults import DeviceHealth, Reading, describe, observe
from controller.errors import ConfigError
from controller.host.gpuhealth import Source
from controller.logsetup import get_logger
from controller.store import devicehealth

log = get_logger("reconcile")


class DeviceWatch:
    def __init__(self, state_dir: Path, source: Source) -> None:
        self.state_dir = state_dir
        self.source = source
        self.last = Reading()  # the latest reading (its processes' memory: measured.py)

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
