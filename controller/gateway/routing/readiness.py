"""The gateway's own look at an engine: a starting one that a request is waiting for
(``ReadyWaits``: the wait, and the probes while any waits), and a silent one a client
gave up on (``silent``).

The daemon probes a Starting engine every ``periodSeconds`` and records it Ready;
a request waiting for it would pay up to a whole period on top of the engine's
start. While requests wait, the gateway runs the record's own probe every
``POLL`` seconds: the moment it passes, the table routes to that engine and the
daemon is asked for a pass (which records it Ready by the same probe).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable

from controller.core.engines.apikey import document_key
from controller.core.state import Phase, ProbeConfig, Record
from controller.gateway.routing.table import Table, Target
from controller.host import probes

# Seconds a silent engine gets to answer any HTTP request (a liveness probe's default).
SILENT_TIMEOUT = 5.0
POLL = 0.01  # seconds between probes while a request waits (loopback: cheap)
FAST_FOR = 5.0  # seconds of POLL; then SLOW_POLL (most engines start within that or take minutes)
SLOW_POLL = 0.1


async def passes(rec: Record) -> bool:
    """The record's readiness probe, once: the daemon's own (same checks, same verdict)."""
    assert rec.port is not None
    # The key its spec document gives (args, env): one from envFrom or a key file is the
    # daemon's alone, whose own probe then records it Ready (core/engines/apikey.py).
    key = document_key(rec.stored_spec)
    target = probes.ProbeTarget(host=rec.host, port=rec.port, config=rec.probe, bearer=key)
    return (await asyncio.to_thread(probes.probe, target)).ready


async def watch(rec: Record, wanted: Callable[[], bool]) -> bool:
    """True once ``rec``'s engine passes its probe; False when no longer ``wanted`` (the
    daemon judged it first, or no request waits). The caller bounds the wait."""
    started = time.monotonic()
    while wanted():
        if await passes(rec):
            return True
        # An engine that loads for minutes is not asked 100 times a second all along.
        await asyncio.sleep(POLL if time.monotonic() - started < FAST_FOR else SLOW_POLL)
    return False


class ReadyWaits:
    """Requests held for a Ready instance of their pool while it cold-starts, and the
    gateway's own probes of the pool's Starting engines while any request waits."""

    def __init__(self, table: Table, request_pass: Callable[[], None]) -> None:
        self._table = table
        self._request_pass = request_pass  # the daemon's pass (it records Ready itself)
        # record name -> (its Starting engine's nonce, the gateway's probe of it)
        self._watching: dict[str, tuple[str | None, asyncio.Task[None]]] = {}
        self._waiting: Counter[str] = Counter()  # pool name -> requests waiting

    def tasks(self) -> list[asyncio.Task[None]]:
        """The probes (the gateway cancels what is left of them when it closes)."""
        return [task for _, task in self._watching.values()]

    async def target(
        self,
        pool: str,
        session: str | None,
        prefix: tuple[bytes, ...],
        wait: float | None,
        on_change: Callable[[], None] | None = None,
    ) -> Target | None:
        """A Ready instance of ``pool``, waited for up to its deadline (``wait`` at most,
        when it has fallbacks: fallbackAfter); None when none came. ``on_change`` runs at
        each look while it waits (the table changed: activation.Rewake)."""
        # An instance free now (the common case) is taken without waiting's bookkeeping:
        # the deadline's walk over the records, the waiting count, the wait's coroutine.
        found = self._table.target(pool, session=session, prefix=prefix)
        if found is not None:
            return found
        deadline = self._table.deadline(pool)
        if wait is not None:
            deadline = min(deadline, wait)  # then its fallbacks (fallbackAfter)
        self._waiting[pool] += 1
        try:

            def looked() -> None:
                self._watch(pool, deadline)
                if on_change is not None:
                    on_change()

            return await self._table.wait_target(pool, deadline, looked, session, prefix)
        finally:
            self._waiting[pool] -= 1
            if self._waiting[pool] <= 0:
                del self._waiting[pool]

    def _watch(self, pool: str, deadline: float) -> None:
        """Probe the pool's Starting engines ourselves while requests wait (the module's
        docstring says why)."""
        for rec in self._table.starting(pool):
            running = self._watching.get(rec.name)
            if running is not None and running[0] == rec.nonce and not running[1].done():
                continue
            task = asyncio.get_running_loop().create_task(self._probe(pool, rec, deadline))
            self._watching[rec.name] = (rec.nonce, task)

    async def _probe(self, pool: str, rec: Record, deadline: float) -> None:
        def wanted() -> bool:
            current = self._table.records.get(rec.name)
            if current is None or current.phase is not Phase.STARTING:
                return False
            return current.nonce == rec.nonce and self._waiting[pool] > 0

        try:
            if not await asyncio.wait_for(watch(rec, wanted), deadline):
                return
        except TimeoutError:
            return
        self._table.probed_ready(rec.nonce)
        self._request_pass()  # the daemon records it Ready by the same probe


async def silent(
    host: str, port: int, rec: Record | None, timeout: float = SILENT_TIMEOUT
) -> str | None:
    """Why the engine looks hung, or None when it answers HTTP (any status) at once.

    A client gave up on it before a byte of its answer: a hung engine (SIGSTOP'd: the
    kernel still accepts) or a slow answer (a long completion sends nothing until it is
    done). A slow engine still answers another request, so a quick GET tells them apart:
    its record's probe path (``/`` without one), any status. A TCP probe could not tell:
    a stopped process's port still accepts.
    """
    path = next((p for config in _configs(rec) for p, _ in config.http), "/")
    try:
        await asyncio.to_thread(
            probes.request, probes.connect_host(host), port, "GET", path, timeout
        )
    except TimeoutError:
        return f"no answer within {timeout:g}s, nor to GET {path}"
    except OSError as exc:
        return f"no answer, and GET {path} failed: {type(exc).__name__}"
    return None


def _configs(rec: Record | None) -> tuple[ProbeConfig, ...]:
    if rec is None:
        return ()
    return (rec.liveness, rec.probe) if rec.liveness is not None else (rec.probe,)
