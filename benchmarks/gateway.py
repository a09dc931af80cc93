"""The gateway's added latency against a direct connection and other proxies; on-demand cost.

    python -m benchmarks.gateway [--n 400] [--litellm /tmp/litellm-venv/bin/litellm]

Same stand-in engine, same load generator (aiohttp), one run: p50/p99
per request for 1 and 32 clients, non-streaming and streaming time-to-first-chunk,
direct vs through ``reconcile --listen``, nginx (if installed) and LiteLLM's proxy (if
given); throughput at 32 clients. Then OnDemand requests from Idle (``COLD``
deployments, one request each): request -> answer against the engine's own start
(spawn -> the first 200 of /health, polled every 2 ms by the benchmark itself).

The engine measured through (``hot``) is ``--engine lean`` by default: an asyncio
OpenAI-style stand-in with keep-alive (service_engine.py ``--openai``), so at 32 clients
the proxy, not the engine, is what saturates; ``--engine demo`` is the demo engine
(thread per connection, GIL-bound: at 32 clients it is its own bottleneck, and a proxy
that holds fewer engine connections can even beat the direct path; that is how this
benchmark once reported 1.52x nginx's throughput). The report names the gateway's loop.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import aiohttp
import psutil

from benchmarks.common import stop, this_tree
from benchmarks.gateway_baselines import KEY, litellm, nginx, python_proxy

PY = sys.executable
COLD = 5  # OnDemand deployments, each started once by a request
WARM = 10  # requests a load sends first, untimed (the CPU figure counts them)
LITELLM = "/tmp/litellm-venv/bin/litellm"
AUTH = {"Authorization": f"Bearer {KEY}"}


LEAN = [PY, str(Path(__file__).with_name("service_engine.py")), "--port", "{port}"]
LEAN += ["--service-ms", "0", "--openai"]


def _manifest(folder: Path, base: int, lean: bool) -> None:
    engine = [PY, "-m", "controller.demo.engine", "--port", "{port}", "--model", "{name}"]
    docs = []
    cold = {"activation": "OnDemand", "idleTimeout": "10m"}
    for name, extra in (("hot", {}), *((f"cold{i}", cold) for i in range(COLD))):
        command = LEAN if lean and name == "hot" else [*engine, "--chunks", "3"]
        docs.append(
            {
                "apiVersion": "reconcile/v1",
                "kind": "Deployment",
                "metadata": {"name": name},
                "spec": {
                    "engine": "command",
                    "command": command,
                    "basePort": base,
                    "readiness": {"httpGet": {"path": "/health"}, "periodSeconds": 0.1},
                    "stopGracePeriodSeconds": 2,
                    **extra,
                },
            }
        )
    (folder / "bench.yaml").write_text("\n---\n".join(json.dumps(d) for d in docs))


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] * 1000


async def _one(session: aiohttp.ClientSession, url: str, stream: bool) -> float:
    body = {"model": "hot", "messages": [], "stream": stream}
    t = time.perf_counter()
    async with session.post(url, json=body, headers=AUTH) as resp:
        if stream:
            await resp.content.readany()
            first = time.perf_counter() - t
            await resp.read()
            return first
        await resp.read()
    return time.perf_counter() - t


async def _load(url: str, clients: int, n: int, stream: bool) -> tuple[list[float], float]:
    times: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for _ in range(WARM):
            await _one(session, url, stream)  # warm up
        per = n // clients

        async def client() -> None:
            for _ in range(per):
                times.append(await _one(session, url, stream))

        t = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        return times, len(times) / (time.perf_counter() - t)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=400)
    parser.add_argument("--litellm", default=LITELLM, help="LiteLLM's CLI (skipped if absent)")
    parser.add_argument("--engine", choices=("lean", "demo"), default="lean")
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="gwbench-"))
    (tmp / "m").mkdir()
    base, listen = 24100, 24199
    _manifest(tmp / "m", base, args.engine == "lean")
    common = ["--state-dir", str(tmp / "st"), "--node", f"gwbench-{os.getpid()}", "--devices", ""]
    cli = [PY, "-m", "controller", "-f", str(tmp / "m"), *common]
    env = this_tree(dict(os.environ))
    daemon = subprocess.Popen(
        [*cli, "--listen", str(listen), "--resync", "1h"],
        stderr=open(tmp / "daemon.log", "wb"),  # noqa: SIM115 (lives as long as the daemon)
        env=env,
    )
    try:
        hot = _wait_ready(tmp, "hot")
        with (
            nginx(tmp, hot, listen - 1) as ng,
            litellm(tmp, args.litellm, hot, listen - 2) as ll,
            python_proxy("bare", tmp, hot, listen - 3) as bare,
            python_proxy("raw", tmp, hot, listen - 4) as raw,
            python_proxy("asgi", tmp, hot, listen - 5) as asgi,
            python_proxy("h1", tmp, hot, listen - 6) as h1,
            python_proxy("work", tmp, hot, listen - 7) as work,
            python_proxy("served", tmp, hot, listen - 8) as served,
        ):
            proxies = {
                "reconcile": f"http://127.0.0.1:{listen}",
                "nginx": ng,
                "bare aiohttp": bare,
                "raw python": raw,
                "httptools h1": h1,
                "work floor": work,
                "work on our server": served,
                "uvicorn asgi": asgi,
                "litellm": ll,
            }
            rows, figures, cpu = _table(f"http://127.0.0.1:{hot}", proxies, args.n)
        print(
            "| kind | clients | proxy | direct p50/p99 ms | proxied p50/p99 ms "
            "| added p50/p99 ms | rps ratio | proxy CPU µs/request |"
        )
        print("|---|---|---|---|---|---|---|---|")
        print("\n".join(rows))
        skipped = [name for name, url in proxies.items() if url is None]
        if skipped:
            print(f"not run (not installed or did not start): {', '.join(skipped)}")
        print("\n".join(_goals(figures, cpu)))
        print(f"engine: {args.engine}; gateway loop: {_loop(tmp)}")
        print(_cold_report(tmp, listen))
    finally:
        stop(daemon, timeout=30)  # SIGTERM; a stuck one is killed before `down`
        # --gateway: a gateway left behind would share the port with the next run's.
        subprocess.run([*cli, "down", "--gateway"], capture_output=True, timeout=60, env=env)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


Figures = dict[tuple[bool, int, str], tuple[float, float]]  # (stream, clients, proxy)
CpuCost = dict[tuple[bool, int, str], float]  # CPU microseconds a request, in the proxy


def _table(
    direct_url: str, proxies: dict[str, str | None], n: int
) -> tuple[list[str], Figures, CpuCost]:
    """The table's rows, per (stream, clients, proxy) its p50 ms and requests/s
    (``direct`` among them), and the CPU each proxy's processes spent per request: unlike
    latency, a figure that other work on a shared box barely moves."""
    rows = []
    figures: Figures = {}
    cpu: CpuCost = {}
    path = "/v1/chat/completions"
    for stream in (False, True):
        for clients in (1, 32):
            direct, d_rps = asyncio.run(_load(direct_url + path, clients, n, stream))
            figures[(stream, clients, "direct")] = (_pct(direct, 0.5), d_rps)
            for name, url in proxies.items():
                if url is None:
                    continue
                pids = _listeners(url)
                spent = _cpu_seconds(pids)
                via, rps = asyncio.run(_load(url + path, clients, n, stream))
                per = (_cpu_seconds(pids) - spent) / (len(via) + WARM) * 1e6
                figures[(stream, clients, name)] = (_pct(via, 0.5), rps)
                cpu[(stream, clients, name)] = per
                rows.append(
                    f"| {'stream TTFB' if stream else 'request'} | {clients} | {name} "
                    f"| {_pct(direct, 0.5):.2f} / {_pct(direct, 0.99):.2f} "
                    f"| {_pct(via, 0.5):.2f} / {_pct(via, 0.99):.2f} "
                    f"| {_pct(via, 0.5) - _pct(direct, 0.5):+.2f} / "
                    f"{_pct(via, 0.99) - _pct(direct, 0.99):+.2f} "
                    f"| {rps / d_rps:.2f} | {per:.0f} |"
                )
    return rows, figures, cpu


def _listeners(url: str) -> list[int]:
    """The processes listening on ``url``'s port (nginx: its master and worker; reconcile:
    the gateway process, not the daemon)."""
    port = int(url.rsplit(":", 1)[1])
    return sorted(
        {c.pid for c in psutil.net_connections("tcp")
         if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid}
    )  # fmt: skip


def _cpu_seconds(pids: list[int]) -> float:
    """CPU time spent so far by ``pids``' threads: the scheduler's nanosecond count where
    /proc has it (psutil's figures move in 10 ms ticks, too coarse for a few hundred
    requests), else psutil's. A thread that ends during a load is missed; the proxies'
    threads (a request log's writer, an executor's workers) live as long as they do."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError):
            tasks = list(Path(f"/proc/{pid}/task").glob("*/schedstat"))
            if not tasks:
                times = psutil.Process(pid).cpu_times()
                total += times.user + times.system
            for task in tasks:
                with contextlib.suppress(OSError):  # a thread that ended meanwhile
                    total += int(task.read_text().split()[0]) / 1e9
    return total


