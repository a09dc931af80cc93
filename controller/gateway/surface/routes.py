"""The gateway's HTTP surface: ``/healthz``, ``/v1/models`` and every other ``/v1/...``.

Each answer the gateway makes itself is an OpenAI error body; what the engine
answers is passed through untouched. Every path is routed in its normal form
(paths.py) and only that form is forwarded: one that leaves ``/v1/`` is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler

from controller.core.manifest.listen import host_refusal
from controller.core.state import Phase, Record
from controller.gateway.accounting import requestlog, usage
from controller.gateway.accounting.enginemetrics import EngineMetricsReader
from controller.gateway.accounting.inflight import EngineFigures, InflightCounts, InflightWriter
from controller.gateway.accounting.keys import Keys, presented
from controller.gateway.accounting.metrics import GatewayMetrics
from controller.gateway.accounting.quota import Quota
from controller.gateway.accounting.requestlog import RequestLog
from controller.gateway.accounting.tracing import Tracing
from controller.gateway.accounting.usage import Meter
from controller.gateway.routing import readiness
from controller.gateway.routing.activation import Demand
from controller.gateway.routing.concurrency import Bodies, Limiter
from controller.gateway.routing.prefix import chain, prompt_text
from controller.gateway.routing.swaps import Turns
from controller.gateway.routing.table import FIRST_PASS_WAIT, Table, Target
from controller.gateway.settings import WAITING_EVERY
from controller.gateway.surface import encoding, paths, upload
from controller.gateway.surface.answers import error
from controller.gateway.surface.proxy import UpstreamDown, UpstreamFailed, forward
from controller.gateway.surface.upload import Upload
from controller.gateway.surface.waiting import Waiting, wants_stream
from controller.logsetup import get_logger
from controller.store.instances.events import Journal

log = get_logger("reconcile")

RETRY_AFTER = 5.0  # seconds a 503 or 429 asks the client to wait
CONNECT_RETRIES = 3  # an engine not reached (refused, connect timed out): wait for a Ready one
BODY_TIMEOUT = 120.0  # seconds a client may take to send its body (a slow one holds a slot)
ROUTED = "/v1/"  # what is forwarded lies under this...
ROUTED_ALSO = frozenset({"/rerank"})  # ... and these (Jina/TEI/llama.cpp's rerank path)
MODELS = "/v1/models/"  # GET /v1/models/{id}: the openai client's models.retrieve
OWN_METHODS = ("GET", "HEAD")  # /healthz and /v1/models
PROXIED_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")  # the OpenAI API's
SESSION_HEADER = "x-session-id"  # affinity's key; else the OpenAI body's `user`
SESSION_MAX = 1024  # characters of a session key (it is hashed, never stored)


@dataclass
class Front:
    table: Table
    demand: Demand
    limiter: Limiter
    metrics: GatewayMetrics
    max_body: int
    session: aiohttp.ClientSession
    bodies: Bodies
    keys: Keys | None = None
    # Bound to loopback: without keys, only a loopback Host is answered (DNS rebinding).
    loopback_only: bool = False
    # record name -> (its Starting engine's nonce, the gateway's probe of it)
    watching: dict[str, tuple[str | None, asyncio.Task[None]]] = field(default_factory=dict)
    waiting: Counter[str] = field(default_factory=Counter)  # pool name -> requests waiting
    # engine nonce -> the look at a silent engine (Front._judge_silence)
    judging: dict[str | None, asyncio.Task[None]] = field(default_factory=dict)
    load: InflightCounts = field(
        default_factory=InflightCounts
    )  # per deployment, for the autoscaler
    draining: bool = False  # the listener is closed: each answer ends its connection
    _quota: Quota | None = None  # the key file's limits (rpm=, tpm=), built on first use
    turns: Turns | None = None  # OnDemand rivals take turns (turns.py)
    requests: RequestLog | None = None  # <state>/gateway/requests.jsonl (requestlog.py)
    waiting_every: float = WAITING_EVERY  # seconds between a held stream's comments
    tracing: Tracing = field(default_factory=Tracing)  # traces (tracing.py): none by default

    def __post_init__(self) -> None:
        if self.turns is None:
            self.turns = Turns(self.metrics.swap_avoided)

    def app(self) -> web.Application:
        @web.middleware
        async def loopback_host_only(request: web.Request, handler: Handler) -> web.StreamResponse:
            return await self._loopback_host_only(request, handler)

        middlewares = [_openai_errors, loopback_host_only]
        app = web.Application(client_max_size=self.max_body, middlewares=middlewares)
        # One route: the path is normalised first, then routed here (never by its raw form).
        app.router.add_route("*", "/{tail:.*}", self.dispatch)
        app.cleanup_ctx.append(self._writing_load)
        app.cleanup_ctx.append(self._reading_engines)
        app.on_response_prepare.append(self._closing_when_draining)
        return app

    async def _loopback_host_only(
        self, request: web.Request, handler: Handler
    ) -> web.StreamResponse:
        """A keyless gateway on loopback answers a loopback ``Host`` only, on every path:
        a web page whose name was rebound to 127.0.0.1 neither reads a model list nor
        starts an engine (the page's routes are on this app too)."""
        if self.keys is None and self.loopback_only:
            refused = _host_refusal(request.headers.get("Host"))
            if refused is not None:
                return error(403, refused, "forbidden")
        return await handler(request)

    async def _closing_when_draining(
        self, request: web.Request, answer: web.StreamResponse
    ) -> None:
        """A draining gateway's answers say ``Connection: close``: a kept-alive client
        opens its next connection to the successor instead of racing our close."""
        if self.draining:
            answer.force_close()
            answer.headers["Connection"] = "close"

    async def _writing_load(self, app: web.Application) -> AsyncIterator[None]:
        """The in-flight figures' writer, from start-up until the server is shut down
        (after the requests in flight have drained)."""
        task = asyncio.create_task(InflightWriter(self.demand.state_dir, self.load).run())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _reading_engines(self, app: web.Application) -> AsyncIterator[None]:
        """The engines' own /metrics, read every few seconds while the server runs."""
        figures = EngineFigures(self.demand.state_dir)
        await asyncio.get_running_loop().run_in_executor(None, figures.prune)
        reader = EngineMetricsReader(
            self.session,
            lambda: list(self.table.records.values()),
            self.metrics.engines,
            figures.write,
            self.table.next_change,
        )
        task = asyncio.create_task(reader.run())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        figures.forget()

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
        if own is None and paths.within(path, MODELS):
            own = self.model
        if own is not None:
            if request.method not in OWN_METHODS:
                return _not_allowed(request.method, path, OWN_METHODS)
            return await own(request)
        if not paths.within(path, ROUTED) and path not in ROUTED_ALSO:
            also = ", ".join(sorted(ROUTED_ALSO))
            why = f"no route for {path!r}: the gateway serves /healthz, {ROUTED}... and {also}"
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
        # Each name once, a pool's too (owned by all its deployments).
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": ",".join(pool)}
            for name, pool in sorted(self.table.pools.items())
        ]
        return web.json_response({"object": "list", "data": data})

    async def model(self, request: web.Request) -> web.Response:
        """One model as ``/v1/models`` lists it, or a 404 naming what exists."""
        key = self._key(request)
        if isinstance(key, web.Response):
            return key
        name = paths.normalise(paths.split(request.raw_path)[0]) or ""
        name = name[len(MODELS) :]
        await self.table.first_pass(FIRST_PASS_WAIT)
        if not await self.table.known(name):
            known = ", ".join(sorted(self.table.pools)[:20]) or "none"
            why = f"the model {name!r} does not exist (routable names: {known})"
            return error(404, why, "model_not_found")
        owner = ",".join(self.table.pools[name])
        return web.json_response({"id": name, "object": "model", "created": 0, "owned_by": owner})

    async def proxied(self, request: web.Request, path: str, query: str) -> web.StreamResponse:
        meter = Meter()
        key = self._key(request)
        if isinstance(key, web.Response):
            self.metrics.done("-", "-", key.status, time.monotonic() - meter.started)
            self._log("-", "-", key.status, meter)
            return key
        over = self._over(key)
        if over is not None:
            self.metrics.done("-", key, over.status, time.monotonic() - meter.started)
            self._log(key, "-", over.status, meter)
            return over
        deployment = "-"
        status = 500
        with self.tracing.request(request.headers, request.method, path):
            try:
                answer = await self._route(Incoming(request, path, query, meter), key)
                deployment, response = answer
                status = response.status
                return response
            finally:
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

    def _prefix(self, pool: str, fields: dict[str, Any]) -> tuple[bytes, ...]:
        """The prompt's chained block hashes where the pool routes by prefix (prefix.py)."""
        if self.table.affinity(pool) != "prefix":
            return ()
        text = prompt_text(fields)
        return chain(text) if text else ()

    def _over(self, key: str) -> web.Response | None:
        """The 429 of a key past its limits in the key file (quota.py), else None."""
        if self.keys is None or not self.keys.limits:
            return None
        if self._quota is None or self._quota.keys is not self.keys:
            self._quota = Quota(self.keys)  # the key file was reloaded: its limits afresh
        refused = self._quota.admit(key)
        if refused is None:
            return None
        why = f"API key {key} is {refused.why}; retry in {max(1, round(refused.retry_after))}s"
        return error(429, why, "rate_limit_exceeded", retry_after=refused.retry_after)

    def _log(self, key: str, deployment: str, status: int, meter: Meter) -> None:
        if self.requests is not None:
            self.requests.write(requestlog.entry(key, deployment, status, meter))

    def _count(self, deployment: str, key: str, status: int, meter: Meter) -> None:
        self._log(key, deployment, status, meter)
        now = time.monotonic()
        self.metrics.done(deployment, key, status, now - meter.started)
        used = meter.usage
        first = meter.first - meter.started if meter.first is not None else None
        if first is None and used is None:
            return
        prompt, completion = (used.prompt, used.completion) if used else (0, 0)
        self.metrics.answered(deployment, key, first, prompt, completion)
        if used is not None and self._quota is not None:
            self._quota.spend(key, used.total)

    async def _route(self, incoming: Incoming, key: str) -> tuple[str, web.StreamResponse]:
        # The body's bytes are reserved before any is read, and held until the answer ends.
        size = self._held(incoming.request)
        if not await self.bodies.take(size):
            why = (
                f"the gateway holds {self.bodies.total} bytes of request bodies at once "
                "(--max-body-total) and none were freed in time; retry later"
            )
            return "-", error(503, why, "server_busy", retry_after=RETRY_AFTER)
        try:
            return await self._route_held(incoming, key)
        finally:
            self.bodies.give(size)

    def _held(self, request: web.Request) -> int:
        """The bytes a request's body may take while it is held: its length, else (chunked,
        encoded) as much as --max-body lets it grow; a multipart upload's scanned head."""
        if not request.body_exists:
            return 0
        if upload.boundary(request.headers.get("Content-Type", "")) is not None:
            return upload.SCAN_MAX
        coding = request.headers.get("Content-Encoding", "").strip().lower()
        length = request.content_length
        if length is None or coding not in ("", "identity"):
            return self.max_body
        return min(length, self.max_body)

    async def _route_held(self, incoming: Incoming, key: str) -> tuple[str, web.StreamResponse]:
        parsed = await self._parsed(incoming.request)
        if isinstance(parsed, web.Response):
            return "-", parsed
        body, fields, model = parsed
        incoming.meter.model = model
        if isinstance(body, bytes):
            body, incoming.meter.strip = usage.ask(body, fields, incoming.path)
        if model is None:
            why = "the request body must be a JSON object with a string field `model`"
            return "-", error(400, why, "invalid_request")
        await self.table.first_pass(FIRST_PASS_WAIT)
        if not await self.table.known(model):
            known = ", ".join(sorted(self.table.pools)[:20]) or "none"
            why = f"the model {model!r} does not exist (routable names: {known})"
            return "-", error(404, why, "model_not_found")
        if not wants_stream(fields):
            return await self._serve(incoming, body, fields, (model,))
        # A streaming request: waiting comments while it is held (waiting.py), through
        # its fallbacks too; the gateway's own answer then ends the stream begun for them.
        label = self.table.label(model)
        waiting = Waiting(
            incoming.request, label, lambda: self.table.phases(model), self.waiting_every
        )
        incoming.waiting = waiting
        answered: web.StreamResponse | None = None
        try:
            deployment, answered = await self._serve(incoming, body, fields, (model,))
            return deployment, await waiting.answer(answered)
        finally:
            if answered is None:
                await waiting.settle()

    async def _serve(
        self,
        incoming: Incoming,
        body: bytes | Upload,
        fields: dict[str, Any],
        tried: tuple[str, ...],
    ) -> tuple[str, web.StreamResponse]:
        """Serve the request with the last model of ``tried``, else with the first of its
        fallbacks (none already tried: no loop) that can take it."""
        model = tried[-1]
        label = self.table.label(model)
        onward = [
            f for f in self.table.fallbacks(model) if f not in tried and f in self.table.pools
        ]
        if onward and self.limiter.full(label):
            return await self._fall_back(incoming, body, fields, tried, onward, "limit")
        if not await self.limiter.acquire(label):
            why = f"deployment {label!r} is at its limit of concurrent requests; retry later"
            return label, error(429, why, "rate_limit_exceeded", retry_after=RETRY_AFTER)
        incoming.no_instance = False
        try:
            want = Ask(
                model,
                label,
                _session(incoming.request, fields),
                self._prefix(model, fields),
                self.table.fallback_after(model) if onward else None,
            )
            with self.tracing.span("routing", {"reconcile.model": model}):
                answered = await self._forward(incoming, body, want)
        finally:
            self.limiter.release(label)
        if onward and incoming.no_instance:
            why = "ejected" if self.table.ejected(model) is not None else "not_ready"
            return await self._fall_back(incoming, body, fields, tried, onward, why)
        return answered

    async def _fall_back(
        self,
        incoming: Incoming,
        body: bytes | Upload,
        fields: dict[str, Any],
        tried: tuple[str, ...],
        onward: list[str],
        why: str,
    ) -> tuple[str, web.StreamResponse]:
        """``tried[-1]`` cannot take the request (``why``): its first fallback serves it
        (or, failing that too, that one's own fallbacks). Each one taken is counted and
        journalled."""
        model, to = tried[-1], onward[0]
        self.metrics.fell_back(model, to, why)
        log.info("request sent to a fallback", model=model, fallback=to, reason=why)
        said = {"not_ready": "no instance Ready", "ejected": "every instance ejected"}
        reason = f"{said.get(why, 'at its concurrency limit')}: a request went to {to!r}"
        journal = Journal(self.demand.state_dir)
        for deployment in self.table.pools.get(model, ()):
            loop = asyncio.get_running_loop()
            loop.run_in_executor(None, journal.append, deployment, "fallback", reason, "ok")
        with self.tracing.span("fallback", {"reconcile.from": model, "reconcile.to": to}):
            self.tracing.note({"reconcile.reason": why})
            return await self._serve(incoming, body, fields, (*tried, to))

    async def _forward(
        self, incoming: Incoming, body: bytes | Upload, want: Ask
    ) -> tuple[str, web.StreamResponse]:
        """The deployment that answered (or the pool's label) and its answer."""
        sleepers = self.table.on_demand(want.pool)  # a request for the pool wants them all
        turns = self.turns
        aged = False
        if sleepers and turns is not None:
            turns.learn(self.table.records)
            aged = await turns.enter(sleepers, lambda: bool(self.table.candidates(want.pool)))
        for name in sleepers:
            self.demand.begin(name)
        try:
            for _ in range(CONNECT_RETRIES):
                if sleepers and not self.table.candidates(want.pool):
                    for name in sleepers:
                        problem = await self.demand.activate(name)
                        if problem is not None:  # nothing can wake it: say so now
                            why = (
                                f"deployment {want.label!r} cannot be started: its demand "
                                "could not be written (the gateway's log names the file)"
                            )
                            return want.label, error(503, why, "model_not_ready")
                with self.tracing.span("wait for Ready", {"reconcile.pool": want.pool}):
                    target = await self._wait(want)
                if target is None:
                    incoming.no_instance = True  # a fallback may take it (_serve)
                    return want.label, self._not_ready(want)
                try:
                    answer = await self._send_once_more(incoming, body, want, target)
                    return target.deployment, answer
                except UpstreamDown as exc:
                    why = str(exc)
                    log.info("engine not reached", deployment=target.deployment, error=why)
                    self.table.mark_down(target)
            why = f"deployment {want.label!r}: its engine could not be reached; retry later"
            return want.label, error(503, why, "model_not_ready", retry_after=RETRY_AFTER)
        finally:
            for name in sleepers:
                self.demand.end(name)
            if sleepers and turns is not None:
                turns.leave(sleepers, aged)

    def _not_ready(self, want: Ask) -> web.Response:
        ejected = self.table.ejected(want.pool)
        if ejected is not None:
            why = (
                f"every instance of {want.label!r} is ejected after failing requests in a "
                f"row; the next trial in {max(1, round(ejected))}s"
            )
            return error(503, why, "model_not_ready", retry_after=ejected)
        phase = self.table.phases(want.pool)
        waited = self.table.deadline(want.pool)  # the records': the daemon's deadline
        why = (
            f"deployment {want.label!r} is not Ready ({phase}) within its readiness "
            f"deadline ({waited:g}s); retry later"
        )
        return error(503, why, "model_not_ready", retry_after=RETRY_AFTER)

    async def _send_once_more(
        self, incoming: Incoming, body: bytes | Upload, want: Ask, target: Target
    ) -> web.StreamResponse:
        """Send; an engine that dropped the connection before any byte of its answer gets
        the request once more, on another Ready instance of the pool if there is one;
        else a 502."""
        try:
            return await self._send(incoming, body, target)
        except UpstreamFailed as exc:
            # A streamed upload the engine has begun to read cannot be sent again.
            again = exc.retry and not (isinstance(body, Upload) and body.started)
            other = (
                self.table.target(
                    want.pool, avoid=target.nonce, session=want.session, prefix=want.prefix
                )
                if again
                else None
            )
            log.info(
                "engine connection lost before its answer",
                deployment=target.deployment,
                error=str(exc),
                retried=str(other is not None).lower(),
            )
            if other is None:
                return _upstream_error(target.deployment)
        try:
            with self.tracing.span("retry", {"reconcile.deployment": other.deployment}):
                return await self._send(incoming, body, other)
        except UpstreamFailed as exc:
            log.info("engine connection lost again", deployment=other.deployment, error=str(exc))
            return _upstream_error(other.deployment)

    async def _send(
        self, incoming: Incoming, body: bytes | Upload, target: Target
    ) -> web.StreamResponse:
        """Forward, counted per engine: a retiring instance is stopped only once it is 0,
        and the balancer sends the next request to the least loaded."""
        # No await between the table's answer and this count: retire() sees every request,
        # and concurrent requests see each other's.
        self.table.request_began(target.nonce)
        self.load.add(target.deployment, 1)
        self.metrics.begin(target.deployment, target.instance)
        incoming.meter.instance = target.instance
        trial = self.table.health.sent(target.nonce)
        outcome: int | str | None = None  # passive health (health.py); None: no verdict
        silent = False  # the client gave up before a byte of the engine's answer
        try:
            answer = await self._call(incoming, body, target)
            outcome = answer.status
            return answer
        except (UpstreamDown, UpstreamFailed) as exc:
            outcome = str(exc) or type(exc).__name__
            raise
        except asyncio.CancelledError:
            silent = incoming.meter.first is None
            raise
        finally:
            if silent:
                self._judge_silence(target, trial)
            else:
                self.table.health.report(target, trial, outcome)
            self.metrics.end(target.deployment, target.instance)
            self.load.add(target.deployment, -1)
            self.table.request_ended(target.nonce)

    async def _call(
        self, incoming: Incoming, body: bytes | Upload, target: Target
    ) -> web.StreamResponse:
        """One call to an engine; with traces on, in a span whose context the engine gets
        as ``traceparent`` (tracing.py)."""
        settle = incoming.waiting.settle if incoming.waiting is not None else None
        args = (self.session, incoming.request, body, target, incoming.path, incoming.query)
        strip = self.keys is not None
        if not self.tracing.enabled:
            return await forward(*args, incoming.meter, strip_keys=strip, settle=settle)
        attrs = {"reconcile.deployment": target.deployment, "reconcile.instance": target.instance}
        with self.tracing.span("engine", {**attrs, "server.port": target.port}, client=True):
            answer = await forward(
                *args, incoming.meter, strip_keys=strip, settle=settle, inject=self.tracing.inject
            )
            status = answer.status
            self.tracing.note({"http.response.status_code": status}, failed=status >= 500)
            return answer

    def _judge_silence(self, target: Target, trial: bool) -> None:
        """A client gave up on an engine that had sent nothing: an upstream timeout for
        passive health when the engine answers no other request either (hung), no verdict
        when it does (a slow answer). One look per engine at a time."""
        health = self.table.health
        if target.nonce in self.judging:
            health.report(target, trial, None)
            return
        rec = next((r for r in self.table.records.values() if r.nonce == target.nonce), None)

        async def judge() -> None:
            why = None
            try:
                why = await readiness.silent(target.host, target.port, rec)
            finally:
                self.judging.pop(target.nonce, None)
                health.report(target, trial, why)

        self.judging[target.nonce] = asyncio.get_running_loop().create_task(judge())

    async def _wait(self, want: Ask) -> Target | None:
        pool = want.pool
        # An instance free now (the common case) is taken without waiting's bookkeeping:
        # the deadline's walk over the records, the waiting count, the wait's coroutine.
        found = self.table.target(pool, session=want.session, prefix=want.prefix)
        if found is not None:
            return found
        deadline = self.table.deadline(pool)
        if want.wait is not None:
            deadline = min(deadline, want.wait)  # then its fallbacks (fallbackAfter)
        self.waiting[pool] += 1
        try:
            return await self.table.wait_target(
                pool, deadline, lambda: self._watch(pool, deadline), want.session, want.prefix
            )
        finally:
            self.waiting[pool] -= 1
            if self.waiting[pool] <= 0:
                del self.waiting[pool]

    def _watch(self, pool: str, deadline: float) -> None:
        """Probe the pool's Starting engines ourselves while requests wait (readiness.py
        says why)."""
        for rec in self.table.starting(pool):
            running = self.watching.get(rec.name)
            if running is not None and running[0] == rec.nonce and not running[1].done():
                continue
            task = asyncio.get_running_loop().create_task(self._probe(pool, rec, deadline))
            self.watching[rec.name] = (rec.nonce, task)

    async def _probe(self, pool: str, rec: Record, deadline: float) -> None:
        def wanted() -> bool:
            current = self.table.records.get(rec.name)
            if current is None or current.phase is not Phase.STARTING:
                return False
            return current.nonce == rec.nonce and self.waiting[pool] > 0

        try:
            if not await asyncio.wait_for(readiness.watch(rec, wanted), deadline):
                return
        except TimeoutError:
            return
        self.table.probed_ready(rec.nonce)
        self.demand.request_pass()  # the daemon records it Ready by the same probe

    async def _parsed(
        self, request: web.Request
    ) -> tuple[bytes | Upload, dict[str, Any], str | None] | web.Response:
        """The body (bytes, or a multipart upload to stream), its JSON fields and its model."""
        mark = upload.boundary(request.headers.get("Content-Type", ""))
        if mark is not None:
            return await self._upload(request, mark)
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        fields = _fields(body)  # parsed once: the model, and the session's `user`
        return body, fields, _model(fields)

    async def _upload(
        self, request: web.Request, mark: bytes
    ) -> tuple[Upload, dict[str, Any], str] | web.Response:
        """A multipart form: read up to its ``model`` field, the rest is streamed on."""
        if request.content_length is not None and request.content_length > self.max_body:
            return _too_large(self.max_body)
        coding = request.headers.get("Content-Encoding", "").strip().lower()
        if coding not in ("", "identity"):
            why = "a multipart upload is streamed as sent: send it without Content-Encoding"
            return error(415, why, "unsupported_content_encoding")
        try:
            async with asyncio.timeout(BODY_TIMEOUT):
                head, found = await upload.read_head(request.content, mark)
        except TimeoutError:
            why = f"the request body did not arrive within {BODY_TIMEOUT:g} seconds"
            return _closing(error(408, why, "request_timeout"))
        if found.model is None:
            why = (
                "the multipart form must have a field `model` before the file "
                f"(within its first {upload.SCAN_MAX} bytes)"
            )
            return _closing(error(400, why, "invalid_request"))
        body = Upload(head, request.content, request.content_length, self.max_body)
        return body, {}, found.model

    async def _body(self, request: web.Request) -> bytes | web.Response:
        """The plain body (Content-Encoding undone, encoding.py), or the error to answer."""
        if request.content_length is not None and request.content_length > self.max_body:
            return _too_large(self.max_body)
        try:
            if request.content.is_eof():  # received whole: read() cannot wait
                raw = await request.read()
            else:
                async with asyncio.timeout(BODY_TIMEOUT):
                    raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _too_large(self.max_body)
        except TimeoutError:
            why = f"the request body did not arrive within {BODY_TIMEOUT:g} seconds"
            return _closing(error(408, why, "request_timeout"))
        plain = encoding.decode(raw, request.headers.get("Content-Encoding"), self.max_body)
        if isinstance(plain, encoding.BodyRefused):
            return error(plain.status, plain.message, plain.code)
        return plain


