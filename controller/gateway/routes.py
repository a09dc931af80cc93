"""The gateway's HTTP surface: ``/healthz``, ``/v1/models`` and every other ``/v1/...``.

Each answer the gateway makes itself is an OpenAI error body; what the engine
answers is passed through untouched. Every path is routed in its normal form
(paths.py) and only that form is forwarded: one that leaves ``/v1/`` is refused.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler

from controller.core.state import Record
from controller.gateway import encoding, paths, readiness
from controller.gateway.activation import Demand
from controller.gateway.answers import error
from controller.gateway.keys import Keys, presented
from controller.gateway.limits import Limiter
from controller.gateway.metrics import GatewayMetrics
from controller.gateway.proxy import UpstreamDown, UpstreamFailed, forward
from controller.gateway.routing import Table, Target
from controller.logsetup import get_logger

log = get_logger("reconcile")

RETRY_AFTER = 5.0  # seconds a 503 or 429 asks the client to wait
FIRST_PASS_WAIT = 30.0  # a daemon just started: its first pass says what exists
CONNECT_RETRIES = 3  # an engine that refuses the connection: wait for a Ready one again
BODY_TIMEOUT = 120.0  # seconds a client may take to send its body (a slow one holds a slot)
ROUTED = "/v1/"  # what is forwarded lies under this
OWN_METHODS = ("GET", "HEAD")  # /healthz and /v1/models
PROXIED_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")  # the OpenAI API's


@dataclass
class Front:
    table: Table
    demand: Demand
    limiter: Limiter
    metrics: GatewayMetrics
    max_body: int
    session: aiohttp.ClientSession
    keys: Keys | None = None
    # deployment -> (the Starting engine's nonce, the gateway's probe of it)
    watching: dict[str, tuple[str | None, asyncio.Task[None]]] = field(default_factory=dict)
    waiting: Counter[str] = field(default_factory=Counter)  # deployment -> requests waiting

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body, middlewares=[_openai_errors])
        # One route: the path is normalised first, then routed here (never by its raw form).
        app.router.add_route("*", "/{tail:.*}", self.dispatch)
        return app

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        raw, query = paths.split(request.raw_path)
        path = paths.normalise(raw)
        if path is None:
            why = "the request path is not a plain absolute path (encoded slash, backslash, NUL)"
            return error(400, why, "invalid_path")
        if raw.startswith(ROUTED) and not paths.within(path, ROUTED):
            why = f"the request path leaves {ROUTED} once its dot segments are resolved"
            return error(400, why, "invalid_path")
        own = {"/healthz": self.healthz, "/v1/models": self.models}.get(path)
        if own is not None:
            if request.method not in OWN_METHODS:
                return _not_allowed(request.method, path, OWN_METHODS)
            return await own(request)
        if not paths.within(path, ROUTED):
            why = f"no route for {path!r}: the gateway serves /healthz and {ROUTED}..."
            return error(404, why, "not_found")
        if request.method not in PROXIED_METHODS:
            return _not_allowed(request.method, path, PROXIED_METHODS)
        return await self.proxied(request, path, query)

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    def _key(self, request: web.Request) -> str | web.Response:
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

    async def models(self, request: web.Request) -> web.Response:
        key = self._key(request)
        if isinstance(key, web.Response):
            return key
        await self.table.first_pass(FIRST_PASS_WAIT)
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": deployment}
            for name, deployment in sorted(self.table.names.items())
        ]
        return web.json_response({"object": "list", "data": data})

    async def proxied(self, request: web.Request, path: str, query: str) -> web.StreamResponse:
        started = time.monotonic()
        key = self._key(request)
        if isinstance(key, web.Response):
            self.metrics.done("-", "-", key.status, time.monotonic() - started)
            return key
        deployment = "-"
        status = 500
        try:
            answer = await self._route(Incoming(request, path, query), key)
            deployment, response = answer
            status = response.status
            return response
        finally:
            self.metrics.done(deployment, key, status, time.monotonic() - started)

    async def _route(self, incoming: Incoming, key: str) -> tuple[str, web.StreamResponse]:
        body = await self._body(incoming.request)
        if isinstance(body, web.Response):
            return "-", body
        model = _model(body)
        if model is None:
            why = "the request body must be a JSON object with a string field `model`"
            return "-", error(400, why, "invalid_request")
        await self.table.first_pass(FIRST_PASS_WAIT)
        name = self.table.deployment(model)
        if name is None:
            known = ", ".join(sorted(self.table.names)[:20]) or "none"
            why = f"the model {model!r} does not exist (routable names: {known})"
            return "-", error(404, why, "model_not_found")
        if not await self.limiter.acquire(name):
            why = f"deployment {name!r} is at its limit of concurrent requests; retry later"
            return name, error(429, why, "rate_limit_exceeded", retry_after=RETRY_AFTER)
        try:
            return name, await self._forward(incoming, body, name)
        finally:
            self.limiter.release(name)

    async def _forward(self, incoming: Incoming, body: bytes, name: str) -> web.StreamResponse:
        on_demand = self.table.on_demand(name)
        if on_demand:
            self.demand.begin(name)
        self.metrics.begin(name)
        try:
            for _ in range(CONNECT_RETRIES):
                if on_demand and self.table.target(name) is None:
                    await self.demand.activate(name)
                target = await self._wait(name)
                if target is None:
                    rec = self.table.records.get(name)
                    phase = rec.phase.value if rec is not None else "gone"
                    waited = self.table.deadline(name)  # the record's: the daemon's deadline
                    why = (
                        f"deployment {name!r} is not Ready ({phase}) within its readiness "
                        f"deadline ({waited:g}s); retry later"
                    )
                    return error(503, why, "model_not_ready", retry_after=RETRY_AFTER)
                try:
                    return await self._send_once_more(incoming, body, target)
                except UpstreamDown as exc:
                    log.info("engine refused the connection", deployment=name, error=str(exc))
                    self.table.mark_down(name, target)
            why = f"deployment {name!r}: its engine refused the connection; retry later"
            return error(503, why, "model_not_ready", retry_after=RETRY_AFTER)
        finally:
            self.metrics.end(name)
            if on_demand:
                self.demand.end(name)

    async def _send_once_more(
        self, incoming: Incoming, body: bytes, target: Target
    ) -> web.StreamResponse:
        """Send; an engine that dropped the connection before any byte of its answer gets
        the request once more, on another Ready instance if there is one; else a 502."""
        try:
            return await self._send(incoming, body, target)
        except UpstreamFailed as exc:
            other = self.table.target(target.deployment, avoid=target.nonce) if exc.retry else None
            log.info(
                "engine connection lost before its answer",
                deployment=target.deployment,
                error=str(exc),
                retried=str(other is not None).lower(),
            )
            if other is None:
                return _upstream_error(target.deployment)
        try:
            return await self._send(incoming, body, other)
        except UpstreamFailed as exc:
            log.info("engine connection lost again", deployment=other.deployment, error=str(exc))
            return _upstream_error(other.deployment)

    async def _send(self, incoming: Incoming, body: bytes, target: Target) -> web.StreamResponse:
        """Forward, counted per engine: a retiring instance is stopped only once it is 0."""
        # No await between the table's answer and this count: retire() sees every request.
        self.table.inflight[target.nonce] += 1
        try:
            return await forward(
                self.session,
                incoming.request,
                body,
                target,
                incoming.path,
                incoming.query,
                strip_keys=self.keys is not None,
            )
        finally:
            self.table.inflight[target.nonce] -= 1
            if self.table.inflight[target.nonce] <= 0:
                del self.table.inflight[target.nonce]

    async def _wait(self, name: str) -> Target | None:
        deadline = self.table.deadline(name)
        self.waiting[name] += 1
        try:
            return await self.table.wait_target(name, deadline, lambda: self._watch(name, deadline))
        finally:
            self.waiting[name] -= 1

    def _watch(self, name: str, deadline: float) -> None:
        """Probe a Starting engine ourselves while requests wait (readiness.py says why)."""
        rec = self.table.starting(name)
        if rec is None:
            return
        running = self.watching.get(name)
        if running is not None and running[0] == rec.nonce and not running[1].done():
            return
        task = asyncio.get_running_loop().create_task(self._probe(name, rec, deadline))
        self.watching[name] = (rec.nonce, task)

    async def _probe(self, name: str, rec: Record, deadline: float) -> None:
        def wanted() -> bool:
            current = self.table.starting(name)
            return current is not None and current.nonce == rec.nonce and self.waiting[name] > 0

        try:
            if not await asyncio.wait_for(readiness.watch(rec, wanted), deadline):
                return
        except TimeoutError:
            return
        self.table.probed_ready(name, rec.nonce)
        self.demand.request_pass()  # the daemon records it Ready by the same probe

    async def _body(self, request: web.Request) -> bytes | web.Response:
        """The plain body (Content-Encoding undone, encoding.py), or the error to answer."""
        if request.content_length is not None and request.content_length > self.max_body:
            return _too_large(self.max_body)
        try:
            async with asyncio.timeout(BODY_TIMEOUT):
                raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _too_large(self.max_body)
        except TimeoutError:
            why = f"the request body did not arrive within {BODY_TIMEOUT:g} seconds"
            return _closing(error(408, why, "request_timeout"))
        plain = encoding.decode(raw, request.headers.get("Content-Encoding"), self.max_body)
        if isinstance(plain, encoding.Refused):
            return error(plain.status, plain.message, plain.code)
        return plain


@dataclass(frozen=True)
class Incoming:
    """A request to forward and the one path (normalised) and query it goes on with."""

    request: web.Request
    path: str
    query: str


@web.middleware
async def _openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """What aiohttp would answer in plain text itself (a target no route takes, such
    as ``*``) as an OpenAI error body."""
    if request.method == "CONNECT":  # its target is host:port, which no route matches
        return _not_allowed(request.method, request.raw_path, PROXIED_METHODS)
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error(exc.status, exc.reason, "invalid_request")


def _not_allowed(method: str, path: str, allowed: tuple[str, ...]) -> web.Response:
    why = f"method {method} is not allowed on {path} (allowed: {', '.join(allowed)})"
    return error(405, why, "method_not_allowed", allow=allowed)


def _upstream_error(name: str) -> web.Response:
    why = f"the engine of {name!r} closed the connection before answering; retry later"
    return error(502, why, "upstream_error")


def _closing(answer: web.Response) -> web.Response:
    answer.force_close()  # what is left of the body is not read
    return answer


def _too_large(limit: int) -> web.Response:
    why = f"the request body is larger than the gateway's limit of {limit} bytes (--max-body)"
    return error(413, why, "request_too_large")


def _model(body: bytes) -> str | None:
    try:
        value: Any = json.loads(body)
    except (ValueError, RecursionError):
        return None
    model = value.get("model") if isinstance(value, dict) else None
    return model if isinstance(model, str) and model else None
