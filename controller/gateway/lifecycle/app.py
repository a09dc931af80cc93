"""The gateway: its HTTP server (http/server.py) on its own thread and event loop.

It runs in a gateway process of its own (``process.py``: records from the state dir,
the listening socket handed over between processes) and, for tests, in process:
``start`` with a callback that asks for a pass (and, in the process, the listening
socket to serve on), ``reload`` on SIGHUP (the key file), ``stop_accepting`` then
``stop(grace)``: requests in flight finish first. Its owner gives ``front.table`` the
records and the drains (on this loop: the process's records watch and retire asks).
A pass never blocks the gateway (its loop runs on its own thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import socket
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from controller.errors import ConfigError
from controller.gateway.accounting import keys as keys_mod
from controller.gateway.accounting import requestlog, tracing
from controller.gateway.accounting.metrics import GatewayMetrics
from controller.gateway.accounting.requestlog import RequestLog
from controller.gateway.http.quiet import Throttle, install
from controller.gateway.http.server import Connections, Server, connection_cap, exception_handler
from controller.gateway.http.upstream import Upstream
from controller.gateway.lifecycle.listener import Listening, bind, close_listener
from controller.gateway.lifecycle.tls import Tls, TlsError, as_named, named
from controller.gateway.lifecycle.tlsaccept import Acceptor
from controller.gateway.lifecycle.tlsdates import out_of_date, warn_crl_out_of_date
from controller.gateway.routing.activation import Demand
from controller.gateway.routing.concurrency import Bodies, Limiter
from controller.gateway.routing.ejections import recorder
from controller.gateway.routing.health import Health
from controller.gateway.routing.table import Table
from controller.gateway.settings import Settings
from controller.gateway.surface import enginesock
from controller.gateway.surface.forwarding import Forwarder
from controller.gateway.surface.routes import Front
from controller.gateway.surface.webhook import Hooks
from controller.gateway.ui.pages import Page
from controller.logsetup import get_logger
from controller.store.side import refused

log = get_logger("reconcile")

START_WAIT = 10.0
CUT_WAIT = 1.0  # seconds the handlers left once the drain is over get before they are cut
BACKLOG = 128  # connections the kernel holds for accept()
# The event loop: uvloop's (a plain dependency since issue 41: asyncio's own loop left the
# gateway at about half nginx's throughput), asyncio's own where it cannot be imported (a
# platform without a wheel). uvloop (libuv underneath, the loop uvicorn uses) cuts the
# loop's own cost per request; nothing in the gateway depends on which loop runs.
# ``RECONCILE_GATEWAY_LOOP=asyncio`` keeps asyncio's.
LOOP_ENV = "RECONCILE_GATEWAY_LOOP"


def new_loop() -> asyncio.AbstractEventLoop:
    if os.environ.get(LOOP_ENV, "").strip().lower() != "asyncio":
        try:
            uvloop = importlib.import_module("uvloop")
        except ImportError:
            pass
        else:
            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
            return loop
    return asyncio.new_event_loop()


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """``uvloop`` or ``asyncio``, for the start line."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


