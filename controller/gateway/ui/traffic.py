"""Per-deployment traffic over the last minutes, for the page's sparklines.

Sampled every ``PERIOD`` seconds from the gateway's own counters (``GatewayMetrics``,
read on the gateway's loop, where they are updated): requests/s and errors/s over the
period, and p50/p99 latency over the last ``WINDOW`` seconds, interpolated within the
histogram's buckets as Prometheus' ``histogram_quantile`` does.

Only while there is traffic: once a sample saw no new request, every further one until
the next request is a zero sample (no rate; its quantiles over the last ``WINDOW``
samples, the older requests running out of them), so the sampler parks until
``GatewayMetrics.done`` wakes it, and the zero samples of the quiet time are filled in
then, or when the page asks (``as_json``), through the same ``Series.add``. An idle
gateway wakes for none. It once took ``WINDOW`` quiet samples before it parked: four
wake-ups after each request that filling in gives the same (the idle test's held case
counted them).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from controller.gateway.accounting.metrics import BUCKETS, GatewayMetrics

PERIOD = 1.0  # seconds between samples
KEEP = 120  # samples per deployment (two minutes)
WINDOW = 5  # samples the quantiles are taken over (a second holds too few requests)
NO_DEPLOYMENT = "-"  # requests the gateway answered itself (no model, bad key)


@dataclass(frozen=True, slots=True)
class Totals:
    """One deployment's counters at one moment, summed over keys."""

    requests: int = 0
    errors: int = 0
    buckets: tuple[int, ...] = (0,) * (len(BUCKETS) + 1)

    def minus(self, older: Totals) -> Totals:
        return Totals(
            self.requests - older.requests,
            self.errors - older.errors,
            tuple(a - b for a, b in zip(self.buckets, older.buckets, strict=True)),
        )


def totals(metrics: GatewayMetrics) -> dict[str, Totals]:
    """Every deployment's counters now (call it on the gateway's loop)."""
    requests: dict[str, int] = {}
    errors: dict[str, int] = {}
    buckets: dict[str, list[int]] = {}
    for (dep, _), n in list(metrics.requests.items()):
        requests[dep] = requests.get(dep, 0) + n
    for (dep, _, _), n in list(metrics.errors.items()):
        errors[dep] = errors.get(dep, 0) + n
    for (dep, _), hist in list(metrics.latency.items()):
        into = buckets.setdefault(dep, [0] * (len(BUCKETS) + 1))
        for i, count in enumerate(hist.counts):
            into[i] += count
    return {
        dep: Totals(n, errors.get(dep, 0), tuple(buckets.get(dep, [0] * (len(BUCKETS) + 1))))
        for dep, n in requests.items()
        if dep != NO_DEPLOYMENT
    }


def quantile(q: float, counts: tuple[int, ...]) -> float | None:
    """The ``q`` quantile of per-bucket counts (not cumulative), in seconds; None when
    empty. Past the last bound it is that bound (as Prometheus answers)."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    running = 0
    for i, count in enumerate(counts):
        if running + count >= rank and count > 0:
            if i >= len(BUCKETS):
                return BUCKETS[-1]
            low = BUCKETS[i - 1] if i > 0 else 0.0
            return low + (BUCKETS[i] - low) * (rank - running) / count
        running += count
    return BUCKETS[-1]


@dataclass
class Series:
    """One deployment's samples, oldest first."""

    at: deque[float] = field(default_factory=lambda: deque(maxlen=KEEP))
    rps: deque[float] = field(default_factory=lambda: deque(maxlen=KEEP))
    errors: deque[float] = field(default_factory=lambda: deque(maxlen=KEEP))
    p50: deque[float | None] = field(default_factory=lambda: deque(maxlen=KEEP))
    p99: deque[float | None] = field(default_factory=lambda: deque(maxlen=KEEP))
    recent: deque[Totals] = field(default_factory=lambda: deque(maxlen=WINDOW))

    def add(self, at: float, delta: Totals, seconds: float) -> None:
        self.recent.append(delta)
        window = tuple(map(sum, zip(*(d.buckets for d in self.recent), strict=True)))
        self.at.append(at)
        self.rps.append(delta.requests / seconds)
        self.errors.append(delta.errors / seconds)
        self.p50.append(quantile(0.5, window))
        self.p99.append(quantile(0.99, window))

    def as_json(self) -> dict[str, Any]:
        return {
            "at": list(self.at),
            "rps": [round(v, 3) for v in self.rps],
            "errors": [round(v, 3) for v in self.errors],
            "p50": [None if v is None else round(v, 4) for v in self.p50],
            "p99": [None if v is None else round(v, 4) for v in self.p99],
        }


class Traffic:
    def __init__(self, metrics: GatewayMetrics) -> None:
        self.metrics = metrics
        self.series: dict[str, Series] = {}
        self._last: dict[str, Totals] = {}
        self._last_at = time.monotonic()
        self._still = 1  # samples in a row with no new request (none counted yet)
        self.parked = False  # the sampler waits for a request (the quiet time unfilled)
        self._request = asyncio.Event()
        metrics.on_done = self._request.set

    def sample(self) -> None:
        """One sample of every deployment the gateway has counted (on its loop)."""
        now = time.monotonic()
        seconds = max(now - self._last_at, 1e-3)
        current = totals(self.metrics)
        self._still = self._still + 1 if current == self._last else 0
        wall = time.time()
        for dep, value in current.items():
            delta = value.minus(self._last.get(dep, Totals()))
            self.series.setdefault(dep, Series()).add(wall, delta, seconds)
        self._last, self._last_at = current, now

    async def run(self) -> None:
        while True:
            if self._still > 0:  # quiet: the next samples are zero ones, filled in alike
                self.parked = True
                self._request.clear()
                await self._request.wait()
                self.fill()
                self.parked = False
            await asyncio.sleep(PERIOD)
            self.sample()

    def fill(self, now: float | None = None) -> None:
        """The zero samples a parked sampler did not take, one each ``PERIOD`` from its
        last to ``now`` (at most ``KEEP``), as ``sample`` would have taken them."""
        if not self.parked:
            return
        wall = time.time()
        now = time.monotonic() if now is None else now
        missed = int((now - self._last_at) / PERIOD)
        skipped = max(0, missed - KEEP)
        for series in self.series.values():  # the skipped ones leave the window too
            series.recent.extend([Totals()] * min(skipped, WINDOW))
        for k in range(skipped, missed):
            at = self._last_at + (k + 1) * PERIOD
            for series in self.series.values():
                series.add(wall - (now - at), Totals(), PERIOD)
        self._last_at += missed * PERIOD

    def as_json(self) -> dict[str, Any]:
        self.fill()
        return {dep: s.as_json() for dep, s in sorted(self.series.items())}