def _goals(figures: Figures, cpu: CpuCost) -> list[str]:
    """The gateway's goals against nginx and LiteLLM (issue 22), each met or not."""
    ours = "reconcile"
    out = ["goals (reconcile against the others, this run):"]
    if (False, 1, "nginx") not in figures:
        return [*out, "  nginx not run (apt-get install nginx): its three goals not measured"]

    def said(what: str, value: float, goal: str, met: bool) -> str:
        return f"  {what}: {value:.2f} (goal {goal}) {'met' if met else 'NOT met'}"

    p50 = figures[(False, 1, ours)][0] / figures[(False, 1, "nginx")][0]
    rps = figures[(False, 32, ours)][1] / figures[(False, 32, "nginx")][1]
    first = figures[(True, 1, ours)][0] - figures[(True, 1, "nginx")][0]
    out.append(said("p50 at 1 client, x nginx's", p50, "<= 1.30", p50 <= 1.3))
    out.append(said("requests/s at 32 clients, x nginx's", rps, ">= 0.90", rps >= 0.9))
    out.append(said("stream first chunk p50, ms past nginx's", first, "<= 1.00", first <= 1.0))
    if (False, 1, "work floor") in figures:
        floor = figures[(False, 1, "work floor")][0] / figures[(False, 1, "nginx")][0]
        floor_rps = figures[(False, 32, "work floor")][1] / figures[(False, 32, "nginx")][1]
        out.append(
            f"  the same two for the work floor (the gateway's work, flat): p50 x{floor:.2f}, "
            f"requests/s x{floor_rps:.2f}"
        )
    out.extend(_split(figures, cpu))
    if (False, 1, "litellm") in figures:
        direct = figures[(False, 1, "direct")][0]
        added = (figures[(False, 1, ours)][0] - direct) / (
            figures[(False, 1, "litellm")][0] - direct
        )
        out.append(said("added p50 at 1 client, x LiteLLM's", added, "<= 0.25", added <= 0.25))
    else:
        out.append("  LiteLLM not run (--litellm PATH/bin/litellm): its goal not measured")
    return out


