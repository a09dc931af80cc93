"""A request's body as the gateway reads it: the bytes it may hold (``held``, reserved
before a byte is read where its size is known; the rest reserved as it arrives), then the
whole body, decoded, with its JSON fields and model (``read``), or a multipart upload read
up to its ``model`` field and streamed on (upload.py); else the OpenAI error to answer
(400, 408, 413, 415, or 503 where the room for bodies ran out).

While the gateway holds room for a body, the body must keep coming: a read that waits
``BODY_STALL`` s for its next byte is a 408 and its room is given back (nginx's
``client_body_timeout``, between two reads), and so is a body that falls behind a minimum
rate (Apache mod_reqtimeout's ``MinRate``: ``BODY_GRACE`` s, then 1 s more per
``BODY_MIN_RATE`` bytes received); the whole body, ``BODY_TIMEOUT`` s at most.

The gateway reads the model from the body, so it must see it plain; the engine then
gets the plain body (and no ``Content-Encoding``). gzip and deflate are decoded with
the standard library, never past the ``--max-body`` limit (a small bomb stays small);
any other coding is refused with 415, a body that is not what its header says with 400
(``decode``).
"""

from __future__ import annotations

import asyncio
import json
import zlib
from dataclasses import dataclass
from typing import Any

from controller.core.manifest.quantity import format_bytes
from controller.gateway.http.answers import error
from controller.gateway.http.messages import Body, Request, Response
from controller.gateway.routing.concurrency import Held
from controller.gateway.surface import upload
from controller.gateway.surface.forwarding import RETRY_AFTER
from controller.gateway.surface.upload import Upload

BODY_TIMEOUT = 120.0  # seconds a client may take to send its body (a slow one holds a slot)
# Seconds a body may send nothing while it holds room: 4 heads that sent a byte each, then
# nothing, held the gateway's room for bodies (--max-body-total) for BODY_TIMEOUT.
BODY_STALL = 10.0
# A body's deadline starts BODY_GRACE s after the gateway begins to read it and grows by
# 1 s per BODY_MIN_RATE bytes received (up to BODY_TIMEOUT): a sized body sent a byte every
# few seconds held its Content-Length for BODY_TIMEOUT, BODY_STALL notwithstanding, so a
# few such clients held all of --max-body-total. 1 KB/s (8 kbit/s) is below any link still
# in use (a 56k modem sends 7 KB/s, GPRS 4 or more), so no real upload falls behind it;
# 10 s covers a lossy link's first round trips (a lost segment is resent after 1 s, 2 s,
# 4 s) before the first bytes come. Apache's default is 20 s, then 500 bytes a second.
BODY_GRACE = 10.0
BODY_MIN_RATE = 1024
# zlib's wbits: gzip header, zlib header, then bare deflate (what some clients send).
_GZIP = 16 + zlib.MAX_WBITS
_ZLIB = zlib.MAX_WBITS
_RAW = -zlib.MAX_WBITS
CODINGS = {"gzip": (_GZIP,), "x-gzip": (_GZIP,), "deflate": (_ZLIB, _RAW)}
_JSON = json.JSONDecoder()


def multipart(request: Request) -> bytes | None:
    """The boundary of a request whose body is a multipart upload, else None."""
    return upload.boundary(request.headers.get("Content-Type", ""))


def held(request: Request, limit: int, mark: bytes | None) -> int:
    """The bytes reserved for a request's body before a byte of it is read: its length; a
    multipart upload's (``mark``: its boundary) scanned head; none for a chunked body,
    whose size shows only as it comes (``read`` reserves what it takes, and what an
    encoded body decodes to). Reserved at --max-body up front, a chunked head and a byte
    held 32 MiB of the room."""
    if not request.body_exists:
        return 0
    if mark is not None:
        return upload.SCAN_MAX
    length = request.content_length
    return 0 if length is None else min(length, limit)


Read = tuple[bytes | Upload, dict[str, Any], str | None]  # the body, its JSON fields, model


async def read(
    request: Request, limit: int, mark: bytes | None, hold: Held | None = None
) -> Read | Response:
    """The body (bytes, or a multipart upload to stream, ``mark`` its boundary), its JSON
    fields and its model. ``hold``: the room reserved for it (``held``), grown to what
    the body takes (None: no bound but ``limit``)."""
    if mark is not None:
        return await _upload(request, mark, limit)
    if request.content_length is not None and request.content_length > limit:
        return _too_large(limit)
    if request.content.is_eof():  # received whole (most): at once, no deadline to keep
        raw = request.content.received()
    else:
        arrived = await _arriving(Paced(request.content), limit, hold)
        if isinstance(arrived, Response):
            return arrived
        raw = arrived
    if len(raw) > limit:
        return _too_large(limit)
    if hold is not None and not await hold.arrived(len(raw)):
        return _outgrew(hold)
    return _parsed(raw, request, limit, hold)


