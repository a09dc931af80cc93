"""The GET of a URL pull, and what its answer must be before a byte of it is kept.

urllib from the standard library, not httpx: one streamed GET with a Range header is
all a pull needs. Its socket timeout is the stall limit. Two things urllib allows and a
pull must not: a redirect to another scheme (urllib follows ``ftp://``) is refused, and
a ranged answer must start at the byte asked for (a ``206`` from elsewhere appended to
the partial file would corrupt it; one from byte 0 is the whole file: start over).
Messages name the source's URL as ``where`` (secrets redacted), never a redirect's
target in full (a pre-signed URL carries its signature). A URL's ``user:password@`` is
sent as Basic auth, as curl (the exported initContainer) and wget do: urllib would read it
as part of the host; the header goes on to a redirect only to the same scheme, host and
port (or http's default port to https's), as curl and requests do: a mirror's
``/latest`` pointing at its own file keeps it, a CDN elsewhere never sees it.
"""

from __future__ import annotations

import base64
import re
import urllib.error
import urllib.request
from http.client import HTTPException, HTTPMessage, HTTPResponse
from typing import IO
from urllib.parse import unquote, urlsplit, urlunsplit

from controller.pull.job import PullError, stalled
from controller.redact import redact_url

CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")
SCHEMES = ("http", "https")
HINTS = {
    401: "the server wants credentials: give them in source.url, as user:password@ before its host",
    403: "the server refuses it: check the URL and its access rights",
    404: "nothing there: check source.url",
}


class _Elsewhere(Exception):
    """A redirect to a scheme a pull does not follow."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.target = target


class _HttpOnly(urllib.request.HTTPRedirectHandler):
    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        if urlsplit(newurl).scheme.lower() not in SCHEMES:
            fp.close()
            raise _Elsewhere(newurl)
        onward = super().redirect_request(req, fp, code, msg, headers, newurl)
        basic = req.get_header("Authorization")
        if onward is not None and basic is not None and _same_origin(req.full_url, newurl):
            onward.add_unredirected_header("Authorization", basic)
        return onward


def _same_origin(old: str, new: str) -> bool:
    """Whether credentials may follow a redirect from ``old`` to ``new`` (requests'
    ``should_strip_auth``): the same host, scheme and port, or http's to https's."""
    was, now = urlsplit(old), urlsplit(new)
    if was.hostname != now.hostname:
        return False
    if (was.scheme, was.port, now.scheme, now.port) in _UPGRADES:
        return True
    return (was.scheme, was.port) == (now.scheme, now.port)


_UPGRADES = {("http", p, "https", q) for p in (80, None) for q in (443, None)}


_OPENER = urllib.request.build_opener(_HttpOnly)  # the defaults, with this redirect rule


def request_for(url: str, method: str = "GET") -> urllib.request.Request:
    """The request for ``url``, its ``user:password@`` (if any) a Basic auth header."""
    parts = urlsplit(url)
    headers = {"User-Agent": "reconcile", "Accept-Encoding": "identity"}
    if "@" not in parts.netloc:
        return urllib.request.Request(url, headers=headers, method=method)
    userinfo, _, host = parts.netloc.rpartition("@")
    bare = urlunsplit(parts._replace(netloc=host))
    request = urllib.request.Request(bare, headers=headers, method=method)
    user, _, password = userinfo.partition(":")
    pair = f"{unquote(user)}:{unquote(password)}".encode()
    basic = f"Basic {base64.b64encode(pair).decode('ascii')}"
    request.add_unredirected_header("Authorization", basic)
    return request


def open_at(url: str, where: str, have: int, stall: float) -> HTTPResponse | None:
    """The response to read; None when the partial file is already whole (416)."""
    request = request_for(url)
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        response: HTTPResponse = _OPENER.open(request, timeout=stall)
    except _Elsewhere as exc:
        target = redact_url(exc.target)
        raise PullError(
            "http",
            f"{where}: the server redirects to {target}: a pull follows http and https "
            "only; check source.url",
        ) from None
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:
            return None  # nothing left past the partial's end: the digest decides
        hint = HINTS.get(exc.code, "retried with back-off")
        raise PullError("http", f"{where}: HTTP {exc.code} {exc.reason}: {hint}") from None
    except TimeoutError:
        raise stalled(where, stall) from None
    except HTTPException as exc:  # InvalidURL (`host:port` not a number) and its kin
        raise PullError("http", f"{where}: {redact_url(str(exc))}: check source.url") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError):
            raise stalled(where, stall) from None
        raise PullError("http", f"{where}: {reason}: retried with back-off") from None
    return response


def start_of(response: HTTPResponse, have: int, where: str) -> int:
    """Where the body goes in the file: ``have`` (a resume), or 0 (the whole file).

    A 206 must start at ``have``; one from byte 0 is the whole file after all. Anything
    else raises, and the caller drops the partial file: the next try starts from zero.
    """
    if response.status != 206:
        return 0  # a whole answer (the server ignored Range): start over
    ranged = CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
    start = int(ranged.group(1)) if ranged else None
    if start in (have, 0):
        return start
    said = f"bytes from {start}" if start is not None else "no usable Content-Range"
    raise PullError(
        "http",
        f"{where}: asked for the bytes from {have}, the server sent {said}: the partial "
        "file was dropped and the next try starts from zero",
    )


def total_of(response: HTTPResponse, offset: int) -> int | None:
    """The whole file's size, when the answer says it."""
    ranged = CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
    if ranged and ranged.group(3) != "*":
        return int(ranged.group(3))
    length = response.headers.get("Content-Length")
    return offset + int(length) if length and length.isdigit() else None