def _split(figures: Figures, cpu: CpuCost) -> list[str]:
    """Where the gateway's distance from nginx lies: each Python floor against nginx at one
    client (p50) and 32 (requests/s), and the CPU each spends on a request. ``raw python``
    is what the interpreter and the loop alone cost, ``bare aiohttp`` adds the framework,
    ``reconcile`` the gateway's own work; ``httptools h1`` (a server of one's own on
    httptools) and ``uvicorn asgi`` are the other servers a data path could stand on,
    with no work of their own; ``work floor`` is h1 doing the gateway's work, flat, and
    ``work on our server`` the same work on the gateway's own server and messages."""
    kinds = (
        "raw python", "httptools h1", "work floor", "work on our server", "uvicorn asgi",
        "bare aiohttp", "reconcile",
    )  # fmt: skip
    names = [n for n in kinds if (False, 1, n) in figures]
    if (False, 1, "nginx") not in figures or len(names) < 2:
        return ["  a Python baseline did not start: no split of the gap"]
    nginx_p50, nginx_rps = figures[(False, 1, "nginx")][0], figures[(False, 32, "nginx")][1]
    p50 = ", ".join(f"{n} {figures[(False, 1, n)][0] - nginx_p50:+.2f}" for n in names)
    rps = ", ".join(f"{n} {figures[(False, 32, n)][1] / nginx_rps:.2f}" for n in names)
    spent = "; ".join(
        f"{n} {cpu[(False, 1, n)]:.0f} / {cpu[(False, 32, n)]:.0f}" for n in ["nginx", *names]
    )
    return [
        f"  p50 at 1 client, ms past nginx's: {p50}",
        f"  requests/s at 32 clients, x nginx's: {rps}",
        f"  CPU µs a request at 1 / 32 clients: {spent}",
    ]


