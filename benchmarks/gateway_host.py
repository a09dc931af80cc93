"""The gateway alone, in a process of its own, routing to engines it is told of.

    python -m benchmarks.gateway_host --port 24300 --state DIR --engines 24301,24302
        [--affinity] [--round-robin]

The real gateway (``app.Gateway``: routes, table, balancer, proxy) fed the records of
one deployment ``bench`` (model ``pool``) whose replicas are the given engines, instead
of a daemon's records: the benchmark measures the data path, not a pass. With
``--round-robin`` the balancer's pick is a plain rotation, the baseline least-in-flight
is compared with; nothing else differs. It serves until SIGTERM.
"""

from __future__ import annotations

import argparse
import itertools
import random
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from controller.core.manifest.names import replica_name
from controller.core.state import Phase, Record
from controller.gateway.lifecycle.app import Gateway
from controller.gateway.routing import balance
from controller.gateway.settings import Settings

MODEL = "pool"


def records(ports: Sequence[int], affinity: bool) -> list[Record]:
    mode: Literal["none", "session"] = "session" if affinity else "none"
    return [
        Record(
            name=replica_name("bench", i),
            owner="bench",
            node="bench",
            nonce=f"n{i}",
            port=port,
            phase=Phase.READY,
            models=("bench", MODEL),
            affinity=mode,
            ready_deadline_seconds=10.0,
        )
        for i, port in enumerate(ports)
    ]


def round_robin() -> object:
    turn = itertools.count()

    def pick(
        candidates: Sequence[balance.T],
        inflight: Mapping[str | None, int],
        served: Mapping[str | None, int],
        rng: random.Random,
    ) -> balance.T:
        return candidates[next(turn) % len(candidates)]

    return pick


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--engines", required=True, help="comma-separated engine ports")
    parser.add_argument("--affinity", action="store_true")
    parser.add_argument("--round-robin", action="store_true")
    args = parser.parse_args(argv)
    if args.round_robin:
        setattr(balance, "pick", round_robin())  # noqa: B010 (the one thing swapped)
    ports = [int(p) for p in args.engines.split(",")]
    args.state.mkdir(parents=True, exist_ok=True)
    gateway = Gateway(
        Settings(host="127.0.0.1", port=args.port, state_dir=args.state, drain_grace=5)
    )
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    gateway.start(lambda: None)
    assert gateway.front is not None
    gateway.loop.call_soon_threadsafe(gateway.front.table.update, records(ports, args.affinity))
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    gateway.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
