"""The engines' own load signals (issue 41): each engine's /metrics parsed (vLLM, SGLang,
llama.cpp, TGI), and through a real daemon and gateway, a Ready engine's figures exported
per instance as ``reconcile_engine_requests_waiting`` and
``reconcile_engine_kv_cache_usage_ratio``, following the engine; an engine with no
metrics exports none and is served as before."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from procs import free_ports
from structlog.testing import capture_logs

from controller.core.state import Phase, Record
from controller.gateway.accounting.enginemetrics import (
    EngineLoad,
    EngineMetricsReader,
    Fetch,
    parse,
)
from controller.gateway.http.upstream import Upstream, get_text
from controller.gateway.surface import enginesock
from controller.store.config import accesstoken

VLLM = """\
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 7.0
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 12.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.4375
"""
VLLM_OLD = """\
vllm:num_requests_waiting{model_name="m"} 2.0
vllm:gpu_cache_usage_perc{model_name="m"} 0.91
"""
SGLANG = """\
sglang:num_queue_reqs{model_name="m",tp_rank="0"} 4.0
sglang:token_usage{model_name="m",tp_rank="0"} 0.25
"""
# SGLang 0.5.19 with --enable-priority-scheduling: the queue's total under priority=""
# and again per priority (metrics_collector.py, _log_gauge_queue_count): 5 waiting, not 10.
SGLANG_PRIORITIES = """\
sglang:num_queue_reqs{model_name="m",priority="",tp_rank="0"} 5.0
sglang:num_queue_reqs{model_name="m",priority="0",tp_rank="0"} 2.0
sglang:num_queue_reqs{model_name="m",priority="10",tp_rank="0"} 3.0
sglang:token_usage{model_name="m",priority="",tp_rank="0"} 0.5
"""
LLAMA_CPP = """\
# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.125
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 1
llamacpp:requests_processing 2
"""
TGI = """\
# TYPE tgi_queue_size gauge
tgi_queue_size 3
tgi_batch_current_size 8
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (VLLM, EngineLoad(7.0, 0.4375)),
        (VLLM_OLD, EngineLoad(2.0, 0.91)),
        (SGLANG, EngineLoad(4.0, 0.25)),
        # data parallel ranks each hold their own queue: summed
        (
            'sglang:num_queue_reqs{dp_rank="0",model_name="m"} 1\n'
            'sglang:num_queue_reqs{dp_rank="1",model_name="m"} 2\n',
            EngineLoad(3.0, None),
        ),
        (LLAMA_CPP, EngineLoad(1.0, 0.125)),
        (TGI, EngineLoad(3.0, None)),
        ("", EngineLoad(None, None)),
        # the cache's size in tokens: vLLM's info labels, SGLang's gauge (ranks summed)
        (
            VLLM + 'vllm:cache_config_info{block_size="16",cache_dtype="auto",'
            'enable_prefix_caching="True",num_cpu_blocks="0",num_gpu_blocks="2048"} 1.0\n',
            EngineLoad(7.0, 0.4375, 32768.0),
        ),
        (
            'vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0\n',
            EngineLoad(None, None),
        ),
        (
            SGLANG + 'sglang:max_total_num_tokens{dp_rank="0",model_name="m",tp_rank="0"} 471258\n'
            'sglang:max_total_num_tokens{dp_rank="0",model_name="m",tp_rank="1"} 471258\n'
            'sglang:max_total_num_tokens{dp_rank="1",model_name="m",tp_rank="0"} 471258\n',
            EngineLoad(4.0, 0.25, 942516.0),
        ),
        ("process_cpu_seconds_total 12.5\nnot a sample\n", EngineLoad(None, None)),
        # two models in one engine: the waiting summed, the fullest cache
        (
            'vllm:num_requests_waiting{model_name="a"} 1\n'
            'vllm:num_requests_waiting{model_name="b"} 2\n'
            'vllm:kv_cache_usage_perc{model_name="a"} 0.2\n'
            'vllm:kv_cache_usage_perc{model_name="b"} 0.6\n',
            EngineLoad(3.0, 0.6),
        ),
        ("vllm:kv_cache_usage_perc 1.7\nvllm:num_requests_waiting NaN\n", EngineLoad(None, 1.0)),
        ('llamacpp:requests_deferred{a="x} y"} 5 1700000000\n', EngineLoad(5.0, None)),
    ],
)
def test_each_engines_text(text: str, expected: EngineLoad) -> None:
    assert parse(text) == expected


