"""A Pulling deployment as ``status`` shows it: the pull's live progress, read from the
model cache (the record's message is the last pass's; progress.json is the pull's own)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from controller.core.pulls import PullProgress, key_of_document, progress_text
from controller.core.state import Phase, Record
from controller.store.models.modelcache import CacheEntry, cache_root


def live(
    records: Sequence[Record], state_dir: Path
) -> tuple[list[Record], dict[str, PullProgress]]:
    """The records, a Pulling one's message the progress now; name -> progress."""
    root = cache_root(state_dir)
    out: list[Record] = []
    found: dict[str, PullProgress] = {}
    for rec in records:
        progress = _progress(rec, root)
        if progress is not None:
            found[rec.name] = progress
            if not rec.message.startswith("pull failed"):
                rec = replace(rec, message=progress_text(progress))
        out.append(rec)
    return out, found


def _progress(rec: Record, root: Path) -> PullProgress | None:
    if rec.phase is not Phase.PULLING:
        return None
    key = key_of_document(rec.stored_spec)
    if key is None:
        return None
    try:
        return CacheEntry.of(root, key).live_progress()
    except ValueError:  # a key of a shape this version does not know
        return None
