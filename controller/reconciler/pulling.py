"""The pass's side of model pulls: what the cache holds, starting a pull, ``{model}``.

The planner reads :meth:`Puller.observe` (each cache key: cached, pulled now, failed,
or not there) and the executor starts a pull process for a :class:`Pull` that says
so; a pull process is found again by its marker or by the entry's lock, so the
next pass (of any process) adopts it instead of starting another.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from controller.core.pulls import PullFailure, PullView, key_of_document
from controller.core.specs import Entry
from controller.core.state import Phase, Record
from controller.pull import launch
from controller.pull.job import Job
from controller.store import modelcache
from controller.store.modelcache import CacheEntry

STALL_ENV = "RECONCILE_PULL_STALL"  # seconds without a byte before a pull fails (tests: less)
DEFAULT_STALL = 60.0
# Failures in a row after which a pull counts as failing (``--once`` exits 1, ``--wait``
# stops): the first failure is retried at once, as a first restart is; one that fails
# again is backing off, as a crash-looping engine is.
FAILING_AFTER = 2


@dataclass(frozen=True, slots=True)
class Puller:
    cache: Path
    state_dir: Path
    stall_seconds: float = DEFAULT_STALL

    @classmethod
    def of(cls, state_dir: Path) -> Puller:
        stall = float(os.environ.get(STALL_ENV) or DEFAULT_STALL)
        return cls(modelcache.cache_root(state_dir), state_dir, stall)

    def observe(self) -> dict[str, PullView]:
        running = frozenset(launch.running(self.cache))
        return modelcache.look_all(self.cache, running)

    def start(self, entry: Entry, waiting: tuple[str, ...]) -> int:
        source = entry.deployment.spec.source
        assert source is not None
        job = Job(
            source=source,
            cache=self.cache,
            state_dir=self.state_dir,
            deployments=waiting or (entry.name,),
            stall_seconds=self.stall_seconds,
        )
        return launch.spawn(job)

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


def failing(records: Iterable[Record], state_dir: Path) -> dict[str, str]:
    """Pulling deployments whose pull failed FAILING_AFTER times in a row: name -> why.

    Read from each entry's result, which a retry leaves in place until its own outcome
    replaces it, so a pass that has just restarted the pull still sees the failures.
    """
    root = modelcache.cache_root(state_dir)
    out: dict[str, str] = {}
    for rec in records:
        failure = _failure(rec, root) if rec.phase is Phase.PULLING else None
        if failure is not None and failure.attempts >= FAILING_AFTER:
            out[rec.name] = (
                f"{rec.name}: its pull keeps failing ({failure.attempts} attempts in a row; "
                f"last: {failure.message})"
            )
    return out


def _failure(rec: Record, root: Path) -> PullFailure | None:
    key = key_of_document(rec.stored_spec)
    if key is None or not modelcache.KEY.match(key):
        return None
    result = CacheEntry.of(root, key).result()
    if result is None or result.get("status") != "failed":
        return None
    return PullFailure.from_json(result)
