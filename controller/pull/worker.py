"""One pull, start to end: lock the cache entry, fetch, write the result, journal it.

The entry's flock is held for the whole pull, so a second pull of the same content
waits here and then finds it done (two deployments of one file download it once).
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any

from controller.core.pulls import FailureKind
from controller.pull.hubfetch import fetch_hub
from controller.pull.job import Job, PullError
from controller.pull.meter import ProgressMeter
from controller.pull.statewatch import StateWatch, Swapped
from controller.pull.urlfetch import fetch_url
from controller.redact import redact_url
from controller.store.instances.events import Journal
from controller.store.models.modelcache import CacheEntry, utcnow


def run(job: Job, watch: StateWatch | None = None) -> int:
    """0 when the files are in the cache, 1 when this pull failed (its result says why)
    or stopped because its state dir was swapped (``watch``: its log says why)."""
    watch = watch or StateWatch.none()
    entry = CacheEntry.of(job.cache, job.source.key)
    entry.ensure()
    with entry.lock.hold(timeout=None):
        if entry.model_path() is not None:
            return 0  # a pull we waited for finished it
        return _pull(job, entry, watch)


def _pull(job: Job, entry: CacheEntry, watch: StateWatch) -> int:
    # A failed result stays until this attempt's own outcome replaces it: the pass that
    # started the retry still sees how many failed before (``--once`` exits 1 on a loop).
    attempts = _failures_so_far(entry, job.source.origin)
    meter = ProgressMeter(entry, watch)
    started = time.monotonic()
    try:
        meter.flush(force=True)
        with meter.ticking():
            done = _fetch(job, entry, meter, watch)
    except Swapped:
        return 1  # its log says why; nothing more is written where it would land
    except PullError as exc:
        _failed(job, entry, watch, exc.kind, str(exc), attempts + 1)
        return 1
    except Exception as exc:  # never a traceback for a person: what, and where it went
        _failed(job, entry, watch, "error", f"{type(exc).__name__}: {exc}", attempts + 1)
        return 1
    return _done(job, entry, watch, done, round(time.monotonic() - started, 3))


def _done(
    job: Job, entry: CacheEntry, watch: StateWatch, done: dict[str, Any], seconds: float
) -> int:
    """The record that makes the model usable, then its journal: each only while the state
    dir is the pull's own (a write that fails here is no failed pull: the file is there)."""
    try:
        watch.check()
        entry.write_result({"status": "done", **done, "seconds": seconds, "at": _now()})
        _journal(job, watch, "done", sha256=done["sha256"], seconds=seconds)
    except Swapped:
        return 1  # its log says why
    return 0


def _fetch(job: Job, entry: CacheEntry, meter: ProgressMeter, watch: StateWatch) -> dict[str, Any]:
    source = job.source
    if source.url is not None and source.sha256 is not None:
        return fetch_url(
            source.url, source.sha256, entry, bounds=job.bounds, meter=meter, watch=watch
        )
    assert source.hugging_face is not None
    return fetch_hub(source.hugging_face, entry, bounds=job.bounds, meter=meter)


def _failed(
    job: Job, entry: CacheEntry, watch: StateWatch, kind: FailureKind, message: str, attempts: int
) -> None:
    if not watch.holds():
        return  # its log says why the state dir at its path is not its own now
    message = _named(job, message)
    result = {"status": "failed", "kind": kind, "message": message, "at": _now()}
    origin = {"origin": job.source.origin} if job.source.origin else {}
    entry.write_result({**result, "attempts": attempts, **origin})
    print(f"pull failed: {message}", file=sys.stderr, flush=True)
    with contextlib.suppress(Swapped):
        _journal(job, watch, "failed", error=message, attempts=attempts)


def _named(job: Job, message: str) -> str:
    """Every failure names what was pulled (the URL, or repo@revision), and no secret
    (a URL's password or ``?token=``, which a library's own text may carry)."""
    message = redact_url(message)
    hub = job.source.hugging_face
    named = f"{hub.repo}@{hub.revision}" if hub is not None else job.source.describe()
    return message if named in message else f"{job.source.describe()}: {message}"


def _failures_so_far(entry: CacheEntry, origin: str | None) -> int:
    """Failures in a row before this attempt: of this URL only (another URL of the same
    digest, the one the manifest named before a fix, starts the count again)."""
    previous = entry.result()
    if previous is None or previous.get("status") != "failed":
        return 0
    if None not in (origin, previous.get("origin")) and previous.get("origin") != origin:
        return 0
    attempts = previous.get("attempts", 1)
    return attempts if isinstance(attempts, int) else 1


def _journal(job: Job, watch: StateWatch, outcome: str, **extra: Any) -> None:
    """The pull's outcome in each waiting deployment's journal (the state dir's own)."""
    journal = Journal(job.state_dir)
    for name in job.deployments:
        watch.check()
        journal.append(name, "pull", job.source.describe(), outcome, **extra)


def _now() -> str:
    return utcnow().isoformat()
