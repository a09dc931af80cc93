"""The gateway's HTTP surface: ``/healthz``, ``/v1/models`` and every other ``/v1/...``.

Each answer the gateway makes itself is an OpenAI error body; what the engine
answers is passed through untouched. Every path is routed in its normal form
(``http/paths.py``) and only that form is forwarded: one that leaves ``/v1/`` is refused.
``Front`` checks the key and its limits, reads the body (bodies.py) and finds its model,
counts and logs the answer; the ``Forwarder`` (forwarding.py) takes it to an engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from controller.core.manifest.listen import host_refusal
from controller.gateway.accounting import requestlog, usage
from controller.gateway.accounting.enginemetrics import EngineMetricsReader
from controller.gateway.accounting.inflight import EngineFigures, InflightWriter
from controller.gateway.accounting.keys import Keys, presented
from controller.gateway.accounting.metrics import GatewayMetrics
from controller.gateway.accounting.quota import Quota
from controller.gateway.accounting.requestlog import RequestLog
from controller.gateway.accounting.tracing import Tracing
from controller.gateway.accounting.usage import Meter
from controller.gateway.http import paths
from controller.gateway.http.answers import error
from controller.gateway.http.messages import Request, Response, StreamResponse, json_response
from controller.gateway.http.router import Router
from controller.gateway.http.upstream import Upstream, get_text
from controller.gateway.routing.concurrency import Bodies, Held
from controller.gateway.routing.table import FIRST_PASS_WAIT, Table
from controller.gateway.settings import WAITING_EVERY
from controller.gateway.surface import bodies
from controller.gateway.surface.forwarding import RETRY_AFTER, Forwarder, Incoming
from controller.gateway.surface.upload import Upload
from controller.gateway.surface.waiting import Waiting, sole, wants_stream
from controller.store.config.accesstoken import QUERY as TOKEN_QUERY

ROUTED = "/v1/"  # what is forwarded lies under this...
ROUTED_ALSO = frozenset({"/rerank"})  # ... and these (Jina/TEI/llama.cpp's rerank path)
MODELS = "/v1/models/"  # GET /v1/models/{id}: the openai client's models.retrieve
OWN_PATHS = frozenset({"/healthz", "/v1/models"})  # answered by the gateway itself
OWN_METHODS = ("GET", "HEAD")  # /healthz, /v1/models and /v1/models/{id}
PROXIED_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")  # the OpenAI API's
CLIENT_CLOSED = 499  # the status logged of a request whose client went away (nginx's)
# An unknown model's name is shown (its 404, the request log) up to this many characters:
# a body of one 32 MiB name was logged and echoed whole.
UNKNOWN_SHOWN = 256
# The OpenAI paths routed by their model, each with the methods it serves: any other is a
# 405 before the body is read (a PUT was forwarded and the engine's HTML 501 counted as
# 5xx; a GET got 400 for the body it has no reason to send). Any other /v1/... path (an
# engine's own, which may read a GET's body for its model) takes PROXIED_METHODS.
POST_ONLY = ("POST",)
ROUTED_METHODS: dict[str, tuple[str, ...]] = dict.fromkeys(
    (
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/v1/rerank",
        "/rerank",
        "/v1/moderations",
        "/v1/audio/speech",
        "/v1/audio/transcriptions",
        "/v1/audio/translations",
        "/v1/images/generations",
        "/v1/images/edits",
        "/v1/images/variations",
        "/v1/messages",
    ),
    POST_ONLY,
)


@dataclass
class Front:
    """The HTTP surface: the app and its middlewares, the gateway's own answers, keys and
    their limits, a request's body and model, its count and log line."""

    table: Table
    metrics: GatewayMetrics
    max_body: int
    looks: Upstream  # the engines' /metrics reads: a client of their own beside the requests'
    bodies: Bodies
    forwarder: Forwarder  # takes a request whose model is known to an engine
    state_dir: Path
    keys: Keys | None = None
    # Bound to loopback: without keys, only a loopback Host is answered (DNS rebinding).
    loopback_only: bool = False
    _quota: Quota | None = None  # the key file's limits (rpm=, tpm=), built on first use
    requests: RequestLog | None = None  # <state>/gateway/requests.jsonl (requestlog.py)
    waiting_every: float = WAITING_EVERY  # seconds between a held stream's comments
    tracing: Tracing = field(default_factory=Tracing)  # traces (tracing.py): none by default
    routes: Router = field(default_factory=Router)  # fixed routes, found before the rest
    beside: list[Callable[[], AsyncIterator[None]]] = field(default_factory=list)  # running()

    async def handle(self, request: Request) -> StreamResponse:
        """Every request's way in (server.py's handler)."""
        if request.method == "CONNECT":  # its target is host:port, which no route matches
            return _not_allowed(request.method, request.raw_path, PROXIED_METHODS)
        if self.keys is None and self.loopback_only:
            # A keyless gateway on loopback answers a loopback ``Host`` only, on every
            # path: a web page whose name was rebound to 127.0.0.1 neither reads a model
            # list nor starts an engine (the page's routes are on this server too).
            refused = _host_refusal(request.headers.get("Host"))
            if refused is not None:
                return error(403, refused, "forbidden")
        return await self.dispatch(request)

    def running(self) -> list[Callable[[], AsyncIterator[None]]]:
        """What runs beside the server, from its start until its requests are drained."""
        return [self._writing_load, self._reading_engines, *self.beside]

    async def _writing_load(self) -> AsyncIterator[None]:
        """The in-flight figures' writer, from start-up until the server is shut down
        (after the requests in flight have drained)."""
        task = asyncio.create_task(InflightWriter(self.state_dir, self.forwarder.load).run())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _reading_engines(self) -> AsyncIterator[None]:
        """The engines' own /metrics, read every few seconds while the server runs."""
        figures = EngineFigures(self.state_dir)
        await asyncio.get_running_loop().run_in_executor(None, figures.prune)
        reader = EngineMetricsReader(
            functools.partial(get_text, self.looks),
            lambda: list(self.table.records.values()),
            self.metrics.engines,
            figures.write,
            self.table.next_change,
            self.table.engine_read,
        )
        task = asyncio.create_task(reader.run())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        figures.forget()

    async def dispatch(self, request: Request) -> StreamResponse:
        raw, query = paths.split(request.raw_path)
        path = paths.normalise(raw)
        if path is None and paths.within(raw, MODELS):
            # A model id with an encoded slash, as the openai client's models.retrieve sends
            # a Hugging Face name (`org%2Fmodel`): answered here and never forwarded, so
            # no engine can read it otherwise (model() decodes it).
            path = raw
        if path is None:
            why = (
                "the request path is not a plain absolute path (encoded slash, backslash, "
                f"NUL): send the API's path as it is named, e.g. {ROUTED}chat/completions"
            )
            return error(400, why, "invalid_path")
        if raw.startswith(ROUTED) and not paths.within(path, ROUTED):
            why = (
                f"the request path leaves {ROUTED} once its dot segments are resolved: send "
                f"a path under {ROUTED} with no `..`, e.g. {ROUTED}chat/completions"
            )
            return error(400, why, "invalid_path")
        fixed = self.routes.resolve(request, path)  # the web page's, the webhook's
        if fixed is not None:
            return await fixed(request)
        if path in OWN_PATHS or paths.within(path, MODELS):
            own = {"/healthz": self.healthz, "/v1/models": self.models}.get(path, self.model)
            if request.method not in OWN_METHODS:
                return _not_allowed(request.method, path, OWN_METHODS)
            return await own(request)
        if not paths.within(path, ROUTED) and path not in ROUTED_ALSO:
            if path == "/" and "text/html" in request.headers.get("Accept", ""):
                # a browser at the gateway's address: the page (its token kept in the query)
                page = "/ui" + (f"?{query}" if query else "")
                return Response(status=302, headers={"Location": page})
            also = ", ".join(sorted(ROUTED_ALSO))
            why = (
                f"no route for {path!r}: the gateway serves /healthz, {ROUTED}... and {also}; "
                "its web page is /ui (`reconcile ui` prints its address)"
            )
            if path == "/metrics":  # where an engine has them; the gateway's are the daemon's
                why += " (its metrics are the daemon's: `--metrics-port PORT` serves /metrics)"
            return error(404, why, "not_found")
        allowed = ROUTED_METHODS.get(path, PROXIED_METHODS)
        if request.method not in allowed:
            return _not_allowed(request.method, path, allowed)
        if self.keys is None:  # the node's access token may come as ?token=: not sent on
            query = paths.without(query, TOKEN_QUERY)
        return await self.proxied(request, path, query)

    async def healthz(self, request: Request) -> Response:
        return json_response({"status": "ok"})

    def _key(self, request: Request) -> str | Response:
        """The caller's key label ("-" when keys are off), or the 401 to answer."""
        if self.keys is None:
            return "-"
        found = self.keys.match(
            presented(request.headers.get("Authorization"), request.headers.get("x-api-key"))
        )
        if found is None:
            return error(
                401,
                "missing or invalid API key: send `Authorization: Bearer <key>` or `x-api-key`",
                "invalid_api_key",
            )
        return found

    async def models(self, request: Request) -> Response:
        key = self._key(request)
        if isinstance(key, Response):
            return key
        await self.table.first_pass(FIRST_PASS_WAIT)
        # Each name once, a pool's too (owned by all its deployments).
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": ",".join(pool)}
            for name, pool in sorted(self.table.pools.items())
        ]
        return json_response({"object": "list", "data": data})

    async def model(self, request: Request) -> Response:
        """One model as ``/v1/models`` lists it, or a 404 naming what exists."""
        key = self._key(request)
        if isinstance(key, Response):
            return key
        raw = paths.split(request.raw_path)[0]
        # The id as the client quoted it (the openai client quotes a `/` in one): decoded.
        name = unquote((paths.normalise(raw) or raw)[len(MODELS) :])
        await self.table.first_pass(FIRST_PASS_WAIT)
        if not await self.table.known(name):
            return self._unknown(name)
        owner = ",".join(self.table.pools[name])
        return json_response({"id": name, "object": "model", "created": 0, "owned_by": owner})

    def _unknown(self, model: str) -> Response:
        """The 404 of a name no deployment serves, naming those that exist; a 503 for a
        deployment whose record only a newer reconcile reads (a downgrade: its engine may
        well run on, and the next upgrade routes it again)."""
        if model in self.table.unreadable:
            why = (
                f"{shown(model)!r} is a deployment whose record a newer reconcile wrote:"
                " this gateway cannot read it, so it routes nothing there until that"
                " reconcile runs this node again; retry later"
            )
            return error(503, why, "model_not_ready", retry_after=RETRY_AFTER)
        known = ", ".join(sorted(self.table.pools)[:20]) or "none"
        why = f"the model {shown(model)!r} does not exist (routable names: {known})"
        return error(404, why, "model_not_found")

    async def proxied(self, request: Request, path: str, query: str) -> StreamResponse:
        meter = Meter()
        key = self._key(request)
        if isinstance(key, Response):
            self.metrics.ended("-", "-", key.status, meter)
            self._log("-", "-", key.status, meter)
            return key
        over = self._over(key)
        if over is not None:
            self.metrics.ended("-", key, over.status, meter)
            self._log(key, "-", over.status, meter)
            return over
        deployment = "-"
        status = 500
        route = path if path in ROUTED_METHODS else None
        with self.tracing.request(request.headers, request.method, path, route):
            try:
                answer = await self._route(Incoming(request, path, query, meter), key)
                deployment, response = answer
                status = response.status
                return response
            except (asyncio.CancelledError, ConnectionError):
                # Its connection closed (server.py cancels the handler; a body still
                # coming fails): see gone().
                deployment, status = gone(meter)
                raise
            finally:
                status = meter.ended_with or status  # a begun stream's error event
                self._count(deployment, key, status, meter)
                self._noted(deployment, status, meter)

    def _noted(self, deployment: str, status: int, meter: Meter) -> None:
        """The request span's outcome (tracing.py; nothing when traces are off)."""
        if not self.tracing.enabled:
            return
        attrs: dict[str, str | int] = {"http.response.status_code": status}
        attrs["reconcile.deployment"] = deployment
        if meter.model is not None:
            attrs["gen_ai.request.model"] = meter.model
        if meter.instance is not None:
            attrs["reconcile.instance"] = meter.instance
        self.tracing.note(attrs, failed=status >= 500)

    def _over(self, key: str) -> Response | None:
        """The 429 of a key past its limits in the key file (quota.py), else None."""
        if self.keys is None or not self.keys.limits:
            return None
        if self._quota is None:
            self._quota = Quota(self.keys)
        elif self._quota.keys is not self.keys:  # the key file reloaded: no fresh minute
            self._quota = self._quota.reloaded(self.keys)
        refused = self._quota.admit(key)
        if refused is None:
            return None
        why = f"API key {key} is {refused.why}; retry in {max(1, round(refused.retry_after))}s"
        return error(429, why, "rate_limit_exceeded", retry_after=refused.retry_after)

    def _log(self, key: str, deployment: str, status: int, meter: Meter) -> None:
        if self.requests is not None:
            self.requests.append(requestlog.line(key, deployment, status, meter))

    def _count(self, deployment: str, key: str, status: int, meter: Meter) -> None:
        self._log(key, deployment, status, meter)
        self.metrics.ended(deployment, key, status, meter)
        if meter.usage is not None and self._quota is not None:
            self._quota.spend(key, meter.usage.total)

    async def _route(self, incoming: Incoming, key: str) -> tuple[str, StreamResponse]:
        # The body's bytes are reserved before any is read (a size known up front; the
        # rest as it arrives: bodies.read), and held until the answer ends.
        incoming.mark = bodies.multipart(incoming.request)
        size = bodies.held(incoming.request, self.max_body, incoming.mark)
        if not await self.bodies.take(size, key):
            why = self._no_room(key, size)
            return "-", error(503, why, "server_busy", retry_after=RETRY_AFTER)
        hold = Held(self.bodies, size, key)
        try:
            return await self._route_held(incoming, key, hold)
        finally:
            hold.give()

    def _no_room(self, key: str, size: int) -> str:
        """Why a body of ``size`` found no room in time: all of it held, or its key's share."""
        room = self.bodies
        if room.share < room.total and room.peer_held(key) + size > room.share:
            return (
                f"API key {key} holds {room.peer_held(key)} bytes of request bodies, and one "
                f"key may hold {room.share} at once (half of --max-body-total) while its "
                "bodies arrive and are answered; none were freed in time: retry later"
            )
        return (
            f"the gateway holds {room.total} bytes of request bodies at once "
            "(--max-body-total) and none were freed in time; retry later"
        )

    async def _route_held(
        self, incoming: Incoming, key: str, hold: Held
    ) -> tuple[str, StreamResponse]:
        parsed = await bodies.read(incoming.request, self.max_body, incoming.mark, hold)
        if isinstance(parsed, Response):
            return "-", parsed
        body, fields, model = parsed
        # Judged before the first pass's wait: a client gone during it is logged by this.
        incoming.meter.model = model if model in self.table.pools else self._logged(model)
        if isinstance(body, bytes):
            body, incoming.meter.strip = usage.ask(body, fields, incoming.path)
        if model is None:  # an upload has its model: this body is bytes
            why = bodies.no_model(body if isinstance(body, bytes) else b"")
            return "-", error(400, why, "invalid_request")
        if model not in self.table.pools:
            if not await self._known(model):
                return "-", self._unknown(model)
            incoming.meter.model = model  # routable: a deployment's name, kept as sent
        if not wants_stream(fields):
            return await self.forwarder.serve(incoming, body, fields, (model,))
        return await self._streamed(incoming, body, fields, model)

    def _logged(self, model: str | None) -> str | None:
        """An unknown model's name as the request log and the request's span keep it: cut
        long, UTF-8 (a lone surrogate, which JSON's ``\\ud800`` gives, failed the span's
        encoding with a traceback in the log each time), and never one of the gateway's
        keys (a client that sent its key as the model): that key's label instead."""
        if model is None:
            return None
        text = model.encode("utf-8", "backslashreplace").decode()  # a key is ASCII
        label = self.keys.match(text) if self.keys is not None else None
        return shown(text) if label is None else f"(an API key: {label})"

    async def _known(self, model: str) -> bool:
        """Whether ``model`` is routable, once the first pass said what exists (a name the
        table has is known at once: no wait's coroutines on the request's path)."""
        await self.table.first_pass(FIRST_PASS_WAIT)
        return await self.table.known(model)

    async def _streamed(
        self, incoming: Incoming, body: bytes | Upload, fields: dict[str, Any], model: str
    ) -> tuple[str, StreamResponse]:
        """A streaming request: waiting comments while it is held (waiting.py), through
        its fallbacks too; the gateway's own answer then ends the stream begun for them."""
        label = self.table.label(model)
        waiting = Waiting(
            incoming.request,
            label,
            lambda: self.table.phases(model),
            self.waiting_every,
            serves=sole(self.table, model),
            meter=incoming.meter,
        )
        incoming.waiting = waiting
        answered: StreamResponse | None = None
        try:
            deployment, answered = await self.forwarder.serve(incoming, body, fields, (model,))
            sent = await waiting.answer(answered)
            if sent is not answered:  # the gateway's own answer became the stream's last event
                incoming.meter.ended_with = answered.status
            return deployment, sent
        finally:
            if answered is None:
                await waiting.settle()


def shown(model: str) -> str:
    """An unknown model's name as its 404 and the request log show it: cut long."""
    if len(model) <= UNKNOWN_SHOWN:
        return model
    return f"{model[:UNKNOWN_SHOWN]}... ({len(model)} characters)"


def gone(meter: Meter) -> tuple[str, int]:
    """The deployment and status logged of a request whose client went away: the status
    it was sent once its answer had begun (nginx logs what it sent), else nginx's 499, a
    client error, not the server's; under the deployment its engine had, if any."""
    deployment = meter.deployment or "-"
    if meter.status is not None and meter.first is not None:
        return deployment, meter.status
    return deployment, CLIENT_CLOSED


# A client sends the same Host on every request: its verdict (an IP parse and a URL split,
# 1.8% of a profile at 32 clients) is kept, for this many Host values at most.
_host_refusal = functools.lru_cache(maxsize=256)(host_refusal)


def _not_allowed(method: str, path: str, allowed: tuple[str, ...]) -> Response:
    why = f"method {method} is not allowed on {path} (allowed: {', '.join(allowed)})"
    return error(405, why, "method_not_allowed", allow=allowed)
