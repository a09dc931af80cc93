"""Hung engines, told apart from slow ones while their requests wait, not after.

A SIGSTOP'd engine (or one whose HTTP server froze) still accepts connections (the
kernel does) and never answers: its requests would each wait for their client's timeout.
A slow engine (a long prefill, a non-streamed completion) sends nothing for as long,
and must keep its requests. The difference is whether it answers anything else: so once
a request has waited ``HEAD_WAIT`` seconds for its answer's head (not a byte yet), the
gateway looks at the engine itself (``readiness.silent``: its probe path, any status,
within ``LOOK_TIMEOUT``), and again every ``LOOK_EVERY`` while any request still waits.
An engine that answers the look is slow and keeps every request; one that does not is
hung: passive health ejects it at once (``Health.hung``), and each of its requests that
has no head yet, whose body can be sent again, and whose pool has another instance to
take it (or a fallback: the pool is then all ejected, which DESIGN sends to its fallback)
is cancelled with
``Awaited.hung`` set, which the forwarder turns into a retry there (nothing came back,
so nothing is repeated to the client). One with nowhere else to go waits on: an engine
wrongly judged still answers it, and a hung one costs it no more than before (its
client's timeout, or the liveness probe's restart).
A request whose head came is never cut here: slow tokens are the engine's business.

Only an engine seen answering a look while it computes is judged by one. vLLM, SGLang,
llama.cpp, TGI and Ollama answer their probe path while busy; a single-threaded server
(a ``command`` engine on Python's ``http.server``, a blocking ``async def``) answers
nothing until its request is done: judged by the look alone, it was ejected ~3 s into
any long request (with replicas the request was computed twice; alone, its pool answered
503 until its trial). So the first look an engine answers while a request waits teaches
the gateway (``Health.answered_busy``, forgotten with the engine's nonce), once that
request is seen still waiting a round (``LOOK_EVERY``) later: a single-threaded engine
answers a look only after it wrote its answer, whose head the event loop may read a
moment after the look's. An engine never seen so keeps the slower paths (three failures
in a row, its liveness probe). No other evidence is at hand: the daemon's liveness
probe runs in another process and records only failures, and the gateway probes only
Starting engines.

Envoy's outlier detection ejects on consecutive gateway failures (timeouts included)
and nginx's ``max_fails``/``fail_timeout`` on failed attempts; both need the requests to
fail first, each after a timeout long enough for the slowest answer. The look needs
none: a few seconds after the first request waited, the engine is judged.

One look per engine at a time, and one sweep timer for all requests (every ``SWEEP``
seconds while any request waits for a head, none while idle): a request only notes its
time and its engine in a dict (a timer per request, armed and cancelled, measured 4 µs
on uvloop and more on asyncio here, against the gateway's ~100-200 µs in all). The request path
touches no disk and takes no lock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from controller.core.state import Record
from controller.gateway.routing import readiness
from controller.gateway.routing.health import Health
from controller.gateway.routing.table import Target

HEAD_WAIT = 1.0  # seconds a request waits for its answer's head before the engine is looked at
LOOK_TIMEOUT = 2.0  # seconds the look waits for any answer (loopback: an alive engine is quick)
LOOK_EVERY = 2.0  # seconds between looks while a request still waits for its head
SWEEP = 0.25  # seconds between the sweeps for overdue requests (HEAD_WAIT's precision)


class Awaited:
    """A request sent to an engine whose answer's head has not come."""

    __slots__ = ("hung", "movable", "overdue", "pool", "since", "target", "task")

    def __init__(
        self,
        target: Target,
        pool: str,
        movable: Callable[[], bool],
        task: asyncio.Task[object] | None,
        since: float,
    ) -> None:
        self.target = target
        self.pool = pool  # the name it was routed by: where else it may go
        self.movable = movable  # its body can be sent again (a streamed upload begun cannot)
        self.task = task
        self.since = since  # the loop's clock when it was sent
        self.overdue = False  # HEAD_WAIT passed with no head
        self.hung: str | None = None  # why the engine was judged hung (the request cancelled)


