"""The gateway's few fixed routes (the web page, the git webhook), found by method and
normalised path before its catch-all (``surface/routes.py``) takes the rest.

A pattern is a path whose segments may be ``{name}`` (one segment) or ``{name:regex}``;
a request's ``match_info`` gets the named parts, percent-decoded.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from urllib.parse import unquote

from controller.gateway.http.messages import Request, StreamResponse

Handler = Callable[[Request], Awaitable[StreamResponse]]
_PART = re.compile(r"\{(\w+)(?::([^{}]+))?\}")


class Router:
    def __init__(self) -> None:
        # method -> its routes; a path none of them can match is known by its beginning
        # (every request asks, and most are the catch-all's: 2% of a profile).
        self._routes: dict[str, list[tuple[re.Pattern[str], Handler]]] = {}
        self._starts: dict[str, tuple[str, ...]] = {}

    def add_get(self, pattern: str, handler: Handler) -> None:
        self.add("GET", pattern, handler)
        self.add("HEAD", pattern, handler)

    def add_post(self, pattern: str, handler: Handler) -> None:
        self.add("POST", pattern, handler)

    def add(self, method: str, pattern: str, handler: Handler) -> None:
        self._routes.setdefault(method, []).append((_compile(pattern), handler))
        literal = pattern.split("{", 1)[0]
        self._starts[method] = (*self._starts.get(method, ()), literal)

    def resolve(self, request: Request, path: str) -> Handler | None:
        """The handler of the route ``request`` and its normalised ``path`` match (its
        named parts put in ``request.match_info``), or None."""
        method = request.method
        if not path.startswith(self._starts.get(method, ())):
            return None
        for regex, handler in self._routes[method]:
            found = regex.fullmatch(path)
            if found is not None:
                request.match_info = {k: unquote(v) for k, v in found.groupdict().items()}
                return handler
        return None


def _compile(pattern: str) -> re.Pattern[str]:
    out, last = [], 0
    for part in _PART.finditer(pattern):
        out.append(re.escape(pattern[last : part.start()]))
        out.append(f"(?P<{part.group(1)}>{part.group(2) or '[^/]+'})")
        last = part.end()
    out.append(re.escape(pattern[last:]))
    return re.compile("".join(out))
