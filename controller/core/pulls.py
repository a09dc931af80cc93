"""What a pass knows of a model pull, and how it reads to a person. Pure.

The pull process writes these as JSON in its cache entry (``store/models/modelcache.py``);
the planner reads them as observations (:class:`PullView`, keyed by cache key), and
``status`` shows :func:`progress_text`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from controller.core.digest import sha256_hex

# why a pull failed: disk space waits (Pending), the others back off and retry
FailureKind = Literal["disk", "checksum", "http", "stall", "error"]
KINDS: tuple[FailureKind, ...] = ("disk", "checksum", "http", "stall", "error")
SAFE_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


def url_key(sha256: str) -> str:
    """A URL's cache key: the content's own digest (two URLs of one file share it)."""
    return f"sha256-{sha256.lower()}"


def hub_key(repo: str, revision: str, files: Iterable[str]) -> str:
    """A hub source's cache key: hex of repo@revision and its globs, never their text."""
    what = "\n".join([f"{repo}@{revision}", *sorted(files)])
    return "hf-" + sha256_hex(what.encode())[:40]


def file_name(url: str) -> str:
    """What a URL's file is called in the cache (and in a pod's volume): the URL's last
    path segment when it is a plain file name, else ``model`` (never a path)."""
    last = unquote(urlsplit(url).path.rsplit("/", 1)[-1])
    return last if SAFE_FILE.match(last) and not last.endswith(".partial") else "model"


def url_origin(url: str) -> str:
    """Which URL a pull fetched, as hex (a URL may hold a token): two URLs of one digest
    share a cache key, but a failure of one (a typo's 404) is not the other's."""
    return sha256_hex(url.encode())[:16]


def key_of_document(spec: dict[str, Any]) -> str | None:
    """The cache key of a stored spec document's ``source`` (no pydantic: status reads it)."""
    source = spec.get("source")
    if not isinstance(source, dict):
        return None
    if isinstance(source.get("sha256"), str):
        return url_key(source["sha256"])
    hub = source.get("huggingFace")
    if isinstance(hub, dict) and isinstance(hub.get("repo"), str):
        return hub_key(hub["repo"], str(hub.get("revision", "main")), hub.get("files") or ())
    return None


@dataclass(frozen=True, slots=True)
class PullProgress:
    bytes_done: int
    bytes_total: int | None
    rate: float  # bytes per second, over the last few seconds
    started_at: datetime
    pid: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "bytes_done": self.bytes_done,
            "bytes_total": self.bytes_total,
            "rate": round(self.rate, 1),
            "started_at": self.started_at.isoformat(),
            "pid": self.pid,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PullProgress | None:
        try:
            total = data.get("bytes_total")
            return cls(
                bytes_done=int(data["bytes_done"]),
                bytes_total=None if total is None else int(total),
                rate=float(data.get("rate") or 0.0),
                started_at=datetime.fromisoformat(str(data["started_at"])),
                pid=int(data["pid"]) if data.get("pid") else None,
            )
        except (KeyError, TypeError, ValueError):
            return None  # torn or foreign: shown as no progress, never fatal


@dataclass(frozen=True, slots=True)
class PullFailure:
    kind: FailureKind
    message: str
    at: datetime
    attempts: int  # failures in a row: the back-off's count
    origin: str | None = None  # url_origin of the URL that failed (None: a hub source)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "message": self.message,
            "at": self.at.isoformat(),
            "attempts": self.attempts,
        }
        return out if self.origin is None else {**out, "origin": self.origin}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PullFailure | None:
        kind = data.get("kind")
        try:
            return cls(
                kind=kind if kind in KINDS else "error",
                message=str(data.get("message", "")),
                at=datetime.fromisoformat(str(data["at"])),
                attempts=max(int(data.get("attempts", 1)), 1),
                origin=str(data["origin"]) if data.get("origin") else None,
            )
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True, slots=True)
class PullView:
    """One cache key as a pass saw it: cached, being pulled, failed, or not yet there."""

    key: str
    cached: bool = False
    running: bool = False
    progress: PullProgress | None = None
    failure: PullFailure | None = None
    # A cluster's nodes that hold the files (as its devices name them: Device.node); the
    # plan takes their devices first, where the engine can run from them at once. Empty:
    # one node's cache (every device alike), or none holds them yet.
    nodes: frozenset[str] = frozenset()

    def failure_for(self, origin: str | None) -> PullFailure | None:
        """The failure as it bears on a source fetched from ``origin``: none when it was
        another URL's (the manifest's URL was fixed since: no back-off, no count)."""
        failure = self.failure
        if failure is None or None in (failure.origin, origin) or failure.origin == origin:
            return failure
        return None


def size_text(n: float) -> str:
    """Decimal units, as download tools print them: 1.2 GB, 35 MB."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def eta_text(seconds: float) -> str:
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def progress_text(progress: PullProgress | None) -> str:
    """``Pulling 1.2/4.1 GB 35.0 MB/s ETA 1m23s`` (what is known of it)."""
    if progress is None:
        return "Pulling"
    done, total, rate = progress.bytes_done, progress.bytes_total, progress.rate
    if total is None:
        return f"Pulling {size_text(done)} {size_text(rate)}/s"
    unit = size_text(total).split()[1]
    scale = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}[unit]
    amount = f"{done / scale:.1f}/{total / scale:.1f} {unit}"
    if rate <= 0 or done >= total:
        return f"Pulling {amount}"
    return f"Pulling {amount} {size_text(rate)}/s ETA {eta_text((total - done) / rate)}"
