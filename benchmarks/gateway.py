"""The gateway's added latency over a direct connection, and on-demand start cost.

    python -m benchmarks.gateway [--n 400]

Same fake engine (the demo engine), same load generator (aiohttp), one run:
p50/p99 per request for 1 client and 32 clients, non-streaming and streaming
time-to-first-chunk, direct vs through ``reconcile --listen``; throughput at 32
clients; an OnDemand request from Idle: request -> answer vs the engine's own
start (spawn -> Ready in its record). nginx/LiteLLM are not run here (see RESULTS.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import aiohttp

PY = sys.executable


def _manifest(folder: Path, base: int) -> None:
    engine = [PY, "-m", "controller.demo.engine", "--port", "{port}", "--model", "{name}"]
    docs = []
    for name, extra in (("hot", {}), ("cold", {"activation": "OnDemand", "idleTimeout": "10m"})):
        docs.append(
            {
                "apiVersion": "reconcile/v1",
                "kind": "Deployment",
                "metadata": {"name": name},
                "spec": {
                    "engine": "command",
                    "command": [*engine, "--chunks", "3"],
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
    async with session.post(url, json=body) as resp:
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
        for _ in range(10):
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
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="gwbench-"))
    (tmp / "m").mkdir()
    base, listen = 24100, 24199
    _manifest(tmp / "m", base)
    common = ["--state-dir", str(tmp / "st"), "--node", f"gwbench-{os.getpid()}", "--devices", ""]
    cli = [PY, "-m", "controller", "-f", str(tmp / "m"), *common]
    daemon = subprocess.Popen(
        [*cli, "--listen", str(listen), "--resync", "1h"],
        stderr=open(tmp / "daemon.log", "wb"),  # noqa: SIM115 (lives as long as the daemon)
    )
    try:
        hot = _wait_ready(tmp, "hot")
        rows = []
        for stream in (False, True):
            for clients in (1, 32):
                direct, d_rps = asyncio.run(
                    _load(f"http://127.0.0.1:{hot}/v1/chat/completions", clients, args.n, stream)
                )
                via, g_rps = asyncio.run(
                    _load(f"http://127.0.0.1:{listen}/v1/chat/completions", clients, args.n, stream)
                )
                rows.append(
                    f"| {'stream TTFB' if stream else 'request'} | {clients} "
                    f"| {_pct(direct, 0.5):.2f} / {_pct(direct, 0.99):.2f} "
                    f"| {_pct(via, 0.5):.2f} / {_pct(via, 0.99):.2f} "
                    f"| {_pct(via, 0.5) - _pct(direct, 0.5):+.2f} "
                    f"| {g_rps / d_rps:.2f} |"
                )
        t = time.perf_counter()
        out = asyncio.run(_cold(listen))
        total = (time.perf_counter() - t) * 1000
        rec = json.loads((tmp / "st" / "instances" / "cold.json").read_text())
        start = datetime.fromisoformat(rec["started_at"])
        ready = datetime.fromisoformat(rec["ready_at"])
        engine_ms = (ready - start).total_seconds() * 1000
        print(
            "| kind | clients | direct p50/p99 ms | gateway p50/p99 ms | added p50 ms | rps ratio |"
        )
        print("|---|---|---|---|---|---|")
        print("\n".join(rows))
        print(
            f"\non-demand from Idle: request -> answer {total:.0f} ms; engine spawn -> Ready "
            f"{engine_ms:.0f} ms; overhead {total - engine_ms:.0f} ms (status {out})"
        )
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
        subprocess.run([*cli, "down"], capture_output=True, timeout=60)
    return 0


async def _cold(listen: int) -> int:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"http://127.0.0.1:{listen}/v1/chat/completions", json={"model": "cold"}
        ) as resp,
    ):
        await resp.read()
        return resp.status


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
