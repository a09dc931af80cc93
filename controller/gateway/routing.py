"""The routing table: model name -> deployment -> its Ready engine, from the records.

Records give each engine's host and port, so routing works on any backend. The
daemon hands every pass's records over (``update``, on the gateway's loop);
requests waiting for a deployment wake on each update.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable
from dataclasses import dataclass

from controller.core.specs import routable_names
from controller.core.state import Phase, Record

DEFAULT_DEADLINE = 600.0  # the readiness deadline a spec without one gets


@dataclass(frozen=True)
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
            for name in routable_names(rec.name, rec.spec):
                names.setdefault(name, rec.name)  # duplicates are manifest errors already
        self.names = names
        self._down.clear()
        self.loaded.set()
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def deployment(self, model: str) -> str | None:
        return self.names.get(model)

    def on_demand(self, name: str) -> bool:
        rec = self.records.get(name)
        return rec is not None and rec.spec.get("activation") == "OnDemand"

    def target(self, name: str) -> Target | None:
        rec = self.records.get(name)
        if rec is None or rec.phase is not Phase.READY or rec.port is None:
            return None
        if name in self._down and self._down[name] == rec.nonce:
            return None
        host = "127.0.0.1" if rec.host in ("0.0.0.0", "") else rec.host
        host = "::1" if host == "::" else host
        return Target(rec.name, host, rec.port, rec.nonce)

    def deadline(self, name: str) -> float:
        """How long a request may wait for ``name`` to be Ready: its readiness deadline."""
        rec = self.records.get(name)
        readiness = rec.spec.get("readiness") if rec is not None else None
        seconds = readiness.get("deadlineSeconds") if isinstance(readiness, dict) else None
        return float(seconds) if isinstance(seconds, int | float) else DEFAULT_DEADLINE

    async def wait_target(self, name: str, timeout: float) -> Target | None:
        """The Ready engine of ``name``, waiting up to ``timeout`` for one."""
        end = time.monotonic() + timeout
        while True:
            found = self.target(name)
            left = end - time.monotonic()
            if found is not None or left <= 0 or name not in self.records:
                return found
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                return self.target(name)
