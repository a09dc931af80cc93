"""What one pull process is asked to do, as the JSON its argv carries."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller.core.sources import Source
from controller.store import diskspace

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