@dataclass(frozen=True, slots=True)
class Ask:
    """What a request asks for: a pool (its routable name), the label limits and metrics
    count it under, its session key (affinity), if any, and its prompt's chained block
    hashes (prefix affinity)."""

    pool: str
    label: str
    session: str | None
    prefix: tuple[bytes, ...] = ()
    wait: float | None = None  # the longest wait for a Ready instance (fallbackAfter)


@dataclass
class Incoming:
    """A request to forward and the one path (normalised) and query it goes on with."""

    request: web.Request
    path: str
    query: str
    meter: Meter  # its timings and token counts (usage.py)
    waiting: Waiting | None = None  # a held stream's comments (waiting.py)
    no_instance: bool = False  # the pool had no instance to take it (a fallback may)


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


# A client sends the same Host on every request: its verdict (an IP parse and a URL split,
# 1.8% of a profile at 32 clients) is kept, for this many Host values at most.
_host_refusal = functools.lru_cache(maxsize=256)(host_refusal)


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


def _fields(body: bytes) -> dict[str, Any]:
    """The body's JSON object ({} for anything else: no model, so a 400)."""
    try:
        value: Any = json.loads(body)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _session(request: web.Request, fields: dict[str, Any]) -> str | None:
    """The session key: the ``x-session-id`` header, else the OpenAI ``user`` field."""
    header = request.headers.get(SESSION_HEADER)
    if header:
        return header[:SESSION_MAX]
    user = fields.get("user")
    return user[:SESSION_MAX] if isinstance(user, str) and user else None


def _model(fields: dict[str, Any]) -> str | None:
    model = fields.get("model")
    return model if isinstance(model, str) and model else None
