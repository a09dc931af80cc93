"""Requests in flight per deployment, time-weighted, for the autoscaler.

``InflightCounts.add`` runs on the event loop for each request an instance takes and gives back
(a few dict operations: no lock, no disk I/O). ``InflightWriter`` turns the counts into one
sample a second per busy deployment and writes it with the last ones
(``controller/store/side/inflight.py``, off the loop); an idle deployment gets no write, and
with every deployment idle the writer sleeps until a request comes (``Load.on_busy``).

``EngineFigures`` writes the engines' own figures the same way (``autoscale.metric:
waiting | kvCache``): after each read of their ``/metrics`` (``enginemetrics.EngineMetricsReader``),
one sample per deployment and signal, the mean over the instances that stated it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import secrets
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from controller.core.scaling.inflight import Inflight, Sample
from controller.gateway.accounting.enginemetrics import EngineLoad
from controller.logsetup import get_logger
from controller.store.side import inflight as store
from controller.store.statedir import StateDir

log = get_logger("reconcile")

INTERVAL = 1.0  # seconds between samples (and writes) per busy deployment
PRUNE_AFTER = 3600.0  # a file with no sample this recent is a dead gateway's


class _Held:
    """One deployment's requests in flight: now, their request-seconds since the last
    sample (brought up to date at ``since``), and the most at once since then."""

    __slots__ = ("area", "count", "peak", "since")

    def __init__(self, now: float) -> None:
        self.count = 0
        self.area = 0.0
        self.since = now
        self.peak = 0

    def settle(self, now: float) -> None:
        self.area += self.count * (now - self.since)
        self.since = now


class InflightCounts:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._held: dict[str, _Held] = {}
        self._taken = clock()
        self.on_busy: Callable[[], None] = lambda: None  # the first request after idle

    def idle(self) -> bool:
        """No deployment had a request since it was last forgotten: no sample to take."""
        return not self._held

    def add(self, deployment: str, delta: int) -> None:
        """``delta`` requests more (or fewer, if negative) in flight to ``deployment``."""
        now = self._clock()
        held = self._held.get(deployment)
        if held is None:
            if not self._held:  # the first since idle: its sample starts now, not at the last
                self._taken = now
                self.on_busy()
            held = self._held[deployment] = _Held(now)
        else:
            held.settle(now)
        held.count += delta
        if held.count > held.peak:
            held.peak = held.count

    def now(self, deployment: str) -> int:
        held = self._held.get(deployment)
        return held.count if held is not None else 0

    def take(self, wall: float) -> list[tuple[str, Sample]]:
        """One sample per deployment that had a request in flight since the last take
        (``wall``: its end, Unix seconds); a deployment idle all along is forgotten."""
        now = self._clock()
        seconds, self._taken = now - self._taken, now
        out: list[tuple[str, Sample]] = []
        for deployment, held in list(self._held.items()):
            held.settle(now)
            if held.area <= 0 and held.peak <= 0:
                del self._held[deployment]
                continue
            mean = held.area / seconds if seconds > 0 else float(held.count)
            out.append((deployment, Sample(wall, seconds, mean, held.peak)))
            held.area = 0.0
            held.peak = held.count
        return out


class InflightWriter:
    """The once-a-second writer of one gateway process's samples (its own files)."""

    def __init__(self, state_dir: Path, load: InflightCounts, writer: str | None = None) -> None:
        self.state_dir = state_dir
        self.load = load
        # pid plus a random part: two gateways of one process (tests) write apart too.
        self.writer = writer or f"{os.getpid()}x{secrets.token_hex(3)}"
        self.figures: dict[str, Inflight] = {}
        self._failed = False

    async def run(self) -> None:
        """Until cancelled; then its files go (its requests are no one's load any more)."""
        await asyncio.get_running_loop().run_in_executor(None, self._start)
        busy = asyncio.Event()
        self.load.on_busy = busy.set
        try:
            while True:
                if self.load.idle():
                    busy.clear()
                    await busy.wait()  # idle: no sample to take until a request comes
                await asyncio.sleep(INTERVAL)
                await self.flush()
        finally:
            store.forget(self.state_dir, self.writer)

    def _start(self) -> None:
        """A crashed gateway's files pruned, and the folder made now: made by the first
        request's sample, it was a new entry in the state dir's top folder, which this
        gateway watches (for ``drain.json``), so its watch threads woke in that request's
        tail too (the idle test's held case). A folder it cannot make is said by the
        first write, as any other failure to write; a state dir gone is not made again
        (the gateway ends when it is gone)."""
        store.prune(self.state_dir, time.time(), PRUNE_AFTER)
        with contextlib.suppress(OSError):
            StateDir(self.state_dir).inflight.mkdir(mode=0o700)

    async def flush(self) -> None:
        loop = asyncio.get_running_loop()
        for deployment, sample in self.load.take(time.time()):
            figure = self.figures.get(deployment) or Inflight(deployment, self.writer)
            figure = self.figures[deployment] = figure.adding(sample)
            try:
                await loop.run_in_executor(None, store.write, self.state_dir, figure)
            except (OSError, ValueError) as exc:
                if not self._failed:  # said once: a full disk would say it every second
                    why = str(exc)
                    log.error("in-flight figures not written", deployment=deployment, error=why)
                self._failed = True


class EngineFigures:
    """One gateway's writer of the engines' figures: ``write`` after each read."""

    def __init__(self, state_dir: Path, writer: str | None = None) -> None:
        self.state_dir = state_dir
        self.writer = writer or f"{os.getpid()}x{secrets.token_hex(3)}"
        self.figures: dict[tuple[str, str], Inflight] = {}  # (signal, deployment) -> its file
        self._failed = False

    async def write(self, loads: Mapping[tuple[str, str], EngineLoad], seconds: float) -> None:
        """One sample per (signal, deployment) the engines read (``loads``: per (deployment,
        instance)) stated, over the last ``seconds``; an engine saying nothing adds none."""
        values: dict[tuple[str, str], list[float]] = {}
        for (deployment, _), load in loads.items():
            for signal, value in (("waiting", load.waiting), ("kvCache", load.kv_cache)):
                if value is not None:
                    values.setdefault((signal, deployment), []).append(value)
        loop, wall = asyncio.get_running_loop(), time.time()
        for (signal, deployment), seen in values.items():
            sample = Sample(wall, seconds, sum(seen) / len(seen), math.ceil(max(seen)))
            figure = self.figures.get((signal, deployment)) or Inflight(deployment, self.writer)
            figure = self.figures[signal, deployment] = figure.adding(sample)
            try:
                await loop.run_in_executor(None, store.write, self.state_dir, figure, signal)
            except (OSError, ValueError) as exc:
                if not self._failed:  # said once, as the in-flight figures
                    log.error("engine figures not written", deployment=deployment, error=str(exc))
                self._failed = True

    def forget(self) -> None:
        """The gateway ends: its readings are no one's any more."""
        for signal in ("waiting", "kvCache"):
            store.forget(self.state_dir, self.writer, signal)

    def prune(self) -> None:
        """A crashed gateway's files, as ``InflightWriter`` prunes its own kind's."""
        for signal in ("waiting", "kvCache"):
            store.prune(self.state_dir, time.time(), PRUNE_AFTER, signal)