def test_sglangs_queue_split_by_priority_is_counted_once() -> None:
    """The split by priority repeats the total beside it: summing every label set read
    10 waiting where SGLang holds 5."""
    assert parse(SGLANG_PRIORITIES) == EngineLoad(5.0, 0.5)


def metrics(reconcile: Any, port: int) -> dict[str, float]:
    """The daemon's metrics port's ``reconcile_engine_*`` samples: series -> value."""
    token = accesstoken.read(reconcile.state)
    url = f"http://127.0.0.1:{port}/metrics?token={token}"
    lines = urllib.request.urlopen(url, timeout=10).read().decode().splitlines()
    found = [line.rsplit(" ", 1) for line in lines if line.startswith("reconcile_engine_")]
    return {series: float(value) for series, value in found}


def eng(reconcile: Any) -> str:
    """The labels of instance ``eng`` of the test's node, as the text has them."""
    return f'deployment="eng",instance="eng",node="{reconcile.node}"'


def test_a_ready_engines_own_figures_are_exported_and_follow_it(
    reconcile: Any, gateway: Any
) -> None:
    said = reconcile.tmp / "engine-metrics.txt"
    said.write_text(LLAMA_CPP)
    reconcile.write("eng", command=reconcile.demo_command(metrics_file=str(said)))
    reconcile.write("plain")  # no /metrics: no series, served as ever
    port = reconcile.port + 14
    g = gateway("--metrics-port", str(port))
    g.wait_phase("eng", "Ready")
    g.wait_phase("plain", "Ready")
    waiting = f"reconcile_engine_requests_waiting{{{eng(reconcile)}}}"
    kv = f"reconcile_engine_kv_cache_usage_ratio{{{eng(reconcile)}}}"

    def shown(series: str, value: float) -> bool:
        return metrics(reconcile, port).get(series) == value

    reconcile.wait_for(
        lambda: shown(waiting, 1) and shown(kv, 0.125),
        timeout=40,
        what="the engine's figures in the gateway's metrics",
    )
    said.write_text(LLAMA_CPP.replace("requests_deferred 1", "requests_deferred 6"))
    reconcile.wait_for(lambda: shown(waiting, 6), timeout=40, what="the new figure")
    assert not [series for series in metrics(reconcile, port) if 'deployment="plain"' in series]
    assert g.post("plain").status == 200
    g.finish()


async def _serve_metrics(
    page: Callable[[web.Request], Awaitable[web.Response]],
) -> tuple[web.AppRunner, int]:
    """A stand-in engine whose ``/metrics`` is ``page``: its runner (to clean up) and port."""
    app = web.Application()
    app.router.add_get("/metrics", page)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_ports(1)
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


@contextlib.asynccontextmanager
async def _fetch() -> AsyncIterator[Fetch]:
    """The reader's way to an engine's page, as the gateway gives it (surface/routes.py)."""
    client = Upstream(
        limit=8, connect_timeout=enginesock.CONNECT_TIMEOUT, socket_factory=enginesock.engine_socket
    )
    try:
        yield functools.partial(get_text, client)
    finally:
        await client.close()


def test_each_engines_queue_as_read_reaches_prefix_routing() -> None:
    """The reader hands every engine's queue, as read, to the routing table
    (``Table.engine_read``), which learns how many requests it runs at once; an
    engine that states nothing of it hands nothing."""

    async def scenario() -> list[tuple[str, EngineLoad]]:
        async def metrics_page(request: web.Request) -> web.Response:
            return web.Response(text=LLAMA_CPP)

        runner, port = await _serve_metrics(metrics_page)
        records = [
            Record(name="eng", owner="o", node="n", nonce="n0", port=port, phase=Phase.READY),
            # nothing listens there: no reading, nothing handed on
            Record(name="gone", owner="o", node="n", nonce="n1", port=1, phase=Phase.READY),
        ]
        seen: list[tuple[str, EngineLoad]] = []
        try:
            async with _fetch() as fetch:
                reader = EngineMetricsReader(
                    fetch, lambda: records, {}, read=lambda n, load: seen.append((n, load))
                )
                await reader.once()
        finally:
            await runner.cleanup()
        return seen

    assert asyncio.run(scenario()) == [("n0", EngineLoad(1.0, 0.125))]


