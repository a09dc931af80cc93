"""One pull, start to end: lock the cache entry, fetch, write the result, journal it.

The entry's flock is held for the whole pull, so a second pull of the same content
waits here and then finds it done (two deployments of one file download it once).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from controller.core.pulls import FailureKind
from controller.pull.hubfetch import fetch_hub
from controller.pull.job import Job, PullError
from controller.pull.launch import STATE_ID
from controller.pull.meter import ProgressMeter
from controller.pull.urlfetch import fetch_url
from controller.redact import redact_url
from controller.store.config import stateid
from controller.store.instances.events import Journal
from controller.store.models.modelcache import CacheEntry, utcnow


def run(job: Job) -> int:
    """0 when the files are in the cache, 1 when this pull failed (its result says why)."""
    entry = CacheEntry.of(job.cache, job.source.key)
    entry.ensure()
    with entry.lock.hold(timeout=None):
        if entry.model_path() is not None:
            return 0  # a pull we waited for finished it
        return _pull(job, entry)


def replaced(job: Job) -> str | None:
    """Why the pull process a pass started writes nothing: the folder at its state dir's
    path is another state dir's now, or none's (its disk unmounted, the folder left
    empty), since that pass. Its first write made its cache entry's folders there: a cold
    start on a loaded box came after the swap (tests/integration/test_state_id.py). A Ray
    node's pull (a thread, in its own node folder) has no such id to check."""
    ours = os.environ.get(STATE_ID)
    if not ours:
        return None  # started by hand, or by a state dir with no id yet
    now = stateid.peek(job.state_dir)
    if now == ours:
        return None
    return (
        f"pull not started: {job.state_dir} is no longer the state dir that started it "
        f"(its id is {now or 'missing'}, not {ours}); nothing written. Put the state dir "
        "back (mount its disk) and run again: its next pass starts the pull anew"
    )


def _pull(job: Job, entry: CacheEntry) -> int:
    # A failed result stays until this attempt's own outcome replaces it: the pass that
    # started the retry still sees how many failed before (``--once`` exits 1 on a loop).
    attempts = _failures_so_far(entry, job.source.origin)
    meter = ProgressMeter(entry)
    meter.flush(force=True)
    started = time.monotonic()
    try:
        with meter.ticking():
            done = _fetch(job, entry, meter)
    except PullError as exc:
        _failed(job, entry, exc.kind, str(exc), attempts + 1)
        return 1
    except Exception as exc:  # never a traceback for a person: what, and where it went
        _failed(job, entry, "error", f"{type(exc).__name__}: {exc}", attempts + 1)
        return 1
    seconds = round(time.monotonic() - started, 3)
    entry.write_result({"status": "done", **done, "seconds": seconds, "at": _now()})
    _journal(job, "pull", job.source.describe(), "done", sha256=done["sha256"], seconds=seconds)
    return 0


def _fetch(job: Job, entry: CacheEntry, meter: ProgressMeter) -> dict[str, Any]:
    source = job.source
    if source.url is not None and source.sha256 is not None:
        return fetch_url(source.url, source.sha256, entry, bounds=job.bounds, meter=meter)
    assert source.hugging_face is not None
    return fetch_hub(source.hugging_face, entry, bounds=job.bounds, meter=meter)


def _failed(job: Job, entry: CacheEntry, kind: FailureKind, message: str, attempts: int) -> None:
    message = _named(job, message)
    result = {"status": "failed", "kind": kind, "message": message, "at": _now()}
    origin = {"origin": job.source.origin} if job.source.origin else {}
    entry.write_result({**result, "attempts": attempts, **origin})
    print(f"pull failed: {message}", file=sys.stderr, flush=True)
    _journal(job, "pull", job.source.describe(), "failed", error=message, attempts=attempts)


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


def _journal(job: Job, action: str, reason: str, outcome: str, **extra: Any) -> None:
    journal = Journal(job.state_dir)
    for name in job.deployments:
        journal.append(name, action, reason, outcome, **extra)


def _now() -> str:
    return utcnow().isoformat()
