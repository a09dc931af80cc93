"""A Pulling deployment as ``status`` shows it: the pull's live progress, read from the
model cache (the record's message is the last pass's; progress.json is the pull's own).
A pull that has ended failed since that pass says so, as the next pass will: its last
figure (``Pulling 0.0/30.0 MB`` after a wrong sha256) read as a download stuck at 0."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

from controller.core.pulls import (
    PullFailure,
    PullProgress,
    key_of_document,
    progress_text,
    url_origin,
)
from controller.core.state import Phase, Record, backoff
from controller.store.models.modelcache import CacheEntry, cache_root


def live(
    records: Sequence[Record], state_dir: Path
) -> tuple[list[Record], dict[str, PullProgress]]:
    """The records, a Pulling one's message the progress now; name -> progress."""
    root = cache_root(state_dir)
    out: list[Record] = []
    found: dict[str, PullProgress] = {}
    for rec in records:
        entry = _entry(rec, root)
        progress = entry.live_progress() if entry is not None else None
        if entry is not None and progress is not None:
            found[rec.name] = progress
            failed = _ended_failed(rec, entry, progress)
            if failed is not None:
                rec = replace(rec, message=failed)
            elif not rec.message.startswith("pull failed"):
                rec = replace(rec, message=progress_text(progress))
        out.append(rec)
    return out, found


def _entry(rec: Record, root: Path) -> CacheEntry | None:
    if rec.phase is not Phase.PULLING:
        return None
    key = key_of_document(rec.stored_spec)
    if key is None:
        return None
    try:
        return CacheEntry.of(root, key)
    except ValueError:  # a key of a shape this version does not know
        return None


def _ended_failed(rec: Record, entry: CacheEntry, progress: PullProgress) -> str | None:
    """The pass's words for this attempt's failure, once its process is gone (no pid in
    the live figure); None while it runs, or when the failure is an older attempt's or
    another URL's (a retry killed mid-way, a URL fixed since)."""
    if progress.pid is not None:
        return None
    result = entry.result()
    if result is None or result.get("status") != "failed":
        return None
    failure = PullFailure.from_json(result)
    if failure is None:  # a torn or foreign file: the figure stands
        return None
    source = rec.stored_spec.get("source")
    url = source.get("url") if isinstance(source, dict) else None
    if failure.at < progress.started_at or (
        isinstance(url, str) and failure.origin not in (None, url_origin(url))
    ):
        return None
    retry_at = failure.at + timedelta(seconds=backoff(failure.attempts))
    return f"pull failed: {failure.message}; retry at {retry_at:%H:%M:%S}"