def test_an_engine_whose_metrics_failed_once_is_read_again() -> None:
    """An engine's /metrics that answered 503 once (busy, or a proxy in front of it) was
    taken for an engine with no metrics: never read again, its figures gone from the
    metrics and the autoscaler until it restarted. A failure is no reading this time; the
    next read finds its figures."""

    async def scenario() -> list[EngineLoad]:
        answers = [web.Response(status=503, text="busy"), web.Response(text=VLLM)]

        async def metrics_page(request: web.Request) -> web.Response:
            return answers.pop(0) if len(answers) > 1 else answers[0]

        runner, port = await _serve_metrics(metrics_page)
        records = [
            Record(name="eng", owner="o", node="n", nonce="n0", port=port, phase=Phase.READY)
        ]
        loads: dict[tuple[str, str], EngineLoad] = {}
        readings = []
        try:
            async with _fetch() as fetch:
                reader = EngineMetricsReader(fetch, lambda: records, loads)
                for _ in range(2):
                    await reader.once()
                    readings.append(loads.get(("eng", "eng"), EngineLoad(None, None)))
        finally:
            await runner.cleanup()
        return readings

    assert asyncio.run(scenario()) == [EngineLoad(None, None), EngineLoad(7.0, 0.4375)]


def test_an_engine_whose_metrics_need_its_key_is_said_once() -> None:
    """llama.cpp with ``--api-key`` answers 401 to ``/metrics`` (seen on the built
    server): the deployment fell back to requests in flight without a word, whatever its
    ``autoscale.metric`` said. Said once, with the next move; not asked again."""

    async def scenario() -> tuple[int, list[dict[str, Any]]]:
        asked: list[int] = []

        async def metrics_page(request: web.Request) -> web.Response:
            asked.append(1)
            return web.Response(status=401, text='{"error": "Invalid API Key"}')

        runner, port = await _serve_metrics(metrics_page)
        records = [
            Record(name="eng", owner="o", node="n", nonce="n0", port=port, phase=Phase.READY)
        ]
        try:
            with capture_logs() as logs:
                async with _fetch() as fetch:
                    reader = EngineMetricsReader(fetch, lambda: records, {})
                    for _ in range(3):
                        await reader.once()
        finally:
            await runner.cleanup()
        return len(asked), logs

    asked, logs = asyncio.run(scenario())
    said = [e for e in logs if e["event"].startswith("engine metrics refused")]
    assert asked == 1 and len(said) == 1, logs
    assert said[0]["deployment"] == "eng" and said[0]["status"] == 401, said
    # The gateway's keys are the daemon's --api-keys (DESIGN.md): it named a node.yaml
    # setting, gateway.apiKeys, that node.yaml refuses as unknown.
    assert "--api-keys FILE" in said[0]["next"] and "node.yaml" not in said[0]["next"], said


# An engine whose /metrics is prometheus_client's own server (its make_wsgi_app and
# make_asgi_app, which Python engines mount, do the same): the page gzipped for a client
# that says it accepts gzip, any path answered (so /health is its readiness).
PROMETHEUS_ENGINE = """
import sys, threading
from prometheus_client import CollectorRegistry, Gauge, start_http_server
r = CollectorRegistry()
Gauge("vllm:num_requests_waiting", "waiting", ["model_name"], registry=r).labels("m").set(3)
Gauge("vllm:kv_cache_usage_perc", "kv", ["model_name"], registry=r).labels("m").set(0.5)
start_http_server(int(sys.argv[1]), addr="127.0.0.1", registry=r)
threading.Event().wait()
"""


def test_an_engine_whose_metrics_page_is_gzipped_when_asked_is_read(
    reconcile: Any, gateway: Any
) -> None:
    """The gateway read the engines' /metrics with aiohttp's client, which asks for gzip,
    told not to decompress: such an engine's page came compressed, failed as text at
    every read, and its queue and cache reached neither the metrics, the autoscaler nor
    routing (asked again every 5 s, forever). The page is asked for as it is."""
    reconcile.write("eng", command=[sys.executable, "-c", PROMETHEUS_ENGINE, "{port}"])
    port = reconcile.port + 14
    g = gateway("--metrics-port", str(port))
    ready = g.wait_phase("eng", "Ready")
    asked = urllib.request.Request(
        f"http://127.0.0.1:{ready['port']}/metrics", headers={"Accept-Encoding": "gzip"}
    )
    with urllib.request.urlopen(asked, timeout=10) as page:
        assert page.headers["Content-Encoding"] == "gzip"  # the premise: gzipped when asked
    waiting = f"reconcile_engine_requests_waiting{{{eng(reconcile)}}}"
    kv = f"reconcile_engine_kv_cache_usage_ratio{{{eng(reconcile)}}}"
    reconcile.wait_for(
        lambda: (
            metrics(reconcile, port).get(waiting) == 3 and metrics(reconcile, port).get(kv) == 0.5
        ),
        timeout=40,
        what="the engine's figures in the gateway's metrics",
    )
    g.finish()