class Gateway:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.keys = keys_mod.load(settings.api_keys) if settings.api_keys else None
        self.tls = _tls(settings)
        self.metrics = GatewayMetrics(settings.node)
        self.tracing = tracing.from_env()  # no-op unless OTEL_* asks (and the extra is here)
        self.requests = RequestLog(
            requestlog.path_in(settings.state_dir),
            settings.log_max_bytes,
            settings.log_keep,
            self.metrics.dropped,
        )
        self.loop = new_loop()  # uvloop's when installed
        self.front: Front | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._failed: BaseException | None = None
        self._server: Server | None = None
        self._beside = contextlib.AsyncExitStack()  # Front.running(), while the server runs
        self._upstream: Upstream | None = None
        self._listener: Listening | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._connections: Connections | None = None

    # -- the daemon's side (its thread) -------------------------------------------------

    def start(
        self,
        request_pass: Callable[[], None],
        sock: socket.socket | None = None,
        *,
        serving: bool = True,
    ) -> None:
        """Serve on a thread of its own, on ``sock`` (a listening socket handed over) or a
        socket bound here; a bind failure is a ConfigError here. ``serving=False``: ready,
        not accepting until ``serve`` (a gateway that must be registered first)."""
        self._thread = threading.Thread(
            target=self._run, args=(request_pass, sock, serving), name="gateway", daemon=True
        )
        self._thread.start()
        if not self._started.wait(START_WAIT):
            raise ConfigError(f"the gateway's server did not start within {START_WAIT:g}s")
        if self._failed is not None:
            where = f"{self.settings.host}:{self.settings.port}"
            raise ConfigError(f"--listen {where}: cannot serve: {self._failed}")

    def serve(self) -> None:
        """Begin accepting (after ``start(serving=False)``)."""
        if self._listener is not None:
            listener = self._listener
            asyncio.run_coroutine_threadsafe(listener.start_serving(), self.loop).result(
                timeout=START_WAIT
            )

    def reload(self) -> dict[str, str | None]:
        """SIGHUP: re-read the key file and the TLS pair; a bad one keeps what is in force.
        Each one's outcome (``refused``'s subjects): None when taken, else why not."""
        outcome: dict[str, str | None] = {}
        if self.tls is not None:
            outcome[refused.TLS_PAIR] = self._reload_tls(self.tls)
        if self.settings.api_keys is not None:
            outcome[refused.API_KEYS] = self._reload_keys(self.settings.api_keys)
        return outcome

    def _reload_keys(self, path: Path) -> str | None:
        try:
            fresh = keys_mod.load(path)
        except keys_mod.KeyFileError as exc:
            log.error("API keys not reloaded; keeping the old ones", error=str(exc))
            return str(exc)
        self.keys = fresh
        if self.front is not None:
            self.front.keys = fresh
        log.info("API keys reloaded", keys=len(fresh.digests))
        return None

    def _reload_tls(self, tls: Tls) -> str | None:
        """The pair read here (not on the loop: no handshake waits for the files), put in
        force on the loop, where handshakes read it."""
        try:
            context = tls.fresh()
        except TlsError as refused:
            exc = as_named(refused, self.settings)  # node.yaml's pair: named as its fields
            log.error("TLS certificate not reloaded; keeping the one in force", error=str(exc))
            return str(exc)
        if self._thread is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(tls.use, context)
        else:
            tls.use(context)
        log.info("TLS certificate reloaded", cert=str(tls.cert))
        dated = out_of_date(tls.cert, tls.key)
        if dated:
            log.warning("TLS certificate out of date", detail=named(dated, self.settings))
        if tls.client_ca is not None:
            warn_crl_out_of_date(tls.client_ca)
        return None

    def listener_fd(self) -> int | None:
        """The listening socket's descriptor (to hand over), None once it is closed."""
        listener = self._listener
        if listener is None or not listener.sockets:
            return None
        fd = listener.sockets[0].fileno()
        return fd if fd >= 0 else None

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` on the gateway's loop until ``stop`` (the records watch...)."""

        def create() -> None:
            self._tasks.append(self.loop.create_task(work))

        self.loop.call_soon_threadsafe(create)

    def stop_accepting(self) -> None:
        """Close our listening descriptor: no new connection here (a successor holding the
        same socket keeps accepting); connections already open are served on."""
        if self._thread is None or self.loop.is_closed():
            return
        done = asyncio.run_coroutine_threadsafe(self._stop_listening(), self.loop)
        done.result(timeout=START_WAIT)

    def stop(self, why: str = "stopping") -> None:
        """Stop accepting, let requests in flight finish (up to the settings' drain grace
        period), end. ``why``: what a request still waiting for an engine is told."""
        closing = self.begin_stop(why, self.settings.drain_grace)
        if closing is not None:
            closing.result(timeout=self.settings.drain_grace + START_WAIT)
            self.end_stop()

    def begin_stop(self, why: str, grace: float | None) -> Future[None] | None:
        """``stop``'s first half: the drain, on the loop, for up to ``grace`` s (None: as
        long as requests are in flight, until ``bound_drain``); done when it is."""
        if self._thread is None or self.loop.is_closed():
            return None
        return asyncio.run_coroutine_threadsafe(self._close(why, grace), self.loop)

    def bound_drain(self, grace: float) -> None:
        """Any thread: a drain begun without a deadline ends ``grace`` s from now at most."""
        if self._connections is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._connections.bound, grace)

    def end_stop(self) -> None:
        """``stop``'s second half, once the drain is done: the loop and its thread end."""
        if self._thread is None or self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=START_WAIT)
        self.requests.close()  # after the last request: its line is written too
        self.tracing.close()  # ... and its span sent

    def metrics_text(self) -> str:
        return self.metrics.render()

    # -- the gateway's thread -------------------------------------------------------------

    def _run(
        self, request_pass: Callable[[], None], sock: socket.socket | None, serving: bool
    ) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            # In the try too: a writer thread the host refuses ("can't start new thread" at
            # its thread limit) left start() waiting out START_WAIT, then said "did not start".
            self.requests.start()
            self.loop.run_until_complete(self._open(request_pass, sock, serving))
        except BaseException as exc:
            self._failed = exc
            self._started.set()
            return
        self._started.set()
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    async def _open(
        self, request_pass: Callable[[], None], sock: socket.socket | None, serving: bool
    ) -> None:
        s = self.settings
        demand = Demand(s.state_dir, request_pass)
        limiter = Limiter(
            max_inflight=s.max_inflight, max_queue=s.max_queue, queue_wait=s.queue_wait
        )
        install()  # before the first connection: no line of the HTTP library unfiltered
        self.loop.set_exception_handler(exception_handler(Throttle()))
        connections = self._connections = Connections(connection_cap())
        # The requests' own path to the engines (http/upstream.py says why not aiohttp's
        # client), and a client of the looks off that path (/metrics) beside it: a read is
        # never held behind requests that took every connection. As many engine connections
        # as client ones each: together they stay under the fd limit.
        self._upstream = upstream = _engine_client(connections.cap)
        looks = _engine_client(connections.cap)
        table = Table(health=Health(notify=recorder(s.state_dir, self.metrics)))
        self.metrics.known = lambda: table.instances  # idle instances read 0 in flight
        forwarder = Forwarder(
            table=table,
            demand=demand,
            limiter=limiter,
            metrics=self.metrics,
            upstream=upstream,
            strip_keys=self.keys is not None,
            tracing=self.tracing,
        )
        self.front = Front(
            table=table,
            metrics=self.metrics,
            max_body=s.max_body,
            bodies=bodies_room(s),
            forwarder=forwarder,
            state_dir=s.state_dir,
            keys=self.keys,
            loopback_only=s.loopback,
            looks=looks,
            requests=self.requests,
            waiting_every=s.waiting_comment,
            tracing=self.tracing,
        )
        front = self.front
        Page(s, self.metrics, lambda: self.keys, request_pass).install(front.routes, front.beside)
        Hooks(s.state_dir, request_pass).install(front.routes)  # POST /hooks/git
        self._server = server = Server(front.handle, connections, s.max_body)
        try:
            for running in front.running():
                await self._beside.enter_async_context(contextlib.asynccontextmanager(running)())
            listening = sock if sock is not None else bind(s.host, s.port, BACKLOG)
            if self.tls is None:
                self._listener = await self.loop.create_server(
                    server.protocol, sock=listening, start_serving=serving
                )
            else:  # accepted by us: a plain-HTTP request gets its 400 (tlsaccept.py)
                tls = self.tls  # its context is asked at each handshake: SIGHUP replaces it
                acceptor = Acceptor(
                    listening, server.protocol, lambda: tls.context, connections, server.throttle
                )
                if serving:
                    acceptor.start()
                self._listener = acceptor
        except BaseException:
            await self._beside.aclose()
            await looks.close()
            await upstream.close()
            raise
        self._tasks.append(asyncio.create_task(demand.run()))

    async def _stop_listening(self) -> None:
        if self._listener is not None:
            await close_listener(self._listener)

    async def _close(self, why: str, grace: float | None) -> None:
        await self._stop_listening()
        if self._server is not None:
            self._server.draining = True  # each answer from now on says Connection: close
        if self.front is not None:
            # A request waiting for an engine to get Ready is answered now (503, retry):
            # held, it would be cut at the drain's deadline with no answer at all.
            self.front.table.close(why)
        # Connections end between requests only (server.Connections.drain): closing one the
        # kernel accepted whose request is not read yet would reset that request. The
        # heartbeat and the records watch run on meanwhile: an OnDemand request in flight
        # stays wanted, a drain is heard.
        if self._connections is not None:
            await self._connections.drain(grace)
        if self._server is not None:  # what is left past the grace is cut, saying why
            cut = f"this gateway process is stopping ({why}) and its drain ran out; retry"
            await self._server.cut(CUT_WAIT, cut)
        await self._beside.aclose()
        probes = self.front.forwarder.tasks() if self.front else []
        for task in [*self._tasks, *probes]:
            task.cancel()
        for task in [*self._tasks, *probes]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.front is not None:
            await self.front.looks.close()
        if self._upstream is not None:
            await self._upstream.close()


def bodies_room(settings: Settings) -> Bodies:
    """The room for request bodies: ``--max-body-total`` (never below ``--max-body``), of
    which an API key holds at most half (one body of ``--max-body`` at least). Without
    keys the gateway is on loopback, its clients one host's and told apart by nothing."""
    total = max(settings.max_body_total, settings.max_body)
    share = max(total // 2, settings.max_body) if settings.api_keys is not None else None
    return Bodies(total=total, wait=settings.queue_wait, share=share)


def _engine_client(limit: int) -> Upstream:
    return Upstream(
        limit=limit,
        connect_timeout=enginesock.CONNECT_TIMEOUT,
        socket_factory=enginesock.engine_socket,
    )


def _tls(settings: Settings) -> Tls | None:
    """The TLS pair the settings name (checked: TlsError), or None for plain HTTP."""
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    return Tls(settings.tls_cert, settings.tls_key, settings.tls_client_ca)
