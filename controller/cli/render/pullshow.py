"""A pull as people see it outside ``status``: the ``--wait`` bar, ``describe``'s lines.

Both read the pull's own progress.json in the model cache each time they draw (the
record's message is the last pass's figure; the file is the pull's, twice a second).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from controller.core.manifest.quantity import format_age
from controller.core.pulls import PullProgress, eta_text, key_of_document, progress_text, size_text
from controller.core.state import Phase, Record
from controller.store.models.modelcache import KEY, CacheEntry, cache_root

BAR = 24  # cells of the --wait bar


def progress_of(rec: Record, state_dir: Path) -> PullProgress | None:
    """The live progress of a Pulling record's pull, if it has written any."""
    if rec.phase is not Phase.PULLING:
        return None
    key = key_of_document(rec.stored_spec)
    if key is None or not KEY.match(key):
        return None
    return CacheEntry.of(cache_root(state_dir), key).live_progress()


def fraction(progress: PullProgress) -> float | None:
    total = progress.bytes_total
    return min(progress.bytes_done / total, 1.0) if total else None


def bar(progress: PullProgress) -> str:
    """``[#########---------------]  38%  1.6/4.1 GB 35.0 MB/s ETA 1m11s``."""
    text = progress_text(progress).removeprefix("Pulling ")
    share = fraction(progress)
    if share is None:
        return text  # no total (a server that sends no length): bytes and rate only
    filled = int(share * BAR)
    return f"[{'#' * filled}{'-' * (BAR - filled)}] {share:4.0%}  {text}"


def decile(progress: PullProgress) -> int | None:
    """Which tenth the pull is in: off a terminal, one line each (0..10)."""
    share = fraction(progress)
    return None if share is None else int(share * 10)


def describe_lines(rec: Record, state_dir: Path, now: datetime) -> list[tuple[str, str]]:
    """``describe``'s Pull field: bytes done/total, share, rate, ETA, since when."""
    progress = progress_of(rec, state_dir)
    if progress is None:
        return []
    parts = [f"{size_text(progress.bytes_done)} of "]
    total = progress.bytes_total
    parts.append(size_text(total) if total is not None else "unknown size")
    share = fraction(progress)
    if share is not None:
        parts.append(f" ({share:.0%})")
    if progress.rate > 0:
        parts.append(f", {size_text(progress.rate)}/s")
        if total is not None and progress.bytes_done < total:
            parts.append(f", ETA {eta_text((total - progress.bytes_done) / progress.rate)}")
    age = format_age(max((now - progress.started_at).total_seconds(), 0))
    parts.append(f", started {age} ago")
    if progress.pid:
        parts.append(f" (pid {progress.pid})")
    return [("Pull", "".join(parts))]
