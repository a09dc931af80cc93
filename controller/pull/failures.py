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


def no_space(folder: str, needed: int, free: int, reserve: int) -> PullError:
    from controller.core.pulls import size_text

    return PullError(
        "disk",
        f"not enough disk space in {folder}: {size_text(needed)} still to download, "
        f"{size_text(free)} free, {size_text(reserve)} to be left free "
        "(RECONCILE_DISK_RESERVE); free some space or point RECONCILE_MODEL_CACHE at a "
        "bigger disk",
    )


def disk_filled(url: str, partial: str, written: int, free: int, reserve: int) -> PullError:
    """The disk filled up during the download: its partial file was dropped."""
    from controller.core.pulls import size_text

    return PullError(
        "disk",
        f"{url}: the disk of {partial} filled up after {size_text(written)} of the "
        f"download ({size_text(free)} free, {size_text(reserve)} to be left free, "
        "RECONCILE_DISK_RESERVE): the partial file was dropped; free some space or point "
        "RECONCILE_MODEL_CACHE at a bigger disk",
    )


def too_big(url: str, received: int, bound: int, why: str) -> PullError:
    """The server sent more than the download may be: its partial file was dropped."""
    from controller.core.pulls import size_text

    return PullError(
        "http",
        f"{url}: the server sent more than {size_text(bound)} ({why}; {size_text(received)} "
        "received): the partial file was dropped; check source.url",
    )
