"""What a stopping gateway does with the requests it still holds (an in-process gateway,
a real echo engine): handed over, it finishes them however long they take; stopped, or
bounded by a SIGTERM meanwhile, it cuts what is left past its drain grace, and a cut
request says so to its client: an event stream's last event, a 503 where nothing of the
answer went out, never a bare close."""

from __future__ import annotations

import http.client
import json
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from procs import free_ports
from test_upstream import ready, route

from controller.core.state import ProbeConfig
from controller.gateway.lifecycle.app import Gateway
from controller.gateway.settings import Settings

ECHO = Path(__file__).with_name("echo_engine.py")
GRACE = 0.5  # seconds of drain grace here (120 in production)
CHAT = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


class Held:
    """An echo engine whose streams hold their end (``tokens``) and whose answers hold
    their head (``prefill``) while those files exist, routed as ``m`` by ``gateway``."""

    def __init__(self, reconcile: Any, gateway: Gateway) -> None:
        self.tokens, self.prefill = reconcile.tmp / "tokens", reconcile.tmp / "prefill"
        port = free_ports(1)
        argv = [sys.executable, str(ECHO), "--port", str(port), "--model", "m"]
        files = ["--hold-while", str(self.tokens), "--head-while", str(self.prefill)]
        reconcile.spawn([*argv, *files])
        reconcile.wait_for(lambda: _up(port), what="the echo engine")
        health = ProbeConfig(http=(("/health", None),))
        route(gateway, replace(ready("m", "n0", port), probe=health))
        self.port = gateway.settings.port


@pytest.fixture
def gateway(reconcile: Any) -> Iterator[Gateway]:
    reconcile.state.mkdir(parents=True, exist_ok=True)
    settings = Settings(
        host="127.0.0.1", port=free_ports(1), state_dir=reconcile.state, drain_grace=GRACE
    )
    g = Gateway(settings)
    g.start(lambda: None)
    yield g
    g.stop()  # nothing left when a test stopped it already


def test_past_the_drain_grace_a_stream_ends_with_an_error_event_and_a_waiting_answer_503(
    reconcile: Any, gateway: Gateway
) -> None:
    held = Held(reconcile, gateway)
    held.tokens.touch()
    stream, answer = _begun(held.port)
    held.prefill.touch()
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(_post, held.port)
        reconcile.wait_for(lambda: _inflight(gateway) == 2, what="both requests at the engine")
        gateway.stop_accepting()
        gateway.stop("SIGTERM")
        status, said = waiting.result()
    assert status == 503 and said["error"]["code"] == "gateway_stopping", said
    body = answer.read()  # whole: no IncompleteRead, the chunked stream was ended
    stream.close()
    last = body.strip().split(b"\n\n")[-1]
    assert last.startswith(b"data: "), body
    error = json.loads(last[len(b"data: ") :])["error"]
    assert error["code"] == "gateway_stopping" and "SIGTERM" in error["message"], body


def test_a_handed_over_drain_finishes_a_stream_past_the_grace_until_a_bound_is_set(
    reconcile: Any, gateway: Gateway
) -> None:
    held, first, first_answer, closing = _handed_over_streaming(reconcile, gateway)
    # Past the grace a stop would have cut it at: still streaming, not cut.
    until = time.monotonic() + 3 * GRACE
    reconcile.wait_for(lambda: time.monotonic() > until, what="three grace periods")
    assert not closing.done() and _inflight(gateway) == 1
    held.tokens.unlink()
    assert first_answer.read().endswith(b"data: [DONE]\n\n")  # whole, as the engine sent it
    first.close()
    closing.result(timeout=10)
    gateway.end_stop()


def test_a_bound_set_during_a_handed_over_drain_cuts_with_an_error_event(
    reconcile: Any, gateway: Gateway
) -> None:
    _, stream, answer, closing = _handed_over_streaming(reconcile, gateway)
    gateway.bound_drain(GRACE)  # `reconcile gateway stop` meanwhile: the process's SIGTERM
    closing.result(timeout=10)
    gateway.end_stop()
    body = answer.read()
    stream.close()
    assert b'"gateway_stopping"' in body.strip().split(b"\n\n")[-1], body


def _handed_over_streaming(
    reconcile: Any, gateway: Gateway
) -> tuple[Held, http.client.HTTPConnection, http.client.HTTPResponse, Future[None]]:
    """A stream begun (its end held), then the gateway handed over: draining, no bound."""
    held = Held(reconcile, gateway)
    held.tokens.touch()
    conn, answer = _begun(held.port)
    gateway.stop_accepting()
    closing = gateway.begin_stop("handed over", None)
    assert closing is not None
    return held, conn, answer, closing


def _up(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def _begun(port: int) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """A streamed chat whose head came (its first chunks follow; its end is held)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(CHAT))
    answer = conn.getresponse()
    assert answer.status == 200 and answer.getheader("Content-Type") == "text/event-stream"
    return conn, answer


def _post(port: int) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps({**CHAT, "stream": False}))
        answer = conn.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        conn.close()


def _inflight(gateway: Gateway) -> int:
    assert gateway.front is not None
    return sum(gateway.front.table.inflight.values())
