"""Why a pull failed, said for people: what happened, where, and the next move."""

from __future__ import annotations

from controller.core.pulls import FailureKind


class PullError(Exception):
    """A pull that did not finish; ``kind`` tells the planner how to wait (disk: Pending)."""

    def __init__(self, kind: FailureKind, message: str) -> None:
        super().__init__(message)
        self.kind: FailureKind = kind


def stalled(what: str, seconds: float) -> PullError:
    return PullError(
        "stall", f"no byte from {what} for {seconds:g}s: the pull is retried with back-off"
    )


def no_space(folder: str, needed: int, free: int) -> PullError:
    from controller.core.pulls import size_text

    return PullError(
        "disk",
        f"not enough disk space in {folder}: {size_text(needed)} still to download, "
        f"{size_text(free)} free; free some space or point RECONCILE_MODEL_CACHE at a "
        "bigger disk",
    )
