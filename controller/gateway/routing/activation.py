"""On-demand activation: the gateway's side of ``<state>/activation/<name>.json``.

A request for an OnDemand deployment marks it wanted (written at once when it is
not Ready, then the daemon is asked for a pass); while requests are in flight the
timestamp is refreshed every ``FLUSH`` seconds, so the planner's idle timeout
counts from the last request that ended. With nothing in flight and nothing to write
the heartbeat sleeps until a request begins: an idle gateway wakes for nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from controller.core.elapsed import BootClock
from controller.core.state import Activation
from controller.host import bootclock
from controller.logsetup import get_logger
from controller.store.side import activation as store

log = get_logger("reconcile")

FLUSH = 0.5  # seconds between writes of the in-flight heartbeat


class Demand:
    def __init__(self, state_dir: Path, request_pass: Callable[[], None]) -> None:
        self.state_dir = state_dir
        self.request_pass = request_pass
        self.inflight: defaultdict[str, int] = defaultdict(int)
        # name -> the last request's wall-clock time and boot-clock reading (the planner
        # counts idleTimeout on the latter: a wall-clock step parks nothing)
        self.last: dict[str, tuple[float, BootClock | None]] = {}
        self.dirty: set[str] = set()
        self._pending: set[asyncio.Task[str | None]] = set()
        # One write at a time, each reading the counts when its turn comes: an older
        # heartbeat landing after end()'s write would leave "in flight" on disk for good.
        self._writing = asyncio.Lock()
        self._busy = asyncio.Event()  # a request began: the heartbeat has work again

    def begin(self, name: str) -> None:
        self.inflight[name] += 1
        self.last[name] = _stamp()
        self.dirty.add(name)
        self._busy.set()

    def end(self, name: str) -> None:
        self.inflight[name] -= 1
        self.last[name] = _stamp()
        self.dirty.add(name)
        if self.inflight[name] <= 0:  # now idle: a swap may pick it, say so at once
            # Another OnDemand engine may be waiting for this one's room: a pass now swaps
            # (passes come on events, and this is the event).
            waiting = any(n != name and c > 0 for n, c in self.inflight.items())
            self._spawn(self._write_then_pass(name) if waiting else self._write(name))

    def again(self, name: str) -> None:
        """A request waiting for ``name`` saw it parked meanwhile: write the demand and ask
        for a pass once more. The heartbeat's writes ask for none, so an engine parked while
        a request waited for it (its idleTimeout run out on a heartbeat a loaded host held
        back, a swap) stayed parked until the request's deadline: a 503 after 30 s."""
        self.last[name] = _stamp()
        self.dirty.add(name)
        self._spawn(self._write_then_pass(name))

    def _spawn(self, write: Coroutine[Any, Any, str | None]) -> None:
        self._pending.add(asyncio.get_running_loop().create_task(write))
        for task in [t for t in self._pending if t.done()]:
            self._pending.discard(task)

    async def activate(self, name: str) -> str | None:
        """Write the demand now (and every other change) and ask for a pass: it starts.

        Returns why the demand could not be written (the request cannot wake anything:
        it is answered at once, not after the readiness deadline), or None."""
        self.dirty.add(name)
        problem = None
        for other in sorted(self.dirty):
            failed = await self._write(other)
            problem = failed if other == name else problem
        self.request_pass()
        return problem

    async def run(self) -> None:
        """The heartbeat: refresh in-flight deployments, write what changed."""
        while True:
            if not self.dirty and not any(c > 0 for c in self.inflight.values()):
                self._busy.clear()
                await self._busy.wait()  # idle: nothing to refresh until a request begins
            await asyncio.sleep(FLUSH)
            now = _stamp()
            for name, count in self.inflight.items():
                if count > 0:
                    self.last[name] = now
                    self.dirty.add(name)
            for name in sorted(self.dirty):
                await self._write(name)

    async def _write_then_pass(self, name: str) -> str | None:
        problem = await self._write(name)
        self.request_pass()
        return problem

    async def _write(self, name: str) -> str | None:
        async with self._writing:
            self.dirty.discard(name)
            at, boot = self.last.get(name) or _stamp()
            when = datetime.fromtimestamp(at, UTC)
            act = Activation(last_request_at=when, inflight=max(self.inflight[name], 0), boot=boot)
            try:
                await asyncio.get_running_loop().run_in_executor(
                    None, store.write, self.state_dir, name, act
                )
            except (OSError, ValueError) as exc:
                log.error("activation not written", deployment=name, error=str(exc))
                return str(exc)
            return None


class Rewake:
    """One waiting request's look at its OnDemand deployments each time the table changes:
    a park newer than the one it woke from (its record's ``idle_since``) wakes it again
    (``Demand.again``)."""

    def __init__(
        self, demand: Demand, names: tuple[str, ...], parked_at: Callable[[str], datetime | None]
    ) -> None:
        self._demand = demand
        self._parked_at = parked_at
        self._seen = {name: parked_at(name) for name in names}

    def __call__(self) -> None:
        for name, seen in self._seen.items():
            parked = self._parked_at(name)
            if parked is not None and parked != seen:
                self._seen[name] = parked
                self._demand.again(name)


def _stamp() -> tuple[float, BootClock | None]:
    return time.time(), bootclock.read()
