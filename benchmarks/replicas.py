"""Replicas through the gateway (issue 21): scaling, least-in-flight, affinity.

    python -m benchmarks --only replicas

Stand-in engines with a fixed service time (``service_engine.py``: 20 ms, 4 at once per
engine), the real gateway in a process of its own (``gateway_host.py``), one aiohttp
load generator with 32 clients (a closed loop). In one run, trials interleaved:

* throughput with 2 and 4 instances over 1 (goals 1.9x and 3.6x);
* p99 latency, least-in-flight over round-robin, on a pool where one of 4 instances is
  5x slower (100 ms; goal 0.5x);
* ``affinity: session``: 256 sessions of 4 requests each over 4 instances: the share of
  requests on their session's instance (goal 99%) and requests per instance, max over
  mean (goal 1.25).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http.client
import subprocess
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from benchmarks.common import HERE, PYTHON, Row, free_port_block, median, stop, wait_for

SECTION = "9. replicas"
CLIENTS = 32
SERVICE_MS = 20.0
SLOW_MS = 5 * SERVICE_MS
PER_ENGINE = 4
SESSIONS = 256
PER_SESSION = 4
WAIT = 30.0


@dataclass
class Run:
    seconds: float
    latencies: list[float]  # seconds, one per request
    engines: list[str]  # who served each request, in order
    sessions: list[int]  # the session of each request (-1: none)

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.seconds

    def p99_ms(self) -> float:
        s = sorted(self.latencies)
        return s[min(len(s) - 1, int(0.99 * len(s)))] * 1000


def _healthy(port: int, path: str = "/health") -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


@contextlib.contextmanager
def _engines(ports: Sequence[int], service_ms: Sequence[float]) -> Iterator[None]:
    script = str(HERE / "service_engine.py")
    procs = [
        subprocess.Popen(
            [PYTHON, script, "--port", str(port), "--service-ms", str(ms)],
            stdin=subprocess.DEVNULL,
        )
        for port, ms in zip(ports, service_ms, strict=True)
    ]
    try:
        for port in ports:
            wait_for(functools.partial(_healthy, port), WAIT, f"engine on {port}", poll=0.02)
        yield
    finally:
        for proc in procs:
            stop(proc)


@contextlib.contextmanager
def _gateway(port: int, state: Path, engines: Sequence[int], *flags: str) -> Iterator[str]:
    argv = [PYTHON, "-m", "benchmarks.gateway_host", "--port", str(port), "--state", str(state)]
    proc = subprocess.Popen(
        [*argv, "--engines", ",".join(map(str, engines)), *flags],
        stdin=subprocess.DEVNULL,
        cwd=HERE.parent,
    )
    try:
        wait_for(lambda: _healthy(port, "/healthz"), WAIT, "the gateway", poll=0.02)
        yield f"http://127.0.0.1:{port}/v1/chat/completions"
    finally:
        stop(proc, timeout=30)


async def _load(url: str, requests: int, sessions: bool) -> Run:
    """``requests`` requests from ``CLIENTS`` clients; with ``sessions``, each client
    sends its sessions' requests in turn, every session ``PER_SESSION`` of them."""
    latencies: list[float] = []
    engines: list[str] = []
    tagged: list[int] = []
    work: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        work.put_nowait(i // PER_SESSION if sessions else -1)

    async def client(session: aiohttp.ClientSession) -> None:
        while not work.empty():
            key = work.get_nowait()
            body = {"model": "pool", "messages": []}
            headers = {"x-session-id": f"s{key}"} if key >= 0 else {}
            t = time.perf_counter()
            async with session.post(url, json=body, headers=headers) as resp:
                answer = await resp.json()
                if resp.status != 200:
                    raise RuntimeError(f"the gateway answered {resp.status}: {answer}")
            latencies.append(time.perf_counter() - t)
            engines.append(answer["engine"])
            tagged.append(key)

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        warm = [_one_warm(session, url) for _ in range(CLIENTS)]
        await asyncio.gather(*warm)
        start = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(CLIENTS)))
        return Run(time.perf_counter() - start, latencies, engines, tagged)


