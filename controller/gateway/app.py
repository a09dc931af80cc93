"""The gateway: an aiohttp server on its own thread and event loop, beside the daemon.

The daemon wires it by injection (it never imports this package): ``start`` with a
callback that asks for a pass, ``after_pass`` after every pass (the records to
route by), ``reload`` on SIGHUP (the key file), ``stop`` at the end. A gateway
fault never stops a pass (``after_pass`` only schedules), and a pass never blocks
the gateway (its loop runs on its own thread).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

from controller.errors import ConfigError
from controller.gateway import keys as keys_mod
from controller.gateway.activation import Demand
from controller.gateway.limits import Limiter
from controller.gateway.metrics import GatewayMetrics
from controller.gateway.quiet import Throttle, install
from controller.gateway.routes import Front
from controller.gateway.routing import Table
from controller.gateway.server import Connections, connection_cap, exception_handler, factory
from controller.gateway.settings import Settings
from controller.logsetup import get_logger

if TYPE_CHECKING:
    from controller.core.state import Record
    from controller.reconciler.run import PassResult

log = get_logger("reconcile")

START_WAIT = 10.0
BACKLOG = 128  # aiohttp's default


class Gateway:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.keys = keys_mod.load(settings.api_keys) if settings.api_keys else None
        self.metrics = GatewayMetrics()
        self.loop = asyncio.new_event_loop()
        self.front: Front | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._failed: BaseException | None = None
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # -- the daemon's side (its thread) -------------------------------------------------

    def start(self, request_pass: Callable[[], None]) -> None:
        """Bind and serve on a thread of its own; a bind failure is a ConfigError here."""
        self._thread = threading.Thread(
            target=self._run, args=(request_pass,), name="gateway", daemon=True
        )
        self._thread.start()
        if not self._started.wait(START_WAIT):
            raise ConfigError("the gateway did not start in time")
        if self._failed is not None:
            where = f"{self.settings.host}:{self.settings.port}"
            raise ConfigError(f"--listen {where}: cannot serve: {self._failed}")
        log.info(
            "gateway listening",
            address=f"{self.settings.host}:{self.settings.port}",
            api_keys=len(self.keys.digests) if self.keys else 0,
        )

    def after_pass(self, result: PassResult, seconds: float) -> None:
        records = result.ours()
        front = self.front
        if front is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(front.table.update, records)

    def drain(self, old: Record, new: Record | None) -> None:
        """The daemon's teardown thread, before it stops ``old``: route nothing more to it
        (to ``new`` if given: a RollingUpdate) and return once its requests ended, or
        after its grace period (then the teardown's signal cuts them off)."""
        front = self.front
        if front is None or self.loop.is_closed():
            return
        grace = old.grace_seconds
        done = asyncio.run_coroutine_threadsafe(front.table.retire(old, new, grace), self.loop)
        done.result(timeout=grace + START_WAIT)

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

    def stop(self) -> None:
        if self._thread is None or self.loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)

    def metrics_text(self) -> str:
        return self.metrics.render()

    # -- the gateway's thread -------------------------------------------------------------

    def _run(self, request_pass: Callable[[], None]) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._open(request_pass))
        except BaseException as exc:
            self._failed = exc
            self._started.set()
            return
        self._started.set()
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    async def _open(self, request_pass: Callable[[], None]) -> None:
        s = self.settings
        demand = Demand(s.state_dir, request_pass)
        limiter = Limiter(
            max_inflight=s.max_inflight, max_queue=s.max_queue, queue_wait=s.queue_wait
        )
        install()  # before the first connection: no line of the HTTP library unfiltered
        self.loop.set_exception_handler(exception_handler(Throttle()))
        connections = Connections(connection_cap())
        # As many engine connections as client ones: together they stay under the fd limit.
        connector = aiohttp.TCPConnector(limit=connections.cap, ttl_dns_cache=300)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5)
        session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)
        self.front = Front(
            table=Table(),
            demand=demand,
            limiter=limiter,
            metrics=self.metrics,
            max_body=s.max_body,
            keys=self.keys,
            session=session,
        )
        # handler_cancellation: a client that goes away cancels its handler (and upstream).
        self._runner = web.AppRunner(self.front.app(), handler_cancellation=True, access_log=None)
        await self._runner.setup()
        assert self._runner.server is not None
        protocols = factory(self._runner.server, self.loop, connections)
        try:
            self._listener = await self.loop.create_server(
                protocols, s.host, s.port, reuse_address=True, backlog=BACKLOG
            )
        except BaseException:
            await self._runner.cleanup()
            await session.close()
            raise
        self._tasks.append(asyncio.create_task(demand.run()))

    async def _close(self) -> None:
        watching = [task for _, task in self.front.watching.values()] if self.front else []
        for task in [*self._tasks, *watching]:
            task.cancel()
        if self._listener is not None:
            self._listener.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self.front is not None:
            await self.front.session.close()
