"""The gateway under fuzzed raw requests (gatewayfuzz.py): it never falls over, every
JSON answer for ``/v1/`` is an OpenAI error or the engine's own, it never answers a
500 itself, and its log holds no traceback, no error-level line, no key fragment.
A sample runs by default; the full 10,000 with the soak (``-m slow``).
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from . import figures
from .cluster import Cluster
from .gatewayfuzz import MAX_BODY, Case, cases
from .rawhttp import Raw, exchange, leaked, openai_error, request

KEY = "sk-Fz9QwErTyUiOpAsDgHjKm"  # no hex, no word: a 6-character run cannot match by chance
SAMPLE = 200
FULL = 10_000
THREADS = 8


def start(cluster: Cluster, replicas: int = 1) -> tuple[Any, int]:
    command = [sys.executable, "-m", "controller.demo.engine", "--port", "{port}"]
    readiness = {"httpGet": {"path": "/health"}, "deadlineSeconds": 30, "periodSeconds": 0.2}
    cluster.write(
        "m", command=[*command, "--model", "{name}"], readiness=readiness, replicas=replicas
    )
    keys = cluster.tmp / "keys.txt"
    keys.write_text(KEY + "\n")
    os.chmod(keys, 0o600)
    port = cluster.base_port + 40
    proc = cluster.start(
        "-v", "--listen", str(port), "--api-keys", str(keys), "--max-body", str(MAX_BODY)
    )
    ask = request("POST", "/v1/completions", b'{"model": "m"}', {"x-api-key": KEY})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, cluster.stderr(proc)[-3000:]
        try:
            if exchange(port, ask, timeout=2).status == 200:
                return proc, port
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"the gateway never served m:\n{cluster.stderr(proc)[-3000:]}")


def check(case: Case, answer: Raw) -> str | None:
    """What is wrong with this answer, or None."""
    if leaked(answer.data.decode("latin-1"), [KEY]):
        return "a key fragment in the answer"
    if answer.status is None:
        return None  # closed without an answer (a half-sent request, or garbage)
    engine = answer.headers.get("server", "").startswith("BaseHTTP")
    if answer.status >= 500 and not engine:  # every case is the client's error
        return f"the gateway answered {answer.status}"
    shown = answer.is_json() and answer.body  # HEAD: headers only
    if case.v1 and shown and not engine and openai_error(answer) is None and not _list(answer):
        return "a JSON answer that is not an OpenAI error"
    return None


def _list(answer: Raw) -> bool:
    """The gateway's own ``/v1/models`` answer."""
    try:
        value = answer.json()
    except ValueError:
        return False
    return isinstance(value, dict) and value.get("object") == "list"


def run(cluster: Cluster, count: int) -> Counter[str]:
    proc, port = start(cluster)

    def one(case: Case) -> tuple[Case, Raw, str | None]:
        answer = exchange(port, case.data, timeout=15, complete=case.complete)
        return case, answer, check(case, answer)

    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(one, cases(seed=28, count=count, key=KEY)))
    bad = [(c.index, why, c.data[:120], a.status, a.body[:300]) for c, a, why in results if why]
    assert not bad, bad[:5]
    answered = sum(1 for _, a, _ in results if a.status is not None)
    assert answered > count // 2, answered  # most cases are whole requests: answered
    assert exchange(port, request("GET", "/healthz")).status == 200
    assert proc.poll() is None
    proc.terminate()
    assert proc.wait(timeout=30) == 0
    log = cluster.stderr(proc)
    assert "Traceback" not in log and "Error handling request" not in log, log[-3000:]
    assert '"level": "error"' not in log and '"level": "critical"' not in log, log[-3000:]
    assert not leaked(log, [KEY]), leaked(log, [KEY])
    return Counter(str(a.status) for _, a, _ in results)


def test_gateway_fuzz_sample(cluster: Cluster) -> None:
    run(cluster, SAMPLE)


@pytest.mark.slow
def test_gateway_fuzz_full(cluster: Cluster) -> None:
    began = time.monotonic()
    statuses = run(cluster, FULL)
    figures.report(
        "gateway_fuzz",
        requests=FULL,
        seconds=round(time.monotonic() - began),
        answered=FULL - statuses["None"],
        gateway_5xx=0,
        statuses=dict(sorted(statuses.items())),
    )
