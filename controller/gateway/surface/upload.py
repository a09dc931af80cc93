"""Multipart uploads (``/v1/audio/transcriptions``, ``/v1/audio/translations``): the
model is a form field, the file may be large, so the body is never held whole.

The gateway reads just enough of the body to find the ``model`` field (``SCAN_MAX`` at
most: clients put their fields before the file, as the OpenAI libraries and ``curl -F
model=... -F file=@...`` do), then forwards what it read followed by the rest as it
arrives, with the client's ``Content-Length``, never past ``--max-body``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from controller.core.manifest.quantity import format_bytes
from controller.gateway.http.messages import Body

SCAN_MAX = 1024 * 1024  # bytes read at most to find the model field
_BOUNDARY = re.compile(r'boundary="?([^";]+)"?', re.IGNORECASE)
_NAME = re.compile(rb'\bname="([^"]*)"', re.IGNORECASE)


class TooLarge(Exception):
    """The upload went past ``--max-body`` while streaming: the engine's request is cut.
    The client's doing: its 413, and no verdict on the engine (forwarding.py)."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"the upload is larger than the gateway's limit of {limit} bytes "
            f"({format_bytes(limit)}, its --max-body): send a smaller file, or ask the "
            "gateway's operator to raise --max-body"
        )


def boundary(content_type: str) -> bytes | None:
    """The multipart boundary of a ``multipart/form-data`` Content-Type, else None."""
    if not content_type.lower().startswith("multipart/form-data"):
        return None
    found = _BOUNDARY.search(content_type)
    return found.group(1).strip().encode() if found else None


@dataclass(frozen=True)
class Scan:
    """What the body read so far says: the model (or None), and whether to read more."""

    model: str | None
    done: bool


def scan(head: bytes, mark: bytes) -> Scan:
    """Look for a complete ``model`` part among the complete parts of ``head``."""
    delimiter = b"\r\n--" + mark
    segments = (b"\r\n" + head).split(delimiter)
    # segments[0] is the preamble; the last segment may be incomplete (or the epilogue).
    for part in segments[1:-1]:
        if part.startswith(b"--"):
            return Scan(None, True)  # the closing delimiter: the form had no model
        headers, sep, value = part.partition(b"\r\n\r\n")
        if not sep:
            continue
        if _field_name(headers) == b"model":
            text = value.decode("utf-8", errors="replace").strip()
            # Whole (SCAN_MAX bounds it): a key sent as the model, cut, was no longer
            # recognised as one, and its head was logged (routes.py's _logged cuts after).
            return Scan(text or None, True)
    closed = len(segments) > 1 and segments[-1].startswith(b"--")
    return Scan(None, closed or len(head) > SCAN_MAX)


def _field_name(headers: bytes) -> bytes | None:
    for line in headers.split(b"\r\n"):
        name, _, rest = line.partition(b":")
        if name.strip().lower() == b"content-disposition":
            found = _NAME.search(rest)
            return found.group(1) if found else None
    return None


@dataclass
class Upload:
    """A request body being streamed on: the bytes read to find the model, then the rest."""

    head: bytes
    rest: Body
    length: int | None  # the client's Content-Length (sent on, so the engine sees a size)
    limit: int
    started: bool = False  # once the engine has had a byte, the body cannot be sent again

    def resendable(self) -> bool:
        return not self.started

    async def chunks(self) -> AsyncIterator[bytes]:
        self.started = True
        sent = len(self.head)
        if self.head:
            yield self.head
        async for chunk in self.rest.iter_any():
            sent += len(chunk)
            if sent > self.limit:
                raise TooLarge(self.limit)
            yield chunk


class Chunks(Protocol):
    """A body read as it comes (a ``Body``, or bodies.Paced's deadlines over one)."""

    async def readany(self) -> bytes: ...


async def read_head(content: Chunks, mark: bytes) -> tuple[bytes, Scan]:
    """Read until the model field is complete (or the body ends, or ``SCAN_MAX``)."""
    head = bytearray()
    while True:
        chunk = await content.readany()
        if not chunk:
            return bytes(head), scan(bytes(head), mark)
        head += chunk
        found = scan(bytes(head), mark)
        if found.done:
            return bytes(head), found
