"""The gateway's HTTP surface: ``/healthz``, ``/v1/models`` and every other ``/v1/...``.

Each answer the gateway makes itself is an OpenAI error body; what the engine
answers is passed through untouched.
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

from controller.core.state import Record
from controller.gateway import readiness
from controller.gateway.activation import Demand
from controller.gateway.answers import error
from controller.gateway.keys import Keys, presented
from controller.gateway.limits import Limiter
from controller.gateway.metrics import GatewayMetrics
from controller.gateway.proxy import UpstreamDown, forward
from controller.gateway.routing import Table, Target
from controller.logsetup import get_logger

log = get_logger("reconcile")

RETRY_AFTER = 5.0  # seconds a 503 or 429 asks the client to wait
FIRST_PASS_WAIT = 30.0  # a daemon just started: its first pass says what exists
CONNECT_RETRIES = 3  # an engine that refuses the connection: wait for a Ready one again


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
        app = web.Application(client_max_size=self.max_body)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/v1/models", self.models)
        app.router.add_route("*", "/v1/{tail:.*}", self.proxied)
        return app

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

    async def proxied(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        key = self._key(request)
        if isinstance(key, web.Response):
            self.metrics.done("-", "-", key.status, time.monotonic() - started)
            return key
        deployment = "-"
        status = 500
        try:
            answer = await self._route(request, key)
            deployment, response = answer
            status = response.status
            return response
        finally:
            self.metrics.done(deployment, key, status, time.monotonic() - started)

    async def _route(self, request: web.Request, key: str) -> tuple[str, web.StreamResponse]:
        body = await self._body(request)
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
            return name, await self._forward(request, body, name)
        finally:
            self.limiter.release(name)

    async def _forward(self, request: web.Request, body: bytes, name: str) -> web.StreamResponse:
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
                    why = f"deployment {name!r} is not Ready ({phase}); retry later"
                    return error(503, why, "model_not_ready", retry_after=RETRY_AFTER)
                try:
                    return await self._send(request, body, target)
                except UpstreamDown as exc:
                    log.warning("engine refused the connection", deployment=name, error=str(exc))
                    self.table.mark_down(name, target)
            why = f"deployment {name!r}: its engine refused the connection; retry later"
            return error(503, why, "model_not_ready", retry_after=RETRY_AFTER)
        finally:
            self.metrics.end(name)
            if on_demand:
                self.demand.end(name)

    async def _send(self, request: web.Request, body: bytes, target: Target) -> web.StreamResponse:
        """Forward, counted per engine: a retiring instance is stopped only once it is 0."""
        # No await between the table's answer and this count: retire() sees every request.
        self.table.inflight[target.nonce] += 1
        try:
            return await forward(
                self.session, request, body, target, strip_keys=self.keys is not None
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
        if request.content_length is not None and request.content_length > self.max_body:
            return _too_large(self.max_body)
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _too_large(self.max_body)


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
