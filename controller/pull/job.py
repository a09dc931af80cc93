"""What one pull process is asked to do, as the JSON its argv carries."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.core.sources import Source


@dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    source: Source
    cache: Path  # the cache root; the entry is cache / source.key
    state_dir: Path  # whose journal gets the pull's events
    deployments: tuple[str, ...]  # the deployments waiting for it (their journals)
    stall_seconds: float = 60.0

    def to_json(self) -> str:
        return json.dumps(
            {
                "source": self.source.model_dump(mode="json", by_alias=True, exclude_none=True),
                "cache": str(self.cache),
                "state_dir": str(self.state_dir),
                "deployments": list(self.deployments),
                "stall_seconds": self.stall_seconds,
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
        )
