"""Request paths made safe to route and to forward.

A path is routed and forwarded in one normal form, so what the gateway checks is
what the engine gets: percent-encoded dots decoded, dot segments removed (RFC 3986
§5.2.4), repeated slashes collapsed. An encoded slash or backslash, a backslash, NUL
or a path that is not absolute has no one meaning across servers (an engine may
decode ``%2f`` and route on it): refused, never guessed at.

A request target in absolute-form (``POST http://host/v1/chat/completions``, what a
client configured with the gateway as its HTTP proxy sends, ``curl -x``) is taken as its
path and query (``origin_form``): RFC 9112 §3.2.2 says a server MUST accept it, and nginx
does. It was refused as "not a plain absolute path (encoded slash, backslash, NUL)",
which it is not.
"""

from __future__ import annotations

import functools
import re
from urllib.parse import unquote_plus

_DOT = re.compile("%2e", re.IGNORECASE)
_AMBIGUOUS = re.compile(r"%2f|%5c|%00|\\|\x00", re.IGNORECASE)
_SLASHES = re.compile("/{2,}")
# `http://` or `https://` and an authority (userinfo, host, port): absolute-form's head
_ABSOLUTE = re.compile(r"https?://[^/?#]*", re.IGNORECASE)


def origin_form(target: str) -> str:
    """The origin-form of a request target: ``http://h:1/a?x`` -> ``/a?x``, ``http://h`` ->
    ``/``; any other target as it is (the authority, its userinfo included, goes: the
    gateway routes by the body's model, never by host)."""
    if target.startswith("/"):
        return target
    head = _ABSOLUTE.match(target)
    if head is None:
        return target
    rest = target[head.end() :]
    return rest if rest.startswith("/") else "/" + rest


def split(raw: str) -> tuple[str, str]:
    """``/a/b?x=1`` -> (``/a/b``, ``x=1``); a fragment never reaches a server's request."""
    path, _, query = raw.partition("?")
    return path.partition("#")[0], query


@functools.lru_cache(maxsize=512)  # a client sends the same few paths (3% of a profile)
def normalise(path: str) -> str | None:
    """The normal form of an origin-form path (no query), or None when it has none."""
    if not path.startswith("/") or _AMBIGUOUS.search(path):
        return None
    out: list[str] = []
    segments = _SLASHES.sub("/", _DOT.sub(".", path)).split("/")[1:]
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if segment == "..":
            if out:
                out.pop()
        elif segment != ".":
            out.append(segment)
            continue
        if last:
            out.append("")  # `/v1/a/..` names the folder `/v1/`, as a browser reads it
    return "/" + "/".join(out)


def without(query: str, name: str) -> str:
    """``query`` without its ``name`` parameters (by their decoded name), the rest as
    sent and in their order: ``token=T&x=1`` -> ``x=1``."""
    if name not in query and "%" not in query:  # most queries: none, or no such name
        return query
    return "&".join(p for p in query.split("&") if unquote_plus(p.partition("=")[0]) != name)


def within(path: str, prefix: str) -> bool:
    """True if the normalised ``path`` lies under ``prefix`` (which ends with ``/``)."""
    return path != prefix and path.startswith(prefix)
