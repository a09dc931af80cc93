"""The pull edge of the local backend: pull processes on this host, into its cache.

:meth:`HostPuller.observe` says of each cache key whether it is cached, pulled now,
failed or not there; :meth:`HostPuller.start` spawns a pull process for it. A pull
process is found again by its marker or by the entry's lock, so the next pass (of any
process) adopts it instead of starting another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from controller.core.manifest.specs import Entry
from controller.core.pulls import PullView
from controller.host.procscan import EnvironScan
from controller.pull import launch
from controller.pull.job import Job, hub_env
from controller.store.models import modelcache
from controller.store.models.modelcache import CacheEntry


@dataclass(frozen=True, slots=True)
class HostPuller:
    cache: Path
    state_dir: Path
    stall_seconds: float
    # Kept from pass to pass, as the runtime's: a process read without the marker is not
    # read again (a fresh scan read every process's environment: 1.7 ms of each round).
    scan: EnvironScan = field(default_factory=EnvironScan, compare=False, repr=False)

    def observe(self) -> dict[str, PullView]:
        found = modelcache.entries(self.cache)
        if not found:  # a pull makes its entry before it starts: none runs, no /proc scan
            return {}  # (a pass's scan read every process's environment: ~4 ms of a --once)
        running = frozenset(launch.running(self.cache, self.scan))
        return {e.key: modelcache.look(e, e.key in running) for e in found}

    def settle(self) -> None:
        """Nothing to keep: the pull processes write their own results here."""

    def start(self, entry: Entry, waiting: tuple[str, ...]) -> str:
        source = entry.deployment.spec.source
        assert source is not None
        job = Job(
            source=source,
            cache=self.cache,
            state_dir=self.state_dir,
            deployments=waiting or (entry.name,),
            stall_seconds=self.stall_seconds,
        )
        return f"pid {launch.spawn(job, hub_env(entry))}"

    def model_path(self, entry: Entry) -> str | None:
        """What ``{model}`` names for ``entry``: its cached file or folder (None: no source)."""
        source = entry.deployment.spec.source
        if source is None:
            return None
        path = CacheEntry.of(self.cache, source.key).model_path()
        return str(path) if path is not None else None

    def used(self, entry: Entry, at: datetime) -> None:
        """An engine starts on the entry: `reconcile models` shows when and by whom."""
        source = entry.deployment.spec.source
        if source is not None:
            CacheEntry.of(self.cache, source.key).mark_used(entry.name, at)
