"""Run every benchmark, print one table, keep the raw figures.

    python -m benchmarks            # the full run (under 10 minutes on 2 cores)
    python -m benchmarks --quick    # tiny N, few trials: checks that it all runs
    python -m benchmarks --only startup,steady
    python -m benchmarks --only placement   # memory packing and plan time (pure, ~1 min)
    python -m benchmarks --only replicas    # pools through the gateway: scaling, p99, affinity
    python -m benchmarks --only autoscale   # load step to the new replica Ready
    python -m benchmarks --only ray     # the ray backend next to the local one (pip: .[ray])
    python -m benchmarks --only pull    # model pulls: vs curl, resume cost, Ready from cache
    python -m benchmarks --only health  # a hung engine (SIGSTOP) to its replacement
    python -m benchmarks --only tls     # HTTPS vs plain HTTP through the gateway (ratio)
    python -m benchmarks --only containers  # an engine in a podman container vs podman run
    python -m benchmarks --only git     # a commit pushed to the engine exec'd: webhook, polling
    python -m benchmarks --only routing # TTFT, 2 real llama.cpp replicas: prefix vs none, session

Raw output goes to ``benchmarks/out/<UTC stamp>/`` (results.json, table.md); a full
run also rewrites ``benchmarks/RESULTS.md`` (date, machine, the table).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from benchmarks import common
from benchmarks.common import HERE, Row, engine_startup_ms
from benchmarks.report import machine, render_table, write_results

SECTIONS = (
    "startup",
    "steady",
    "lock",
    "watch",
    "cold",
    "placement",
    "verbs",
    "replicas",
    "autoscale",
    "pull",
    "health",
    "ray",
    "tls",
    "containers",
    "git",
    "routing",
)
# Run unless --only says otherwise; "ray" needs `pip install -e '.[ray]'` and starts a local
# Ray cluster (~2 minutes more): run it with `--only ray`. "tls" (issue 39's figure) runs
# with `--only tls`. "containers" needs podman (and imports an image): `--only containers`.
# "git" (issue 37's figure: ~1.5 minutes for 20 pushes per mode) runs with `--only git`.
# "routing" (issue 41's: real llama.cpp servers, minutes) runs with `--only routing`.
OPTIONAL = ("ray", "tls", "containers", "git", "routing")
DEFAULT = tuple(s for s in SECTIONS if s not in OPTIONAL)


def _plan(quick: bool) -> dict[str, Callable[[], list[Row]]]:
    from benchmarks import (
        autoscaling,
        coldstart,
        containers,
        gitbench,
        liveness,
        lockbench,
        placement,
        pullbench,
        raybench,
        readverbs,
        replicas,
        routing,
        startup,
        steady,
        tlsbench,
        watch,
    )

    if quick:
        return {
            "startup": lambda: startup.bench(3),
            "steady": lambda: steady.bench([0, 1, 2], 1)[0],
            "lock": lambda: lockbench.bench(2, 10, 1),
            "watch": lambda: watch.bench(1, engine_startup_ms(2)),
            "cold": lambda: coldstart.bench(1, 1),
            "placement": lambda: placement.bench(100, trials=1, orders=5),
            "verbs": lambda: readverbs.bench(1, status_n=2, once_n=2),
            "replicas": lambda: replicas.bench(100, 1, sessions=32),
            "autoscale": lambda: autoscaling.bench(1),
            "pull": lambda: pullbench.bench(8, 1, warm=False),
            "health": lambda: liveness.bench(1),
            "ray": lambda: raybench.bench(2, 3),
            "tls": lambda: tlsbench.bench(10),
            "containers": lambda: containers.bench(1),
            "git": lambda: gitbench.bench(2),
            "routing": lambda: routing.bench(routing.QUICK),
        }
    return {
        "startup": lambda: startup.bench(30),
        "steady": lambda: steady.bench([0, 10, 100, 1000], 9)[0],
        "lock": lambda: lockbench.bench(8, 500, 1),
        "watch": lambda: watch.bench(20, engine_startup_ms(10)),
        "cold": lambda: coldstart.bench(20, 5),
        "placement": lambda: placement.bench(1000),
        "verbs": lambda: readverbs.bench(15),
        "replicas": lambda: replicas.bench(1600, 3),
        "autoscale": lambda: autoscaling.bench(3),
        "pull": lambda: pullbench.bench(200, 9),
        "health": lambda: liveness.bench(3),
        "ray": lambda: raybench.bench(20, 9),  # needs pip install -e '.[ray]'
        "tls": lambda: tlsbench.bench(300),
        "containers": lambda: containers.bench(25),  # needs podman
        "git": lambda: gitbench.bench(20),
        "routing": lambda: routing.bench(routing.FULL),  # needs llama-server (built, cached)
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny N and few trials")
    parser.add_argument("--only", default=",".join(DEFAULT), help=f"some of {SECTIONS}")
    parser.add_argument("--out", type=Path, default=HERE / "out", help="raw output folder")
    args = parser.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {unknown}; choose from {', '.join(SECTIONS)}")
    # A SIGTERM (`timeout`, a CI's cancel) ends the run as an exception would: each
    # section's `finally` stops the engines and daemons it started (the default action
    # left their stand-in engines running).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = args.out / stamp
    out.mkdir(parents=True, exist_ok=True)
    common.raw_dir = out / "logs"
    rows: list[Row] = []
    timings: dict[str, float] = {}
    plan = _plan(args.quick)
    started = time.monotonic()
    for name in only:
        print(f"benchmarks: {name} ...", file=sys.stderr, flush=True)
        t = time.monotonic()
        rows += plan[name]()
        timings[name] = round(time.monotonic() - t, 1)
        (out / "results.json").write_text(_dump(rows, timings, args.quick))
    total = round(time.monotonic() - started, 1)
    table = render_table(rows)
    print(table)
    print(f"\n{total:.0f} s in all; raw output in {out}", file=sys.stderr)
    (out / "table.md").write_text(table + "\n")
    if not args.quick and only == list(DEFAULT):
        write_results(HERE / "RESULTS.md", table, total, stamp)
    return 0


def _dump(rows: list[Row], timings: dict[str, float], quick: bool) -> str:
    data = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "python": sys.version,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "quick": quick,
        "section_seconds": timings,
        "rows": [r.as_json() for r in rows],
    }
    return json.dumps(data, indent=1)


if __name__ == "__main__":
    sys.exit(main())
