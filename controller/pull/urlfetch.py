"""One file over HTTP(S), resumed with ``Range``, checked by sha256 before it is used.

urllib from the standard library, not httpx: one streamed GET with a Range header is
all a pull needs, and the pull process then imports nothing beyond the stdlib for it.
The socket timeout is the stall limit: a read that waits that long for a byte fails.
"""

from __future__ import annotations

import os
import re
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass
from http.client import HTTPResponse
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

from controller.core.pulls import file_name
from controller.pull.failures import PullError, disk_filled, no_space, stalled, too_big
from controller.pull.hashing import Hasher
from controller.pull.job import Bounds
from controller.pull.meter import Meter
from controller.pull.writeback import Writeback
from controller.store import diskspace
from controller.store.modelcache import CacheEntry

CHUNK = 1 << 20
SPACE_EVERY = 4 << 20  # bytes written between looks at the free space
CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")
HINTS = {
    401: "the server wants credentials: use a URL that needs none",
    403: "the server refuses it: check the URL and its access rights",
    404: "nothing there: check source.url",
}


def fetch_url(
    url: str, sha256: str, entry: CacheEntry, *, bounds: Bounds, meter: Meter
) -> dict[str, Any]:
    """Download into ``<file>.partial`` (resuming what is there), check, rename."""
    name = file_name(url)
    final = entry.folder / name
    partial = entry.folder / f"{name}.partial"
    have = partial.stat().st_size if partial.exists() else 0
    response = _open(url, have, bounds.stall)
    if response is not None and response.status != 206:
        have = 0  # a whole answer (the server ignored Range): start over
    hasher = Hasher()
    try:
        if have:
            hasher.feed_file(partial)
        if response is not None:
            with response:
                sink = Sink(url, partial, entry, bounds)
                have = _receive(response, sink, have, meter=meter, h=hasher)
    finally:
        hasher.close()
    digest = hasher.hexdigest()
    if digest != sha256:
        partial.unlink(missing_ok=True)
        raise PullError(
            "checksum",
            f"{url}: the file's sha256 is {digest}, source.sha256 says {sha256}: the "
            "download was discarded; check source.sha256 or the URL",
        )
    _commit(partial, final)
    return {"path": name, "sha256": digest, "bytes": have}


def _open(url: str, have: int, stall: float) -> HTTPResponse | None:
    """The response to read; None when the partial file is already whole (416)."""
    headers = {"User-Agent": "reconcile", "Accept-Encoding": "identity"}
    if have:
        headers["Range"] = f"bytes={have}-"
    request = urllib.request.Request(url, headers=headers)
    try:
        response: HTTPResponse = urllib.request.urlopen(request, timeout=stall)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:
            return None  # nothing left past the partial's end: the digest decides
        hint = HINTS.get(exc.code, "retried with back-off")
        raise PullError("http", f"{url}: HTTP {exc.code} {exc.reason}: {hint}") from None
    except TimeoutError:
        raise stalled(url, stall) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError):
            raise stalled(url, stall) from None
        raise PullError("http", f"{url}: {reason}: retried with back-off") from None
    return response


@dataclass(slots=True)
class Sink:
    """Where the bytes go and how many may: a bound, a reserve, and what to say."""

    url: str
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


def _receive(response: HTTPResponse, sink: Sink, have: int, *, meter: Meter, h: Hasher) -> int:
    offset = sink.offset = have
    total = _total(response, offset)
    if total is not None:
        sink.check_space(total - offset)
    bound, why = _bound(total, sink.bounds)
    meter.set(offset, total)
    try:
        with sink.partial.open("ab" if offset else "wb") as out:
            offset = _copy(response, out, offset, sink, bound, why, meter=meter, h=h)
    except OSError as exc:
        if diskspace.full(exc):  # the reserve was not enough (another writer): drop it
            sink.filled(sink.offset)
        raise
    meter.flush(force=True)
    if total is not None and offset != total:
        raise PullError(
            "http", f"{sink.url}: the connection ended at {offset} of {total} bytes: resumed"
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
    meter: Meter,
    h: Hasher,
) -> int:
    synced = Writeback(out.fileno())
    look_at = offset  # the free space is looked at every SPACE_EVERY bytes
    try:
        while chunk := _read(response, sink.bounds.stall, sink.url):
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
        raise PullError("http", f"{url}: {exc}: resumed with back-off") from None


def _total(response: HTTPResponse, offset: int) -> int | None:
    ranged = CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
    if ranged and ranged.group(3) != "*":
        return int(ranged.group(3))
    length = response.headers.get("Content-Length")
    return offset + int(length) if length and length.isdigit() else None


def _commit(partial: Path, final: Path) -> None:
    """The checked file takes its name in one rename (and the rename is made durable)."""
    os.replace(partial, final)
    fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
