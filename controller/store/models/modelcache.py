"""The shared model cache: one folder per content key (DESIGN.md "Model files").

```
<cache>/<key>/lock            flock held by the pull process for its whole life
<cache>/<key>/progress.json   bytes done/total, rate, started_at (rewritten as it goes)
<cache>/<key>/result.json     {"status": "done", "path", "sha256", ...} or "failed"
<cache>/<key>/used.json       deployment -> when an engine last started with it
<cache>/<key>/<file>.partial  a URL download in progress: kept for resume, never used
<cache>/<key>/<file>          the checked file (renamed from .partial after sha256)
<cache>/<key>/files/          a hub snapshot (huggingface_hub's local_dir)
<cache>/<key>/nodes.json      a cluster's pull: which nodes hold the files, and where
```

On a cluster the files are pulled on the node that runs the engine, into that node's
cache (the same layout); this host's entry then keeps ``nodes.json`` (the backend's
note of where copies are), ``progress.json`` (the node's last figure, for ``status``)
and ``used.json``.

``<key>`` is :attr:`controller.core.manifest.sources.Source.key`: hex and a prefix only, so no
user text names a path here (invariant 9); the file name of a URL is reduced to a
safe basename (:func:`controller.core.pulls.file_name`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from controller.core.pulls import PullFailure, PullProgress, PullView
from controller.store.documents import write_atomic
from controller.store.lock import FileLock
from controller.store.statedir import StateDir

ENV = "RECONCILE_MODEL_CACHE"
KEY = re.compile(r"^(sha256-[0-9a-f]{64}|hf-[0-9a-f]{40})$")


# The entry's notes about its model, in its folder beside the model's files
NOTES = frozenset(
    ("lock", "progress.json", "progress.json.tmp", "result.json", "used.json", "nodes.json")
)


def cache_root(state_dir: Path) -> Path:
    """``RECONCILE_MODEL_CACHE``, else ``<state>/models``: shared by every deployment."""
    configured = os.environ.get(ENV)
    return Path(configured).expanduser() if configured else StateDir(state_dir).models


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """One key's folder and the files in it."""

    folder: Path

    @classmethod
    def of(cls, root: Path, key: str) -> CacheEntry:
        if not KEY.match(key):
            raise ValueError(f"not a model cache key: {key!r}")
        return cls(root / key)

    @property
    def key(self) -> str:
        return self.folder.name

    @property
    def lock(self) -> FileLock:
        return FileLock(self.folder / "lock", what=f"model cache entry {self.key}")

    def ensure(self) -> None:
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)

    def busy(self) -> bool:
        """A pull holds the entry's lock now (the kernel drops it when the pull dies)."""
        if not (self.folder / "lock").exists():
            return False
        lock = self.lock
        if lock.try_acquire():
            lock.release()
            return False
        return True

    # -- the files a pull writes ---------------------------------------------------------

    def write_progress(self, progress: PullProgress) -> None:
        """Often rewritten and only read for show: a rename, no fsync."""
        tmp = self.folder / "progress.json.tmp"
        tmp.write_text(json.dumps(progress.as_json()))
        os.replace(tmp, self.folder / "progress.json")

    def progress(self) -> PullProgress | None:
        data = _read_json(self.folder / "progress.json")
        return PullProgress.from_json(data) if data is not None else None

    def live_progress(self) -> PullProgress | None:
        """:meth:`progress` as it stands now, for people: a pull whose process is gone
        (killed, the host rebooted) holds no lock and moves no byte, so it shows no rate,
        ETA or pid until the next pass resumes it. A cluster's pull (``nodes.json``)
        holds its lock on its node: its figure is shown as the backend noted it."""
        progress = self.progress()
        if progress is None or self.nodes():
            return progress
        try:
            if self.busy():
                return progress
        except OSError:  # a lock this user may not take: say what the file says
            return progress
        return replace(progress, rate=0.0, pid=None)

    def write_result(self, result: dict[str, Any]) -> None:
        write_atomic(self.folder / "result.json", json.dumps(result).encode(), 0o644)

    def result(self) -> dict[str, Any] | None:
        return _read_json(self.folder / "result.json")

    def model_path(self) -> Path | None:
        """What ``{model}`` names: the done file or snapshot folder, if it is there."""
        result = self.result()
        if result is None or result.get("status") != "done":
            return None
        path = self.folder / str(result.get("path", ""))
        inside = path.resolve().is_relative_to(self.folder.resolve())
        return path if inside and path.exists() else None

    # -- who uses it ---------------------------------------------------------------------

    def mark_used(self, deployment: str, at: datetime) -> None:
        used = self.used()
        used[deployment] = at.isoformat()
        write_atomic(self.folder / "used.json", json.dumps(used, sort_keys=True).encode(), 0o644)

    def used(self) -> dict[str, str]:
        """deployment -> when it last started with it; an entry that is no time (a hand
        edit, a foreign file) is left out, as never used: `models` failed on it."""
        data = _read_json(self.folder / "used.json") or {}
        return {str(k): v for k, v in data.items() if isinstance(v, str) and _aware(v)}

    # -- copies on cluster nodes (the note a cluster backend keeps here) ------------------

    def nodes(self) -> dict[str, Any]:
        return _read_json(self.folder / "nodes.json") or {}

    def write_nodes(self, note: dict[str, Any]) -> None:
        self.ensure()
        write_atomic(self.folder / "nodes.json", json.dumps(note, sort_keys=True).encode(), 0o644)

    def size(self) -> int:
        """The model's bytes (the file, a snapshot, a partial download), as `plan` counts
        them: the cache's own notes beside them (``result.json``...) are not the model's."""
        files = (p for p in self.folder.rglob("*") if p.is_file() and p.name not in NOTES)
        return sum(p.stat().st_size for p in files)

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def entries(root: Path) -> list[CacheEntry]:
    """Every entry of the cache, by key (anything else in the folder is not ours)."""
    if not root.is_dir():
        return []
    return [CacheEntry(p) for p in sorted(root.iterdir()) if p.is_dir() and KEY.match(p.name)]


def look(entry: CacheEntry, running: bool) -> PullView:
    """What a pass needs to know of one key; ``running``: a pull process was seen."""
    if entry.model_path() is not None:
        return PullView(key=entry.key, cached=True)
    result = entry.result()
    failure = PullFailure.from_json(result) if result and result.get("status") == "failed" else None
    if running or entry.busy():  # a retry: the failures before it still count
        return PullView(key=entry.key, running=True, progress=entry.progress(), failure=failure)
    return PullView(key=entry.key, progress=entry.progress(), failure=failure)


def utcnow() -> datetime:
    return datetime.now(UTC)


def _aware(text: str) -> bool:
    """``text`` is an ISO time with its zone (one without could not be compared to now)."""
    try:
        return datetime.fromisoformat(text).tzinfo is not None
    except ValueError:
        return False


def _read_json(path: Path) -> dict[str, Any] | None:
    """A small JSON object, or None when absent or torn (never fatal: it is re-observed)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
