"""The gateway's requests in flight per deployment, as the autoscaler reads them (pure).

Each gateway process writes, about once a second per busy deployment, its last samples
(``controller/store/side/inflight.py`` keeps them in ``<state>/inflight/``); a sample is the
time-weighted mean of the requests it had in flight to the deployment's instances over
one interval, and the most at once. The daemon sums the gateways' figures: during a
handover two gateways serve at once, each writes its own file.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

KEPT = 30  # samples per file: the autoscaler's 10-s window, with room to spare


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # the end of the interval, Unix seconds
    seconds: float  # its length
    mean: float  # requests in flight, time-weighted over the interval
    peak: int  # the most in flight at once during it


@dataclass(frozen=True, slots=True)
class Inflight:
    """One gateway's recent samples for one deployment."""

    deployment: str
    writer: str  # the gateway process that wrote them (its file's suffix)
    samples: tuple[Sample, ...] = ()

    def adding(self, sample: Sample, kept: int = KEPT) -> Inflight:
        return Inflight(self.deployment, self.writer, (*self.samples, sample)[-kept:])


def average(figures: Iterable[Inflight], deployment: str, now: float, window: float) -> float:
    """Requests in flight to ``deployment`` over the ``window`` seconds before ``now``,
    summed over the gateways; time no sample covers counts as none in flight (a gateway
    writes nothing for an idle deployment)."""
    start = now - window
    area = 0.0
    for figure in figures:
        if figure.deployment != deployment:
            continue
        for sample in figure.samples:
            begun = sample.at - sample.seconds
            covered = min(sample.at, now) - max(begun, start)
            if covered > 0 and sample.seconds > 0:
                area += sample.mean * covered
    return area / window if window > 0 else 0.0


def peak(figures: Iterable[Inflight], deployment: str, now: float, window: float) -> int:
    """The most requests in flight to ``deployment`` at once in the window, per gateway
    summed (an upper bound: the gateways' peaks need not coincide)."""
    start = now - window
    return sum(
        max((s.peak for s in f.samples if s.at > start and s.at - s.seconds < now), default=0)
        for f in figures
        if f.deployment == deployment
    )


def recent(figures: Iterable[Inflight], deployment: str, now: float, window: float) -> float:
    """Requests in flight to ``deployment`` over the time in the last ``window`` seconds
    that each gateway's samples cover, summed over the gateways: the quick look at a load
    step, which a mean over a longer window (idle time counting 0) is slow to show."""
    start = now - window
    total = 0.0
    for figure in figures:
        if figure.deployment != deployment:
            continue
        area = covered = 0.0
        for sample in figure.samples:
            span = min(sample.at, now) - max(sample.at - sample.seconds, start)
            if span > 0 and sample.seconds > 0:
                area += sample.mean * span
                covered += span
        total += area / covered if covered > 0 else 0.0
    return total
