"""Files from the Hugging Face hub, through ``huggingface_hub`` as its docs show.

``snapshot_download`` into the entry's ``files/`` (its ``local_dir`` mode): the library
resumes its own ``.incomplete`` files, checks what it downloads and reads
``HF_ENDPOINT``/``HF_TOKEN`` as usual. A dry run first gives the sizes for the disk
check and the progress total; progress is the bytes under ``files/`` as they grow.

The library checks a file's size only once it has it all, so a server (a mirror in
HF_ENDPOINT) that streams more than the hub's listing said could fill the disk. The
watcher that meters progress also guards it: past the listed size (plus a slack), or
below the free-space reserve, it drops the partial files and signals the main thread,
which raises the reason (the pull process then exits at once, the library's download
threads with it: ``python -m controller.pull`` ends with ``os._exit``). A state dir
swapped under the pull (the meter's ``Swapped``) stops it the same way, its files left.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller.core.manifest.sources import HuggingFace
from controller.pull.job import Bounds, PullError, disk_filled, no_space, stalled, too_big
from controller.pull.meter import EVERY, ProgressMeter
from controller.pull.statewatch import Swapped
from controller.store.models.modelcache import CacheEntry


def fetch_hub(
    hub: HuggingFace, entry: CacheEntry, *, bounds: Bounds, meter: ProgressMeter
) -> dict[str, Any]:
    # Its read timeout is our stall limit; no tqdm bars in a log file.
    stall = bounds.stall
    os.environ["HF_HUB_DOWNLOAD_TIMEOUT"] = f"{stall:g}"
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    local = entry.folder / "files"
    try:
        return _download(hub, local, entry, reserve=bounds.reserve, meter=meter)
    except PullError:
        raise
    except Exception as exc:  # the library's error tree, said for people
        raise _explain(hub, exc, stall) from None


def _download(
    hub: HuggingFace, local: Path, entry: CacheEntry, *, reserve: int, meter: ProgressMeter
) -> dict[str, Any]:
    from huggingface_hub import snapshot_download

    patterns = list(hub.files) or None
    # HF_ENDPOINT read now, not when the library was first imported (it caches it then).
    where: dict[str, Any] = {"endpoint": os.environ.get("HF_ENDPOINT") or None}
    listing: list[Any] = snapshot_download(
        hub.repo,
        revision=hub.revision,
        allow_patterns=patterns,
        local_dir=local,
        dry_run=True,
        **where,
    )
    if not listing:
        raise PullError(
            "http", f"{hub.repo}@{hub.revision}: no file matches {hub.files}: check source.files"
        )
    total = sum(f.file_size or 0 for f in listing)
    todo = sum(f.file_size or 0 for f in listing if f.will_download)
    local.mkdir(parents=True, exist_ok=True)
    _check_space(local, todo - _bytes_under(local / ".cache"), reserve)
    guard = Guard(f"{hub.repo}@{hub.revision}", local, total, reserve)
    with guard.watching(meter):
        snapshot_download(
            hub.repo, revision=hub.revision, allow_patterns=patterns, local_dir=local, **where
        )
    meter.set(total, total)
    meter.flush(force=True)
    return _result([str(f.filename) for f in listing], local, total)


def _result(files: list[str], local: Path, total: int) -> dict[str, Any]:
    """One file: ``{model}`` names it (and its sha256 is recorded); more: the folder."""
    if len(files) == 1:
        path = local / files[0]
        return {"path": f"files/{files[0]}", "sha256": _digest(path), "bytes": total}
    return {"path": "files", "sha256": None, "bytes": total}


SLACK = 1 << 20  # the library's own small files beside the listed ones
ABORT = signal.SIGUSR1  # the watcher's word to the main thread


@dataclass
class Guard:
    """Meters a hub download and stops it past its listed size or the disk's reserve."""

    what: str  # repo@revision, for the message
    local: Path
    total: int  # the listed size of every file
    reserve: int
    reason: PullError | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @contextmanager
    def watching(self, meter: ProgressMeter) -> Iterator[None]:
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(ABORT, self._raise) if main else None
        watcher = threading.Thread(target=self._watch, args=(meter, main), daemon=True)
        watcher.start()
        try:
            yield
        finally:
            self.done.set()
            watcher.join()
            if previous is not None:
                signal.signal(ABORT, previous)
        if self.reason is not None:  # the library finished before the signal landed
            raise self.reason

    def _watch(self, meter: ProgressMeter, main: bool) -> None:
        while not self.done.wait(EVERY):
            if self.reason is None:
                under = _bytes_under(self.local)
                try:
                    meter.set(min(under, self.total), self.total)
                except Swapped as swapped:  # its files are not to be touched by path now
                    self.reason = swapped
                else:
                    self.reason = self._check(under)
                    if self.reason is None:
                        continue
                    _drop_partials(self.local)
            # Each turn until the main thread is out: the library's thread pool waits for
            # its download threads on the way out, and only another signal breaks that.
            if main:
                signal.pthread_kill(threading.main_thread().ident or 0, ABORT)

    def _check(self, under: int) -> PullError | None:
        bound = self.total + SLACK
        if under > bound:
            return too_big(self.what, under, bound, "the size the hub listed")
        free = shutil.disk_usage(self.local).free
        if free < self.reserve:
            partial = str(self.local / ".cache")
            return disk_filled(self.what, partial, under, free, self.reserve)
        return None

    def _raise(self, signum: int, frame: object) -> None:
        if self.reason is not None and not self.done.is_set():
            raise self.reason


def _drop_partials(local: Path) -> None:
    for partial in local.rglob("*.incomplete"):
        partial.unlink(missing_ok=True)


def _bytes_under(folder: Path) -> int:
    if not folder.exists():
        return 0
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _check_space(folder: Path, remaining: int, reserve: int) -> None:
    free = shutil.disk_usage(folder).free
    if free - reserve < remaining:
        raise no_space(str(folder), remaining, free, reserve)


def _digest(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _explain(hub: HuggingFace, exc: Exception, stall: float) -> PullError:
    from huggingface_hub import errors

    # The dry run that sizes the pull wraps what the hub said (a 401 of a gated repo, a
    # 404, no connection) in a DryRunError: the cause is what the user must hear.
    while isinstance(exc, errors.DryRunError) and isinstance(exc.__cause__, Exception):
        exc = exc.__cause__
    where = f"{hub.repo}@{hub.revision}"
    status = _status(exc)  # a mirror may answer without the hub's X-Error-Code
    if isinstance(exc, errors.GatedRepoError):
        why = "is gated: accept its terms on the hub, then set HF_TOKEN"
    elif isinstance(exc, errors.RepositoryNotFoundError) or status == 404:
        why = "was not found (or is private: set HF_TOKEN); check source.huggingFace.repo"
    elif status in (401, 403):
        why = f"was refused (HTTP {status}): set HF_TOKEN to a token that may read it"
    elif isinstance(exc, errors.RevisionNotFoundError):
        why = "has no such revision: check source.huggingFace.revision"
    elif isinstance(exc, errors.EntryNotFoundError):
        why = "lacks a listed file: check source.huggingFace.files"
    elif "timed out" in str(exc).lower() or "timeout" in type(exc).__name__.lower():
        return stalled(where, stall)
    else:
        why = f"could not be pulled ({type(exc).__name__}: {_first_line(exc)}); retried"
    return PullError("http", f"{where} {why}")


def _status(exc: Exception) -> int | None:
    response = getattr(exc, "response", None)
    code = getattr(response, "status_code", None)
    return code if isinstance(code, int) else None


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "no detail"
