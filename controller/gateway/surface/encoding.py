"""Request bodies with a ``Content-Encoding``: decoded here, bounded, or refused.

The gateway reads the model from the body, so it must see it plain; the engine then
gets the plain body (and no ``Content-Encoding``). gzip and deflate are decoded with
the standard library, never past the ``--max-body`` limit (a small bomb stays small);
any other coding is refused with 415, a body that is not what its header says with 400.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

# zlib's wbits: gzip header, zlib header, then bare deflate (what some clients send).
_GZIP = 16 + zlib.MAX_WBITS
_ZLIB = zlib.MAX_WBITS
_RAW = -zlib.MAX_WBITS
CODINGS = {"gzip": (_GZIP,), "x-gzip": (_GZIP,), "deflate": (_ZLIB, _RAW)}


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
            why = f"the decoded request body is larger than the gateway's limit of {limit} bytes"
            return BodyRefused(413, why, "request_too_large")
        if inflater.eof and not inflater.unused_data:
            return plain
    why = "the request body is not encoded as its Content-Encoding says"
    return BodyRefused(400, why, "invalid_content_encoding")