def _loop(tmp: Path) -> str:
    """The gateway's event loop, from its start line in the daemon's log."""
    for path in tmp.rglob("*.log"):
        for line in path.read_text(errors="replace").splitlines():
            if "gateway listening" in line:
                return "uvloop" if "uvloop" in line else "asyncio"
    return "not found in the logs"


def _cold_report(tmp: Path, listen: int) -> str:
    samples = [asyncio.run(_cold(tmp, listen, f"cold{i}")) for i in range(COLD)]
    med = statistics.median
    return "\n".join(
        [
            f"on-demand from Idle ({len(samples)} deployments, one request each; median ms):",
            f"  request -> answer {med(s[0] for s in samples):.0f}; "
            f"engine spawn -> /health 200 {med(s[1] for s in samples):.0f}; "
            f"overhead {med(s[0] - s[1] for s in samples):.0f} "
            f"(request -> spawn {med(s[2] for s in samples):.0f}, "
            f"engine ready -> answer {med(s[3] for s in samples):.0f})",
            "  each overhead: " + ", ".join(f"{s[0] - s[1]:.0f}" for s in samples),
        ]
    )


async def _cold(tmp: Path, listen: int, name: str) -> tuple[float, float, float, float]:
    """(request -> answer, spawn -> ready, request -> spawn, ready -> answer), in ms."""
    url = f"http://127.0.0.1:{listen}/v1/chat/completions"
    record = tmp / "st" / "instances" / f"{name}.json"
    async with aiohttp.ClientSession() as session:
        t0 = time.time()
        watch = asyncio.create_task(_first_ready(session, record))
        async with session.post(url, json={"model": name}) as resp:
            said = await resp.read()
            done = time.time()
            assert resp.status == 200, (resp.status, said[:300])
        started, ready = await watch
    ms = 1000.0
    return (done - t0) * ms, (ready - started) * ms, (started - t0) * ms, (done - ready) * ms


async def _first_ready(session: aiohttp.ClientSession, path: Path) -> tuple[float, float]:
    """(the engine's spawn, the first 200 of its /health), wall clock."""
    while (found := _starting(path)) is None:
        await asyncio.sleep(0.002)
    port, started = found
    while True:
        try:
            async with session.get(f"http://127.0.0.1:{port}/health") as resp:
                if resp.status == 200:
                    return started, time.time()
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.002)


def _starting(path: Path) -> tuple[int, float] | None:
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if rec.get("started_at") is None or rec.get("port") is None:
        return None
    return int(rec["port"]), datetime.fromisoformat(rec["started_at"]).timestamp()


def _wait_ready(tmp: Path, name: str) -> int:
    path = tmp / "st" / "instances" / f"{name}.json"
    for _ in range(600):
        try:
            rec = json.loads(path.read_text())
            if rec["phase"] == "Ready":
                return int(rec["port"])
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise SystemExit(f"{name} never became Ready; see {tmp}/daemon.log")


if __name__ == "__main__":
    sys.exit(main())
