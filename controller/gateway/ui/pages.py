"""``/ui``: the page's files, its JSON (``/ui/api/state``, ``/ui/api/logs/NAME``) and its
actions (``POST /ui/api/ACTION``), on the gateway's own bind.

Who may use them: with API keys, the JSON and the actions want a key as the OpenAI
paths do (``Authorization: Bearer``; the page keeps it in the tab's session storage).
Without keys they want the state dir's access token (``store/config/accesstoken.py``: a 0600
file only its owner reads, so another local user of the machine reads and does
nothing), as ``?token=`` on any page or API path or as ``Authorization: Bearer``;
``reconcile ui`` prints the URL with it and the page keeps it as it keeps a key. The
files themselves hold no data and are served to anyone (the sign-in is in them). A
keyless loopback gateway answers only a loopback ``Host`` on every path (``routes.py``:
DNS rebinding reads nothing); an action must be a JSON POST from the page's own origin
(``Sec-Fetch-Site: same-origin``, else an ``Origin`` matching ``Host``), so another site's
form cannot post one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from controller.gateway.accounting import requestlog
from controller.gateway.accounting.keys import Keys, presented
from controller.gateway.accounting.metrics import GatewayMetrics
from controller.gateway.http.answers import error
from controller.gateway.http.messages import Request, Response, json_response
from controller.gateway.http.router import Router
from controller.gateway.settings import Settings
from controller.gateway.ui import actions
from controller.gateway.ui.snapshot import NodeReader
from controller.gateway.ui.traffic import Traffic
from controller.logsetup import get_logger
from controller.store.config.accesstoken import QUERY, Token
from controller.store.instances import logfiles
from controller.store.instances.records import RecordStore, check_name

log = get_logger("reconcile")

STATIC = Path(__file__).parent / "static"
FILES = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "style.css": "text/css",
}
LOG_LINES = 200  # lines of a log tail, at most
HEADERS = {
    # Everything comes from the gateway itself: no inline script, no other origin.
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",  # frame-ancestors' older form, which scanners still ask for
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
# Over TLS only (RFC 6797: a browser ignores it over HTTP): a year, as nginx guides set it.
HSTS = {"Strict-Transport-Security": "max-age=31536000"}

# Sec-Fetch-Site values of the page's own calls ("none": typed or bookmarked by the user).
SAME_SITE = ("same-origin", "none")
PAGE_REQUESTS = 20  # the request log's last lines the page shows


@dataclass
class Page:
    settings: Settings
    metrics: GatewayMetrics
    keys: Callable[[], Keys | None]  # the keys in force (SIGHUP reloads them)
    request_pass: Callable[[], None]
    reader: NodeReader = field(init=False)
    traffic: Traffic = field(init=False)
    _reading: asyncio.Lock = field(init=False, default_factory=asyncio.Lock)
    _files: dict[str, bytes] = field(init=False, default_factory=dict)
    token: Token = field(init=False)
    headers: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        s = self.settings
        self.reader = NodeReader(s.state_dir, s.node, s.devices)
        self.token = Token(s.state_dir)
        self.token.current()  # made now when missing: `reconcile ui` finds it
        self.headers = {**HEADERS, **(HSTS if s.tls else {})}
        self.traffic = Traffic(self.metrics)
        self._files = {name: (STATIC / name).read_bytes() for name in FILES}

    def install(self, routes: Router, beside: list[Callable[[], AsyncIterator[None]]]) -> None:
        """The routes (found before the gateway's catch-all) and the traffic sampler,
        which runs as long as the server does."""
        routes.add_get("/ui", self.index)
        routes.add_get("/ui/", self.index)
        routes.add_get("/ui/{file:app\\.js|style\\.css}", self.file)
        routes.add_get("/ui/api/state", self.state)
        routes.add_get("/ui/api/logs/{name}", self.logs)
        routes.add_post("/ui/api/{action}", self.act)
        beside.append(self._sampling)

    async def _sampling(self) -> AsyncIterator[None]:
        task = asyncio.create_task(self.traffic.run())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    # -- the files ------------------------------------------------------------------

    async def index(self, request: Request) -> Response:
        return self._file("index.html")

    async def file(self, request: Request) -> Response:
        return self._file(request.match_info["file"])

    def _file(self, name: str) -> Response:
        return Response(body=self._files[name], content_type=FILES[name], headers=self.headers)

    # -- the JSON --------------------------------------------------------------------

    async def state(self, request: Request) -> Response:
        key = self._caller(request)
        if isinstance(key, Response):
            return key
        only = request.query.get("events") or None
        doc = await self._read(lambda: self.reader.state(only))
        doc["keys"] = self.keys() is not None
        doc["traffic"] = self.traffic.as_json()
        log = requestlog.path_in(self.settings.state_dir)
        doc["requests"] = await self._read(lambda: requestlog.read_lines(log, PAGE_REQUESTS))
        return json_response(doc, headers=self.headers)

    async def logs(self, request: Request) -> Response:
        key = self._caller(request)
        if isinstance(key, Response):
            return key
        name = request.match_info["name"]
        store = RecordStore(self.settings.state_dir)
        try:
            path = store.log_path(check_name(name))
        except ValueError:
            return self._error(
                400, f"not a deployment or instance name: {name!r}", "invalid_request"
            )
        if not await self._read(lambda: path.exists() or store.path(name).exists()):
            # no record and no log (`down` keeps logs): a 200 with no lines read as an
            # engine that said nothing
            return self._error(404, f"no deployment or instance named {name!r}", "not_found")
        lines = await self._read(lambda: _tail(path, LOG_LINES))
        return json_response({"name": name, "lines": lines}, headers=self.headers)

    async def _read(self, work: Callable[[], Any]) -> Any:
        """Disk reads off the loop, one at a time (the reader keeps what it read)."""
        async with self._reading:
            return await asyncio.get_running_loop().run_in_executor(None, work)

    # -- the actions -------------------------------------------------------------------

    async def act(self, request: Request) -> Response:
        key = self._caller(request)
        if isinstance(key, Response):
            return key
        refused = _foreign_post(request)
        if refused is not None:
            return self._error(403, refused, "forbidden")
        try:
            body = json.loads(await request.read() or b"{}")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return self._error(400, "the body must be a JSON object", "invalid_request")
        name = body.get("name", "")
        if not isinstance(name, str):  # `{"name": 5}` was "no deployment named '5'", a 404
            return self._error(
                400, "`name` must be a deployment's name, a string", "invalid_request"
            )
        asked = actions.Asked(
            action=request.match_info["action"],
            name=name,
            key=key,
            reason=str(body.get("reason", ""))[:200],
        )
        try:
            said = await self._read(lambda: self._run(asked))
        except actions.Refused as exc:
            return self._error(exc.status, str(exc), "invalid_request")
        except (OSError, ValueError) as exc:
            log.error("web page action failed", action=asked.action, error=str(exc))
            return self._error(500, f"{asked.action} failed: {exc}", "internal_error")
        log.info("web page action", action=asked.action, deployment=asked.name, key=key)
        self.request_pass()  # the daemon acts on it now, not at its next resync
        return json_response({"message": said}, headers=self.headers)

    def _run(self, asked: actions.Asked) -> str:
        return actions.run(self.settings.state_dir, self.reader.records(), asked)

    def _error(self, status: int, message: str, code: str) -> Response:
        """An error of the page's API, with the page's headers (never cached, never
        sniffed as HTML: a scanner flags an answer without them)."""
        answer = error(status, message, code)
        answer.headers.update(self.headers)
        return answer

    # -- who asks ------------------------------------------------------------------------

    def _caller(self, request: Request) -> str | Response:
        """The key's label ("-" without keys, for the token), or the 401 that refuses."""
        keys = self.keys()
        given = presented(request.headers.get("Authorization"), request.headers.get("x-api-key"))
        if keys is None:
            if self.token.accepts(request.query.get(QUERY) or given):
                return "-"
            return self._error(
                401,
                "this page wants the node's access token: open the URL `reconcile ui` "
                "prints (run it as the state dir's owner), or send `Authorization: Bearer "
                "<token>`",
                "invalid_token",
            )
        found = keys.match(given)
        if found is None:
            return self._error(
                401,
                "missing or invalid API key: sign in on the page, or send "
                "`Authorization: Bearer <key>`",
                "invalid_api_key",
            )
        return found


def _foreign_post(request: Request) -> str | None:
    """Why an action is refused as not the page's own (None: it is)."""
    if request.content_type != "application/json":
        return "an action is a POST with Content-Type: application/json (the page sends one)"
    # A browser's own word first (JavaScript cannot set it): behind a reverse proxy that
    # sends `Host: localhost`, as README tells one to, the page's Origin never matches Host.
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None:
        if site in SAME_SITE:
            return None
        return f"an action from another site (Sec-Fetch-Site: {site[:40]}) is refused"
    origin = request.headers.get("Origin")  # a browser that sends no Sec-Fetch-Site
    if origin is not None and urlsplit(origin).netloc != request.host:
        return f"an action from another origin ({origin[:100]}) is refused"
    return None


def _tail(path: Path, count: int) -> list[str]:
    lines = logfiles.tail_lines(path, count)
    return [line.decode("utf-8", "replace").rstrip("\n") for line in lines]
