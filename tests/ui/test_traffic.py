"""The page's sparkline figures from the gateway's own counters (no browser needed)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import pytest

from controller.gateway.accounting.metrics import BUCKETS, GatewayMetrics
from controller.gateway.ui import traffic as traffic_module
from controller.gateway.ui.traffic import KEEP, PERIOD, WINDOW, Totals, Traffic, quantile, totals


def counts(**at: int) -> tuple[int, ...]:
    """Per-bucket counts: ``b0=3`` puts 3 in the first bucket (up to 5 ms)."""
    out = [0] * (len(BUCKETS) + 1)
    for name, n in at.items():
        out[int(name[1:])] = n
    return tuple(out)


@pytest.mark.parametrize(
    ("q", "buckets", "expected"),
    [
        (0.5, counts(b0=10), 0.0025),  # halfway into 0..5 ms
        (0.99, counts(b0=10), 0.00495),
        (0.5, counts(b0=5, b2=5), 0.005),  # the median at the first bucket's top
        (0.99, counts(b0=50, b4=50), 0.099),  # 98% of the way through 50..100 ms
        (0.5, counts(**{f"b{len(BUCKETS)}": 4}), BUCKETS[-1]),  # past the last: that bound
        (0.5, counts(), None),  # no request: no figure
    ],
    ids=["p50-one-bucket", "p99-one-bucket", "p50-edge", "p99-second", "overflow", "empty"],
)
def test_quantile_interpolates_within_buckets(
    q: float, buckets: tuple[int, ...], expected: float | None
) -> None:
    found = quantile(q, buckets)
    assert found == (None if expected is None else pytest.approx(expected))


def test_totals_sum_keys_and_leave_out_requests_with_no_deployment() -> None:
    metrics = GatewayMetrics()
    metrics.done("web", "k1", 200, 0.003)
    metrics.done("web", "k2", 503, 0.2)
    metrics.done("-", "-", 401, 0.001)
    found = totals(metrics)
    assert set(found) == {"web"}
    assert (found["web"].requests, found["web"].errors) == (2, 1)
    assert sum(found["web"].buckets) == 2


def test_a_sample_is_the_change_since_the_last_one() -> None:
    metrics = GatewayMetrics()
    traffic = Traffic(metrics)
    for _ in range(4):
        metrics.done("web", "-", 200, 0.003)
    traffic.sample()
    metrics.done("web", "-", 500, 0.003)
    traffic.sample()
    series = traffic.as_json()["web"]
    assert series["errors"][0] == 0 and series["errors"][1] > 0
    assert series["rps"][0] > series["rps"][1] > 0
    assert series["p50"][-1] == pytest.approx(0.0025)
    assert Totals(5, 1).minus(Totals(4, 1)).requests == 1


async def _until(found: Callable[[], bool], what: str) -> None:
    """Until ``found()``, looked at every loop turn of a few ms (bounded)."""
    async with asyncio.timeout(30):
        while not found():
            await asyncio.sleep(0.005)
    assert found(), what


def test_an_idle_sampler_parks_and_the_page_still_sees_the_quiet_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sample with no new request: the sampler parks (an idle gateway wakes for
    nothing; it took WINDOW such samples, four wake-ups more after each request); the
    seconds it slept show when the page asks as the samples it would have taken, the
    request's latency leaving the quantile window, and the next request wakes it."""
    monkeypatch.setattr(traffic_module, "PERIOD", 0.02)  # the test's seconds, not the page's
    asyncio.run(_parks_and_wakes())


async def _parks_and_wakes() -> None:
    metrics = GatewayMetrics()
    traffic = Traffic(metrics)
    sampler = asyncio.create_task(traffic.run())
    try:
        await _until(lambda: traffic.parked, "parked before any request")
        metrics.done("web", "-", 200, 0.003)
        await _until(lambda: "web" in traffic.series, "the request's sample")
        await _until(lambda: traffic.parked, "parked again once quiet")
        series = traffic.series["web"]
        assert series.rps[0] > 0
        assert list(series.rps) == [series.rps[0], 0.0]  # one quiet sample: then it parked
        latency = series.p50[0]
        assert latency is not None and series.p50[1] == latency
        await _until(lambda: len(traffic.as_json()["web"]["at"]) > WINDOW + 2, "quiet samples")
        shown = traffic.as_json()["web"]
        assert shown["rps"][1:] == [0.0] * (len(shown["rps"]) - 1)
        assert shown["p50"][:WINDOW] == [round(latency, 4)] * WINDOW  # still in the window
        assert shown["p50"][WINDOW:] == [None] * (len(shown["p50"]) - WINDOW)
        assert shown["at"] == sorted(shown["at"])
        metrics.done("web", "-", 500, 0.003)
        await _until(lambda: traffic.as_json()["web"]["errors"][-1] > 0, "woken by a request")
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler


def test_a_parked_sampler_fills_at_most_what_the_page_keeps() -> None:
    """A sampler parked for hours fills in KEEP zero samples, not one per second slept,
    and the request before them has left their quantile window."""
    metrics = GatewayMetrics()
    traffic = Traffic(metrics)
    metrics.done("web", "-", 200, 0.003)
    traffic.sample()
    traffic.parked = True  # as run() leaves it while it waits for a request
    traffic.fill(time.monotonic() + 10 * KEEP * PERIOD)
    shown = traffic.as_json()["web"]
    assert len(shown["rps"]) == KEEP
    assert shown["rps"] == [0.0] * KEEP
    assert shown["p50"] == [None] * KEEP
