"""What ``plan`` says of a Pull: the bytes to download (asked of the server when no pull
has said yet), and whether the pull keeps failing (then ``--once`` would exit 1)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from controller.core.actions import Pull
from controller.core.pulls import size_text
from controller.core.sources import Source
from controller.core.state import Observed
from controller.pull.sizes import remote_size
from controller.reconciler.pulling import FAILING_AFTER


@dataclass(frozen=True, slots=True)
class PlanNote:
    """What ``plan`` adds to a Pull: the bytes to download, and whether it keeps failing."""

    text: str  # "2.1 GB to download", "1.0 of 2.1 GB left to download", "unknown size"
    bytes: int | None  # still to download; None: unknown
    failing: bool  # failed FAILING_AFTER times in a row: `--once` would exit 1


def plan_note(
    action: Pull, observed: Observed, size: Callable[[Source], int | None] = remote_size
) -> PlanNote:
    view = observed.pulls.get(action.key)
    failure = view.failure if view is not None else None
    failing = failure is not None and failure.attempts >= FAILING_AFTER
    progress = view.progress if view is not None else None
    if progress is not None and progress.bytes_total is not None:
        left = max(progress.bytes_total - progress.bytes_done, 0)
        if not progress.bytes_done:
            return PlanNote(f"{size_text(left)} to download", left, failing)
        whole = size_text(progress.bytes_total)
        return PlanNote(f"{size_text(left)} of {whole} left to download", left, failing)
    source = action.entry.deployment.spec.source
    total = size(source) if source is not None else None
    if total is None:
        return PlanNote("unknown size", None, failing)
    return PlanNote(f"{size_text(total)} to download", total, failing)
