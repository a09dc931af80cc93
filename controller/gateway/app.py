"""The gateway: an aiohttp server on its own thread and event loop.

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
import socket
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp
from aiohttp import web

from controller.errors import ConfigError
from controller.gateway import enginesock
from controller.gateway import keys as keys_mod
from controller.gateway.activation import Demand
from controller.gateway.ejections import recorder
from controller.gateway.fastloop import new_loop
from controller.gateway.health import Health
from controller.gateway.limits import Bodies, Limiter
from controller.gateway.listener import bind, close_listener
from controller.gateway.metrics import GatewayMetrics
from controller.gateway.quiet import Throttle, install
from controller.gateway.routes import Front
from controller.gateway.routing import Table
from controller.gateway.server import Connections, connection_cap, exception_handler, factory
from controller.gateway.settings import Settings
from controller.gateway.ui.pages import Page
from controller.gateway.webhook import Hooks
from controller.logsetup import get_logger

log = get_logger("reconcile")

START_WAIT = 10.0
CUT_WAIT = 1.0  # seconds the runner's shutdown gives what is left once the drain is over
BACKLOG = 128  # aiohttp's default


class Gateway:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.keys = keys_mod.load(settings.api_keys) if settings.api_keys else None
        self.metrics = GatewayMetrics()
        self.loop = new_loop()  # uvloop's when installed (fastloop.py)
        self.front: Front | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._failed: BaseException | None = None
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._connections: Connections | None = None

    # -- the daemon's side (its thread) -------------------------------------------------

    def start(self, request_pass: Callable[[], None], sock: socket.socket | None = None) -> None:
        """Serve on a thread of its own, on ``sock`` (a listening socket handed over) or a
        socket bound here; a bind failure is a ConfigError here."""
        self._thread = threading.Thread(
            target=self._run, args=(request_pass, sock), name="gateway", daemon=True
        )
        self._thread.start()
        if not self._started.wait(START_WAIT):
            raise ConfigError("the gateway did not start in time")
        if self._failed is not None:
            where = f"{self.settings.host}:{self.settings.port}"
            raise ConfigError(f"--listen {where}: cannot serve: {self._failed}")

    def reload(self) -> None:
        """SIGHUP: re-read the key file; a bad one keeps the keys in force."""
        if self.settings.api_keys is None:
            return
        try:
            fresh = keys_mod.load(self.settings.api_keys)
        except keys_mod.KeyFileError as exc:
            log.error("API keys not reloaded; keeping the old ones", error=str(exc))
            return
        self.keys = fresh
        if self.front is not None:
            self.front.keys = fresh
        log.info("API keys reloaded", keys=len(fresh.digests))

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

    def stop(self) -> None:
        """Stop accepting, let requests in flight finish (up to the settings' drain grace
        period), end."""
        if self._thread is None or self.loop.is_closed():
            return
        done = asyncio.run_coroutine_threadsafe(self._close(), self.loop)
        done.result(timeout=self.settings.drain_grace + START_WAIT)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=START_WAIT)

    def metrics_text(self) -> str:
        return self.metrics.render()

    # -- the gateway's thread -------------------------------------------------------------

    def _run(self, request_pass: Callable[[], None], sock: socket.socket | None) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._open(request_pass, sock))
        except BaseException as exc:
            self._failed = exc
            self._started.set()
            return
        self._started.set()
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    async def _open(self, request_pass: Callable[[], None], sock: socket.socket | None) -> None:
        s = self.settings
        demand = Demand(s.state_dir, request_pass)
        limiter = Limiter(
            max_inflight=s.max_inflight, max_queue=s.max_queue, queue_wait=s.queue_wait
        )
        install()  # before the first connection: no line of the HTTP library unfiltered
        self.loop.set_exception_handler(exception_handler(Throttle()))
        connections = self._connections = Connections(connection_cap())
        # As many engine connections as client ones: together they stay under the fd limit.
        connector = aiohttp.TCPConnector(
            limit=connections.cap, ttl_dns_cache=300, socket_factory=enginesock.engine_socket
        )
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=enginesock.CONNECT_TIMEOUT)
        session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)
        self.front = Front(
            table=Table(health=Health(notify=recorder(s.state_dir, self.metrics))),
            demand=demand,
            limiter=limiter,
            metrics=self.metrics,
            max_body=s.max_body,
            bodies=Bodies(total=max(s.max_body_total, s.max_body), wait=s.queue_wait),
            keys=self.keys,
            loopback_only=s.loopback,
            session=session,
        )
        # handler_cancellation: a client that goes away cancels its handler (and upstream).
        app = self.front.app()
        Page(s, self.metrics, lambda: self.keys, request_pass).install(app)  # GET /ui
        Hooks(s.state_dir, request_pass).install(app)  # POST /hooks/git
        self._runner = web.AppRunner(
            app,
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=CUT_WAIT,  # the drain (_close) waited for the requests first
        )
        await self._runner.setup()
        assert self._runner.server is not None
        protocols = factory(self._runner.server, self.loop, connections)
        try:
            listening = sock if sock is not None else bind(s.host, s.port, BACKLOG)
            self._listener = await self.loop.create_server(protocols, sock=listening)
        except BaseException:
            await self._runner.cleanup()
            await session.close()
            raise
        self._tasks.append(asyncio.create_task(demand.run()))

    async def _stop_listening(self) -> None:
        if self._listener is not None:
            await close_listener(self._listener)

    async def _close(self) -> None:
        await self._stop_listening()
        if self.front is not None:
            self.front.draining = True  # each answer from now on says Connection: close
        # Connections end between requests only (server.Connections.drain): closing one the
        # kernel accepted whose request is not read yet would reset that request. The
        # heartbeat and the records watch run on meanwhile: an OnDemand request in flight
        # stays wanted, a drain is heard.
        if self._connections is not None:
            await self._connections.drain(self.settings.drain_grace)
        if self._runner is not None:
            await self._runner.cleanup()  # what is left past the grace is cut
        watching = [task for _, task in self.front.watching.values()] if self.front else []
        watching += list(self.front.judging.values()) if self.front else []
        for task in [*self._tasks, *watching]:
            task.cancel()
        for task in [*self._tasks, *watching]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.front is not None:
            await self.front.session.close()