async def _arriving(body: Paced, limit: int, hold: Held | None) -> bytes | Response:
    """The rest of a body still on its way, its room grown as it comes."""
    parts: list[bytes] = []
    size = 0
    try:
        while chunk := await body.readany():
            size += len(chunk)
            if size > limit:
                return _too_large(limit)
            if hold is not None and not await hold.arrived(size):
                return _closing(_outgrew(hold))
            parts.append(chunk)
    except TimeoutError:
        return _closing(error(408, body.late(), "request_timeout"))
    return parts[0] if len(parts) == 1 else b"".join(parts)


class Paced:
    """A body's reads while room is held for it: each within ``BODY_STALL`` s of the last,
    all by a deadline ``BODY_GRACE`` s after the first, 1 s later per ``BODY_MIN_RATE``
    bytes received, ``BODY_TIMEOUT`` s at most; TimeoutError past any."""

    def __init__(self, content: Body) -> None:
        self._content = content
        self._loop = asyncio.get_running_loop()
        self._start = self._loop.time()
        self._received = 0
        self._late = self._behind  # the 408's words for the deadline the last read kept

    async def readany(self) -> bytes:
        earned = BODY_GRACE + self._received / BODY_MIN_RATE
        left = self._start + min(earned, BODY_TIMEOUT) - self._loop.time()
        if left > BODY_STALL:
            self._late = self._stalled
        else:
            self._late = self._behind if earned < BODY_TIMEOUT else self._overdue
        async with asyncio.timeout(min(left, BODY_STALL)):
            chunk = await self._content.readany()
        self._received += len(chunk)
        return chunk

    def late(self) -> str:
        """The 408's words for the deadline that ran out."""
        return self._late()

    def _stalled(self) -> str:
        return (
            f"the request body stopped coming: nothing of it arrived for {BODY_STALL:g} "
            "seconds; send the body with its head, without pauses"
        )

    def _behind(self) -> str:
        took = self._loop.time() - self._start
        return (
            f"the request body came too slowly: {self._received} bytes in {took:.0f} "
            f"seconds, while the gateway holds room for a body it must come at "
            f"{BODY_MIN_RATE} bytes a second or more (after its first {BODY_GRACE:g} "
            "seconds); send the body with its head, at the link's speed"
        )

    def _overdue(self) -> str:
        return f"the request body did not arrive within {BODY_TIMEOUT:g} seconds"


def _outgrew(hold: Held) -> Response:
    """A body whose size showed only as it came, with no room left for the rest."""
    share = f", {hold.share} of them one API key's" if hold.share < hold.total else ""
    why = (
        f"the gateway holds {hold.total} bytes of request bodies at once (--max-body-total"
        f"{share}) and this body, sent without a Content-Length (chunked, or encoded), grew "
        "past the room left; retry later, or send it with a Content-Length to wait for room"
    )
    return error(503, why, "server_busy", retry_after=RETRY_AFTER)


def _parsed(raw: bytes, request: Request, limit: int, hold: Held | None) -> Read | Response:
    """A body read whole: its Content-Encoding undone (``decode``), its JSON fields (parsed
    once: the model, and the session's `user`) and model; or the error to answer."""
    plain = decode(raw, request.headers.get("Content-Encoding"), limit)
    if isinstance(plain, BodyRefused):
        return error(plain.status, plain.message, plain.code)
    if hold is not None and not hold.cover(len(plain)):  # what it decoded to is kept
        return _outgrew(hold)
    fields = _fields(plain)
    return plain, fields, _model(fields)