class Hangs:
    """The requests waiting for a head, per engine, and the looks at engines they wait on."""

    def __init__(
        self,
        health: Health,
        record_of: Callable[[str | None], Record | None],
        elsewhere: Callable[[str, str | None], bool],
    ) -> None:
        self._health = health
        self._record_of = record_of  # the engine's record (its probe path), by nonce
        self._elsewhere = elsewhere  # (pool, nonce): another instance may take a request now
        self._awaited: dict[str | None, dict[Awaited, None]] = {}
        self._looking: dict[str | None, asyncio.Task[None]] = {}
        self._sweep: asyncio.TimerHandle | None = None  # armed while any request waits
        self.head_wait = HEAD_WAIT

    def tasks(self) -> list[asyncio.Task[None]]:
        """The looks in progress (the gateway cancels what is left of them when it closes)."""
        return list(self._looking.values())

    def sent(self, target: Target, pool: str, movable: Callable[[], bool]) -> Awaited:
        """A request for ``pool`` goes to ``target`` now (call from the task that awaits
        its answer)."""
        loop = asyncio.get_running_loop()
        awaited = Awaited(target, pool, movable, asyncio.current_task(), loop.time())
        self._awaited.setdefault(target.nonce, {})[awaited] = None
        if self._sweep is None:
            self._sweep = loop.call_later(SWEEP, self._swept)
        return awaited

    def answered(self, awaited: Awaited) -> None:
        """Its head came, or it ended however it did: no longer watched (idempotent)."""
        nonce = awaited.target.nonce
        waiting = self._awaited.get(nonce)
        if waiting is not None:
            waiting.pop(awaited, None)
            if not waiting:
                del self._awaited[nonce]

    def _swept(self) -> None:
        """Each request past ``HEAD_WAIT`` with no head is overdue: look at its engine
        (unless a look runs). Armed again while any request waits; idle, it stops."""
        self._sweep = None
        loop = asyncio.get_running_loop()
        due = loop.time() - self.head_wait
        for nonce, waiting in self._awaited.items():
            for awaited in waiting:
                if awaited.overdue or awaited.since > due:
                    continue
                awaited.overdue = True
                if nonce not in self._looking:
                    self._looking[nonce] = loop.create_task(self._look(awaited.target))
        if self._awaited:
            self._sweep = loop.call_later(SWEEP, self._swept)

    def _waits(self, nonce: str | None) -> bool:
        """A request to the engine has waited past ``HEAD_WAIT`` and still waits."""
        return any(a.overdue for a in self._awaited.get(nonce, ()))

    def _still(self, nonce: str | None, seen: list[Awaited]) -> list[Awaited]:
        """Those of ``seen`` that still wait for their head."""
        waiting = self._awaited.get(nonce, {})
        return [a for a in seen if a in waiting]

    async def _look(self, target: Target) -> None:
        """Look at the engine while any of its requests is overdue: one that answered a
        look while busy and now answers none is hung (act); one that answers while a
        request waits, and that request still waits a round later, answers while busy."""
        nonce = target.nonce
        try:
            while self._waits(nonce):
                sent = [a for a in self._awaited.get(nonce, ()) if a.overdue]
                rec = self._record_of(nonce)
                why = await readiness.silent(target.host, target.port, rec, LOOK_TIMEOUT)
                witnesses = self._still(nonce, sent) if why is None else []
                if why is not None and self._health.answers_busy(nonce):
                    self._hung(target, why)  # those left wait on: looked at again
                await asyncio.sleep(LOOK_EVERY)
                if self._still(nonce, witnesses):
                    self._health.answered_busy(nonce)
        finally:
            self._looking.pop(nonce, None)

    def _hung(self, target: Target, why: str) -> None:
        """Eject the engine; each request of it with no head yet that another instance
        can take is cancelled to be sent there (the forwarder reads ``hung``)."""
        said = f"no answer's head within {self.head_wait:g}s, and {why}"
        self._health.hung(target, said)  # first: the instances left are those admitted
        waiting = self._awaited.get(target.nonce, {})
        for awaited in list(waiting):
            if awaited.task is None or not awaited.movable():
                continue  # its upload cannot be sent again: it waits on
            if not self._elsewhere(awaited.pool, target.nonce):
                continue  # nowhere else to go: it waits on (the module's docstring)
            self.answered(awaited)
            awaited.hung = said
            awaited.task.cancel()
