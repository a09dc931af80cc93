"""The daemon under churn with the gateway under load: manifests rewritten, added,
scaled and removed, engines SIGKILLed, while two clients send requests for a deployment
of 2 replicas (whose engines are killed too). The daemon and its gateway never restart,
no pass tracebacks, every request to the replicated deployment is served (a killed
replica's requests go to the other), and once the churn stops every declared
deployment converges with no invariant broken. CI: 20 s; the soak: 10 minutes
(``HARNESS_CHURN_SECONDS``).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter

import procs
import pytest

from controller.core.manifest.names import replica_name
from controller.core.state import Phase

from . import figures
from .churn import crash, random_churn
from .cluster import Cluster
from .invariants import describe, read_records, violations
from .rawhttp import exchange, request
from .test_gateway_fuzz import KEY, start

SAMPLE_SECONDS = 20.0
SOAK_SECONDS = float(os.environ.get("HARNESS_CHURN_SECONDS", "600"))
OTHERS = 2  # devices left for the churned deployments (4 in all; "m" holds 2)


class Clients:
    def __init__(self, port: int) -> None:
        self.port = port
        self.stats: Counter[str] = Counter()
        self.failed: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        ask = request(
            "POST", "/v1/completions", b'{"model": "m", "prompt": "hi"}', {"x-api-key": KEY}
        )
        while not self.stop.is_set():
            try:
                answer = exchange(self.port, ask, timeout=30)
            except OSError as exc:
                answer = None
                self.failed.append(repr(exc))
            if answer is not None and answer.status == 200:
                self.stats["ok"] += 1
            elif answer is not None:
                self.failed.append(f"HTTP {answer.status}: {answer.body[:200]!r}")


def _both_ready(cluster: Cluster) -> bool:
    records = read_records(cluster.state)[0]
    return all(n in records and records[n].phase is Phase.READY for n in ("m", "m@1"))


def churn(cluster: Cluster, seconds: float) -> dict[str, object]:
    daemon, port = start(cluster, replicas=2)
    gateways = procs.marked_pids(f"{cluster.node}/", marker=procs.GATEWAY_MARKER)
    clients = Clients(port)
    threads = [threading.Thread(target=clients.run, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    rng = random.Random(os.environ.get("HARNESS_SEED", "26"))
    done: Counter[str] = Counter()
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        for what in random_churn(cluster, rng, "a", most=OTHERS, keep=frozenset({"m"})):
            done[what.split()[0]] += 1
        # A replica of the served deployment, as an OOM killer would, while the other is
        # Ready: killed faster than its back-off (10 s, 20 s ... 300 s) lets it return,
        # both replicas were once down together and 245 requests of 10 minutes failed.
        if rng.random() < 0.2 and _both_ready(cluster):
            crash(cluster, replica_name("m", rng.randrange(2)))
            done["crash m"] += 1
        time.sleep(rng.uniform(0.3, 1.5))
    clients.stop.set()
    for t in threads:
        t.join(timeout=60)
    assert daemon.poll() is None, cluster.stderr(daemon)[-3000:]
    assert procs.marked_pids(f"{cluster.node}/", marker=procs.GATEWAY_MARKER) == gateways
    assert "Traceback" not in cluster.stderr(daemon), cluster.stderr(daemon)[-3000:]
    converge = cluster.run("--once", "--wait", "--timeout", "300s", timeout=400)
    assert converge.code == 0, str(converge)
    assert violations(cluster) == [], describe(cluster)
    failed = Counter(f[:90] for f in clients.failed)
    assert clients.failed == [], (len(clients.failed), clients.stats["ok"], failed)
    return {"requests_ok": clients.stats["ok"], "requests_failed": 0, **done}


@pytest.mark.slow  # ~30 s: the default run's budget (15 min); the soak is its long form
def test_churn_under_load_sample(cluster: Cluster) -> None:
    churn(cluster, SAMPLE_SECONDS)


@pytest.mark.slow
def test_churn_soak(cluster: Cluster) -> None:
    began = time.monotonic()
    done = churn(cluster, SOAK_SECONDS)
    figures.report(
        "daemon_churn",
        seconds=round(time.monotonic() - began),
        **done,
        daemon_restarts=0,
        gateway_restarts=0,
        violations=0,
    )
