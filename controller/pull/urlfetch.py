"""One file over HTTP(S), resumed with ``Range``, checked by sha256 before it is used.

The request and what its answer must say are ``httpget``'s; here the body is written,
bounded (its announced size, else the most a pull may take), kept above the disk
reserve, and paced: a read that waits the stall limit for a byte fails, and so does a
trickle under MIN_RATE over a whole stall window.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from http.client import HTTPResponse
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

from controller.core.pulls import file_name
from controller.pull.hashing import Hasher
from controller.pull.httpget import open_at, start_of, total_of
from controller.pull.job import Bounds, PullError, disk_filled, no_space, stalled, too_big
from controller.pull.meter import ProgressMeter
from controller.pull.statewatch import StateWatch, Swapped
from controller.pull.writeback import Writeback
from controller.redact import redact_url
from controller.store import diskspace
from controller.store.models.modelcache import CacheEntry

CHUNK = 1 << 20
SPACE_EVERY = 4 << 20  # bytes written between looks at the free space
MIN_RATE = 1000  # bytes/s over the stall window: a trickle below it is a stall


def fetch_url(
    url: str,
    sha256: str,
    entry: CacheEntry,
    *,
    bounds: Bounds,
    meter: ProgressMeter,
    watch: StateWatch | None = None,
) -> dict[str, Any]:
    """Download into ``<file>.partial`` (resuming what is there), check, rename (only
    while ``watch`` finds the state dir the pull's own: no file takes its name in another)."""
    partial = entry.folder / f"{file_name(url)}.partial"
    try:
        return _fetch(url, sha256, entry, bounds, meter, watch or StateWatch.none())
    except Swapped:
        raise  # nothing more written: not even the figure a retry starts from
    except PullError:
        # What a retry resumes from: nothing when the partial was dropped (a wrong
        # sha256, a range from another byte, a full disk), not the bytes last counted.
        meter.restart_from(partial.stat().st_size if partial.exists() else 0)
        raise


def _fetch(
    url: str,
    sha256: str,
    entry: CacheEntry,
    bounds: Bounds,
    meter: ProgressMeter,
    watch: StateWatch,
) -> dict[str, Any]:
    name = file_name(url)
    where = redact_url(url)  # what messages say: never a token
    final = entry.folder / name
    partial = entry.folder / f"{name}.partial"
    kept = _kept(final, partial, sha256)
    if kept is not None:
        watch.check()
        return {"path": name, "sha256": sha256, "bytes": kept}
    have = partial.stat().st_size if partial.exists() else 0
    response = open_at(url, where, have, bounds.stall)
    if response is not None:
        have = _start(response, have, where, partial)
    hasher = Hasher()
    try:
        if have:
            hasher.feed_file(partial)
        if response is not None:
            with response:
                sink = Sink(where, partial, entry, bounds)
                have = _receive(response, sink, have, meter=meter, h=hasher)
    finally:
        hasher.close()
    digest = hasher.hexdigest()
    watch.check()  # before the partial is dropped or takes its name: by path, both
    if digest != sha256:
        partial.unlink(missing_ok=True)
        raise PullError(
            "checksum",
            f"{where}: the file's sha256 is {digest}, source.sha256 says {sha256}: the "
            "download was discarded; check source.sha256 or the URL",
        )
    _commit(partial, final)
    return {"path": name, "sha256": digest, "bytes": have}


def _kept(final: Path, partial: Path, sha256: str) -> int | None:
    """The size of ``final`` when a pull finished it before and it still has ``sha256``:
    its ``result.json`` lost (torn, hand-edited) made the next start download it all
    again (tens of GB) with the file right there; its content is the key, so a hash of
    it is proof, not a guess."""
    if partial.exists() or not final.is_file():
        return None
    hasher = Hasher()
    try:
        hasher.feed_file(final)
    finally:
        hasher.close()
    return final.stat().st_size if hasher.hexdigest() == sha256 else None


def _start(response: HTTPResponse, have: int, where: str, partial: Path) -> int:
    try:
        return start_of(response, have, where)
    except PullError:
        response.close()
        partial.unlink(missing_ok=True)
        raise


@dataclass(slots=True)
class Sink:
    """Where the bytes go and how many may: a bound, a reserve, and what to say."""

    url: str  # as messages show it
    partial: Path
    entry: CacheEntry
    bounds: Bounds
    offset: int = 0  # the partial file's size as written so far

    def check_space(self, remaining: int) -> None:
        """Before the body: the rest of a sized download must fit above the reserve."""
        free = shutil.disk_usage(self.entry.folder).free
        if free - self.bounds.reserve < remaining:
            raise no_space(str(self.entry.folder), remaining, free, self.bounds.reserve)

    def check(self, offset: int, bound: int, why: str, *, disk: bool) -> None:
        """During the body: past the bound, or below the reserve, the partial goes."""
        if offset > bound:
            self.partial.unlink(missing_ok=True)
            raise too_big(self.url, offset, bound, why)
        free = shutil.disk_usage(self.entry.folder).free if disk else self.bounds.reserve
        if free < self.bounds.reserve:
            self.filled(offset, free)

    def filled(self, offset: int, free: int | None = None) -> NoReturn:
        free = shutil.disk_usage(self.entry.folder).free if free is None else free
        self.partial.unlink(missing_ok=True)
        raise disk_filled(self.url, str(self.partial), offset, free, self.bounds.reserve)


def _receive(
    response: HTTPResponse, sink: Sink, have: int, *, meter: ProgressMeter, h: Hasher
) -> int:
    offset = sink.offset = have
    total = total_of(response, offset)
    if total is not None:
        sink.check_space(total - offset)
    bound, why = _bound(total, sink.bounds)
    meter.start_at(offset, total)
    try:
        with sink.partial.open("ab" if offset else "wb") as out:
            offset = _copy(response, out, offset, sink, bound, why, meter=meter, h=h)
    except OSError as exc:
        if diskspace.full(exc):  # the reserve was not enough (another writer): drop it
            sink.filled(sink.offset)
        raise
    meter.flush(force=True)
    if total is not None and offset != total:
        raise PullError(  # nothing has resumed yet: the partial waits for the next try
            "http",
            f"{sink.url}: the connection ended at {offset} of {total} bytes: the next try "
            f"resumes from byte {offset}, after back-off",
        )
    return offset


def _copy(
    response: HTTPResponse,
    out: BinaryIO,
    offset: int,
    sink: Sink,
    bound: int,
    why: str,
    *,
    meter: ProgressMeter,
    h: Hasher,
) -> int:
    synced = Writeback(out.fileno())
    look_at = offset  # the free space is looked at every SPACE_EVERY bytes
    pace = Pace(sink.url, sink.bounds.stall)
    try:
        while chunk := _read(response, sink.bounds.stall, sink.url):
            pace.got(len(chunk))
            out.write(chunk)
            h.feed(chunk)
            synced.wrote(len(chunk))
            offset += len(chunk)
            sink.offset = offset
            meter.advance(len(chunk))
            disk = offset >= look_at
            look_at = offset + SPACE_EVERY if disk else look_at
            sink.check(offset, bound, why, disk=disk)
        out.flush()
    finally:
        synced.close()
    os.fsync(out.fileno())
    return offset


class Pace:
    """A byte now and then keeps the socket's timeout away: under MIN_RATE over a whole
    stall window is a stall too (a server sending 1 byte per 5 s never ends)."""

    def __init__(self, where: str, window: float) -> None:
        self.where = where
        self.window = window
        self.since = time.monotonic()
        self.bytes = 0

    def got(self, n: int) -> None:
        self.bytes += n
        now = time.monotonic()
        if now - self.since < self.window:
            return
        if self.bytes < MIN_RATE * (now - self.since):
            raise PullError(
                "stall",
                f"{self.where}: {self.bytes} bytes in {now - self.since:.1f}s, under "
                f"{MIN_RATE} bytes/s for the stall limit ({self.window:g}s): the pull is "
                "retried with back-off",
            )
        self.since, self.bytes = now, 0


def _bound(total: int | None, bounds: Bounds) -> tuple[int, str]:
    """The most bytes the file may have, and where that figure comes from."""
    if total is not None:
        return total, "the size the server announced"
    return bounds.max_bytes, "RECONCILE_PULL_MAX_BYTES, for a download of unannounced size"


def _read(response: HTTPResponse, stall: float, url: str) -> bytes:
    try:
        return response.read1(CHUNK)  # what has arrived: progress and stalls see each byte
    except TimeoutError:
        raise stalled(url, stall) from None
    except OSError as exc:  # reset, cut: what arrived stays in .partial for the next try
        raise PullError(
            "http",
            f"{url}: {exc}: what arrived is kept, and the next try resumes from it after back-off",
        ) from None


def _commit(partial: Path, final: Path) -> None:
    """The checked file takes its name in one rename (and the rename is made durable)."""
    os.replace(partial, final)
    fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
