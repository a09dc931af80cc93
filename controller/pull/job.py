"""What one pull process is asked to do, as the JSON its argv carries."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller.core.manifest.sources import Source
from controller.core.manifest.specs import Entry
from controller.core.pulls import FailureKind
from controller.store import (
    diskspace,  # Why a pull failed, said for people: what happened, where, and the next move.
)


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


def hub_env(entry: Entry) -> dict[str, str]:
    """The hub client's settings (``HF_TOKEN``, ``HF_ENDPOINT``...) the deployment gives its
    engine, from ``envFrom`` and ``env`` (env wins, as for the engine), for its hub pull:
    a gated repo's token in the env file reaches the download as it reaches the engine
    (and as the exported initContainer has it). Only for the pull's environment, which
    its owner alone may read: never its argv, its job or its log."""
    if entry.deployment.spec.source is None or entry.deployment.spec.source.url is not None:
        return {}
    merged = {**entry.secret_env, **entry.deployment.spec.env}
    return {k: v for k, v in merged.items() if k.startswith("HF_")}


JOB_ENV = "RECONCILE_PULL_JOB"  # how launch.py hands a pull process its job
MAX_ENV = "RECONCILE_PULL_MAX_BYTES"
# A download whose size neither the server nor the hub says stops here: past the largest
# file the hub holds (50 GB), so only a server that streams without end meets it.
DEFAULT_MAX = 64 << 30


def max_bytes() -> int:
    """``RECONCILE_PULL_MAX_BYTES`` (bytes, or 512M, 80G), else DEFAULT_MAX."""
    return diskspace.parse_bytes(os.environ.get(MAX_ENV, ""), MAX_ENV) or DEFAULT_MAX


@dataclass(frozen=True, kw_only=True, slots=True)
class Bounds:
    """How far a download may go: the stall limit, its most bytes, the space it leaves."""

    stall: float = 60.0
    max_bytes: int = DEFAULT_MAX  # when the server does not say the size
    reserve: int = diskspace.DEFAULT_RESERVE  # free bytes the download must leave


@dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    source: Source
    cache: Path  # the cache root; the entry is cache / source.key
    state_dir: Path  # whose journal gets the pull's events
    deployments: tuple[str, ...]  # the deployments waiting for it (their journals)
    stall_seconds: float = 60.0
    # Read where the job is made (the daemon's environment), carried in its JSON.
    max_bytes: int = field(default_factory=max_bytes)
    reserve_bytes: int = field(default_factory=diskspace.reserve_bytes)

    @property
    def bounds(self) -> Bounds:
        return Bounds(
            stall=self.stall_seconds, max_bytes=self.max_bytes, reserve=self.reserve_bytes
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "source": self.source.model_dump(mode="json", by_alias=True, exclude_none=True),
                "cache": str(self.cache),
                "state_dir": str(self.state_dir),
                "deployments": list(self.deployments),
                "stall_seconds": self.stall_seconds,
                "max_bytes": self.max_bytes,
                "reserve_bytes": self.reserve_bytes,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Job:
        data: dict[str, Any] = json.loads(text)
        return cls(
            source=Source.model_validate(data["source"]),
            cache=Path(data["cache"]),
            state_dir=Path(data["state_dir"]),
            deployments=tuple(str(d) for d in data.get("deployments", ())),
            stall_seconds=float(data.get("stall_seconds", 60.0)),
            max_bytes=int(data.get("max_bytes", DEFAULT_MAX)),
            reserve_bytes=int(data.get("reserve_bytes", diskspace.DEFAULT_RESERVE)),
        )