async def _one_warm(session: aiohttp.ClientSession, url: str) -> None:
    async with session.post(url, json={"model": "pool"}) as resp:
        await resp.read()


def _measure(state: Path, gw_port: int, engines: Sequence[int], requests: int, *flags: str) -> Run:
    with _gateway(gw_port, state, engines, *flags) as url:
        return asyncio.run(_load(url, requests, sessions="--affinity" in flags))


def _affinity(run: Run) -> tuple[float, float]:
    """(percent of requests on their session's first instance, max/mean per instance)."""
    first: dict[int, str] = {}
    hits = 0
    for key, engine in zip(run.sessions, run.engines, strict=True):
        hits += first.setdefault(key, engine) == engine
    per: defaultdict[str, int] = defaultdict(int)
    for engine in run.engines:
        per[engine] += 1
    mean = sum(per.values()) / len(per)
    return 100.0 * hits / len(run.engines), max(per.values()) / mean


def bench(requests: int = 1600, trials: int = 3, sessions: int = SESSIONS) -> list[Row]:
    """``sessions``: the affinity runs' sessions (``PER_SESSION`` requests each)."""
    base = free_port_block(8, start=24300)
    fast = [base + 1 + i for i in range(4)]
    slow = base + 5
    gw = base
    runs: defaultdict[str, list[Run]] = defaultdict(list)
    with (
        tempfile.TemporaryDirectory(prefix="replicas-") as tmp,
        _engines([*fast, slow], [SERVICE_MS] * 4 + [SLOW_MS]),
    ):
        state = Path(tmp)
        for _ in range(trials):
            for n in (1, 2, 4):
                runs[f"x{n}"].append(_measure(state, gw, fast[:n], requests))
            mixed = [*fast[:3], slow]
            runs["least"].append(_measure(state, gw, mixed, requests))
            runs["rr"].append(_measure(state, gw, mixed, requests, "--round-robin"))
            tagged = sessions * PER_SESSION
            runs["affinity"].append(_measure(state, gw, fast, tagged, "--affinity"))
    return _rows(runs, sessions)


def _rows(runs: dict[str, list[Run]], sessions: int) -> list[Row]:
    one = [r.rps for r in runs["x1"]]
    rows = []
    for n, goal in ((2, 1.9), (4, 3.6)):
        ours = [r.rps for r in runs[f"x{n}"]]
        ratio = median(ours) / median(one)
        rows.append(
            Row(
                SECTION,
                f"throughput, {n} instances vs 1, {CLIENTS} clients "
                f"({SERVICE_MS:g} ms, {PER_ENGINE} at once per engine)",
                "/s",
                ours,
                one,
                "1 instance",
                f"≥ {goal}x",
                ratio >= goal,
            )
        )
    least = [r.p99_ms() for r in runs["least"]]
    rr = [r.p99_ms() for r in runs["rr"]]
    p99 = median(least) / median(rr)
    rows.append(
        Row(
            SECTION,
            f"p99, least-in-flight vs round-robin, 1 of 4 instances 5x slower "
            f"({SLOW_MS:g} ms; rps {median([r.rps for r in runs['least']]):.0f} vs "
            f"{median([r.rps for r in runs['rr']]):.0f})",
            "ms",
            least,
            rr,
            "round-robin",
            "≤ 0.5x",
            p99 <= 0.5,
        )
    )
    hit, spread = zip(*(_affinity(r) for r in runs["affinity"]), strict=True)
    rows.append(
        Row(
            SECTION,
            f"affinity: requests on their session's instance ({sessions} sessions x "
            f"{PER_SESSION}, 4 instances)",
            "%",
            list(hit),
            goal="≥ 99%",
            met=min(hit) >= 99.0,
        )
    )
    rows.append(
        Row(
            SECTION,
            "affinity: requests per instance, max over mean",
            "x",
            list(spread),
            goal="≤ 1.25",
            met=max(spread) <= 1.25,
        )
    )
    return rows
