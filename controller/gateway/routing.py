"""The routing table: model name -> deployment -> its Ready engine, from the records.

Records give each engine's host and port, so routing works on any backend. The
daemon hands every pass's records over (``update``, on the gateway's loop);
requests waiting for a deployment wake on each update.

RollingUpdate: while ``<name>@next`` exists, the table prefers it once it is Ready.
The daemon's executor calls ``retire`` (through the gateway) before it stops an old
instance: from then on nothing new goes to that instance, and ``retire`` returns when
its in-flight requests have ended (or its grace period ran out).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from controller.core.names import is_next, next_name
from controller.core.state import Phase, Record
from controller.host.probes import connect_host

DRAIN_POLL = 0.01  # seconds between looks at a retiring instance's in-flight count


@dataclass(frozen=True, slots=True)
class Target:
    deployment: str
    host: str
    port: int
    nonce: str | None


class Table:
    def __init__(self) -> None:
        self.names: dict[str, str] = {}  # routable name -> deployment
        self.records: dict[str, Record] = {}
        self._changed = asyncio.Event()
        self._down: dict[str, str | None] = {}  # deployment -> nonce that refused us
        self.loaded = asyncio.Event()  # set by the first pass's records
        self.inflight: Counter[str | None] = Counter()  # engine nonce -> requests in flight
        self._retired: set[str | None] = set()  # nonces of instances being stopped
        self._probed: dict[str, str | None] = {}  # deployment -> Starting nonce we saw ready

    async def first_pass(self, timeout: float) -> None:
        """Before the first pass there is nothing to route by: wait for it (bounded)."""
        if not self.loaded.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.loaded.wait(), timeout)

    def mark_down(self, name: str, target: Target) -> None:
        """Route nothing more to that engine until the next pass says otherwise."""
        self._down[name] = target.nonce

    def update(self, records: Iterable[Record]) -> None:
        self.records = {r.name: r for r in records}
        names: dict[str, str] = {}
        for rec in sorted(self.records.values(), key=lambda r: r.name):
            if is_next(rec.name):
                continue  # a rolling update's new instance: routed as its deployment
            for name in rec.models:
                names.setdefault(name, rec.name)  # duplicates are manifest errors already
        self.names = names
        self._down.clear()
        live = {r.nonce for r in self.records.values()}
        self._retired &= live  # an instance still on record stays retired until it is gone
        self._probed = {n: v for n, v in self._probed.items() if v in live}
        self.loaded.set()
        self._wake()

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def probed_ready(self, name: str, nonce: str | None) -> None:
        """The gateway's own probe passed for a Starting engine: route to it already."""
        self._probed[name] = nonce
        self._wake()

    async def retire(self, old: Record, new: Record | None, timeout: float) -> None:
        """Send nothing more to ``old`` (to ``new`` instead, if given); wait out its requests."""
        if new is not None:
            self.records[new.name] = new
        self._retired.add(old.nonce)
        self._wake()
        end = time.monotonic() + timeout
        while self.inflight[old.nonce] > 0 and time.monotonic() < end:
            await asyncio.sleep(DRAIN_POLL)

    def deployment(self, model: str) -> str | None:
        return self.names.get(model)

    def on_demand(self, name: str) -> bool:
        rec = self.records.get(name)
        return rec is not None and rec.on_demand

    def target(self, name: str, avoid: str | None = "-") -> Target | None:
        """Where a request for deployment ``name`` goes now: the new instance first; never
        the instance whose nonce is ``avoid`` (it just dropped a request)."""
        for rec in (self.records.get(next_name(name)), self.records.get(name)):
            found = self._target(name, rec)
            if found is not None and found.nonce != avoid:
                return found
        return None

    def starting(self, name: str) -> Record | None:
        """The record of ``name`` whose engine is starting (what the gateway may probe)."""
        rec = self.records.get(name)
        if rec is None or rec.phase is not Phase.STARTING or rec.port is None:
            return None
        return rec

    def _target(self, name: str, rec: Record | None) -> Target | None:
        if rec is None or rec.port is None or rec.nonce in self._retired:
            return None
        probed = rec.phase is Phase.STARTING and self._probed.get(name) == rec.nonce
        if rec.phase is not Phase.READY and not probed:
            return None
        if self._down.get(name, "-") == rec.nonce:
            return None
        return Target(name, connect_host(rec.host), rec.port, rec.nonce)

    def deadline(self, name: str) -> float:
        """How long a request may wait for ``name`` to be Ready: the record's readiness
        deadline, the very one the daemon fails the engine at (0: no valid spec, nothing
        will start it)."""
        rec = self.records.get(name)
        return (rec.ready_deadline_seconds or 0.0) if rec is not None else 0.0

    async def wait_target(
        self, name: str, timeout: float, on_wait: Callable[[], None] = lambda: None
    ) -> Target | None:
        """The Ready engine of ``name``, waiting up to ``timeout`` for one.

        ``on_wait`` runs before each wait (the gateway starts its own probe there).
        """
        end = time.monotonic() + timeout
        while True:
            found = self.target(name)
            left = end - time.monotonic()
            if found is not None or left <= 0 or name not in self.records:
                return found
            on_wait()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                return self.target(name)