async def _upload(
    request: Request, mark: bytes, limit: int
) -> tuple[Upload, dict[str, Any], str] | Response:
    """A multipart form: read up to its ``model`` field, the rest is streamed on."""
    if request.content_length is not None and request.content_length > limit:
        return _too_large(limit)
    coding = request.headers.get("Content-Encoding", "").strip().lower()
    if coding not in ("", "identity"):
        why = "a multipart upload is streamed as sent: send it without Content-Encoding"
        return error(415, why, "unsupported_content_encoding")
    paced = Paced(request.content)
    try:
        head, found = await upload.read_head(paced, mark)
    except TimeoutError:
        return _closing(error(408, paced.late(), "request_timeout"))
    if found.model is None:
        why = (
            "the multipart form must have a field `model` before the file "
            f"(within its first {upload.SCAN_MAX} bytes)"
        )
        return _closing(error(400, why, "invalid_request"))
    body = Upload(head, request.content, request.content_length, limit)
    return body, {}, found.model


def _closing(answer: Response) -> Response:
    answer.force_close()  # what is left of the body is not read
    return answer


def _too_large(limit: int) -> Response:
    return error(413, f"the request body is {over_limit(limit)}", "request_too_large")


def over_limit(limit: int) -> str:
    """Past --max-body: the limit, readable, and the next move (the client's, or its
    operator's: a bare byte count told neither what to do)."""
    return (
        f"larger than the gateway's limit of {limit} bytes ({format_bytes(limit)}, its "
        "--max-body): send a smaller one (fewer or shorter messages, a smaller file), or "
        "ask the gateway's operator to raise --max-body"
    )


def _fields(body: bytes) -> dict[str, Any]:
    """The body's JSON object ({} for anything else: no model, so a 400)."""
    try:
        if body[:1] == b"{" and body[1:2] != b"\0":
            # UTF-8, as json.loads would find (no BOM, no NUL after the first byte), read
            # without its search for the encoding (nine calls of the request's ~400).
            value: Any = _JSON.decode(body.decode("utf-8", "surrogatepass"))
        else:
            value = json.loads(body)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def no_model(body: bytes) -> str:
    """Why a JSON body names no model, for its 400: what is wrong, where, and what to send.
    Parsed again here, off the path of any request the gateway forwards."""
    fix = "send a JSON object whose `model` names one of `GET /v1/models`"
    if not body.strip():
        return f"the request body is empty: {fix}"
    try:
        value = json.loads(body)
    except json.JSONDecodeError as exc:  # its line and column, as the client sent it
        return (
            f"the request body is not JSON (line {exc.lineno} column {exc.colno}: {exc.msg}): {fix}"
        )
    except (ValueError, RecursionError):  # not UTF-8 (or -16, -32), or nested past Python's limit
        return f"the request body is not JSON that can be read: {fix}"
    if not isinstance(value, dict):
        return f"the request body is a JSON {_kind(value)}, not an object: {fix}"
    if "model" not in value:
        return f"the request body has no field `model`: {fix}"
    model = value["model"]
    shown = "an empty string" if model == "" else f"a JSON {_kind(model)}"
    return f"the request body's `model` is {shown}, not a model's name: {fix}"


def _kind(value: Any) -> str:
    kinds = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return kinds.get(type(value), "number")


def _model(fields: dict[str, Any]) -> str | None:
    model = fields.get("model")
    return model if isinstance(model, str) and model else None


@dataclass(frozen=True)
class BodyRefused:
    """A request body the gateway will not decode, and the error it answers with."""

    status: int  # 400, 413 or 415
    message: str
    code: str


def decode(body: bytes, header: str | None, limit: int) -> bytes | BodyRefused:
    """``body`` undone of every coding ``header`` lists (last applied, first undone)."""
    codings = [c.strip().lower() for c in (header or "").split(",") if c.strip()]
    for coding in reversed(codings):
        if coding == "identity":
            continue
        wbits = CODINGS.get(coding)
        if wbits is None:
            why = f"Content-Encoding {coding!r} is not supported (use gzip, deflate or none)"
            return BodyRefused(415, why, "unsupported_content_encoding")
        plain = _inflate(body, wbits, limit)
        if isinstance(plain, BodyRefused):
            return plain
        body = plain
    return body


def _inflate(body: bytes, tries: tuple[int, ...], limit: int) -> bytes | BodyRefused:
    for wbits in tries:
        inflater = zlib.decompressobj(wbits)
        try:
            plain = inflater.decompress(body, limit + 1)
        except zlib.error:
            continue
        if len(plain) > limit or inflater.unconsumed_tail:
            why = f"the decoded request body is {over_limit(limit)}"
            return BodyRefused(413, why, "request_too_large")
        if inflater.eof and not inflater.unused_data:
            return plain
    why = "the request body is not encoded as its Content-Encoding says"
    return BodyRefused(400, why, "invalid_content_encoding")
