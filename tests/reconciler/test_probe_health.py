"""Completion probes and liveness probing against real servers on loopback.

The OpenAI stand-in (``controller.demo.engine``, the engine of the daemon and gateway
tests) runs as a real process; a stopped one (SIGSTOP: it accepts, never answers) is
the hung engine a liveness probe is for. The probe's timeout bounds the whole request.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from procs import free_ports, wait_for

from controller.core.state import Phase, ProbeConfig, ProbeResult, Record, RecordView
from controller.host.probes import MAX_TOKENS, ProbeTarget, http_get, probe
from controller.reconciler.liveness import LivenessProber

CHAT = ProbeConfig(completion="/v1/chat/completions", model="demo", timeout_seconds=2.0)
TEXT = ProbeConfig(completion="/v1/completions", model="demo", timeout_seconds=2.0)


@pytest.fixture
def engine() -> Iterator[subprocess.Popen[bytes]]:
    """The OpenAI stand-in on a free port (``.port``), serving."""
    port = free_ports(1)
    argv = [sys.executable, "-m", "controller.demo.engine", "--port", str(port)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc.port = port  # type: ignore[attr-defined]
    try:
        wait_for(lambda: _answers(port), what="the stand-in engine")
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)  # a stopped one must be able to die
        proc.kill()
        proc.wait(10)


def _answers(port: int) -> bool:
    with contextlib.suppress(OSError):
        return http_get("127.0.0.1", port, "/health", 1.0)[0] == 200
    return False


def _target(engine: Any, config: ProbeConfig) -> ProbeTarget:
    return ProbeTarget("127.0.0.1", engine.port, config)


@pytest.mark.parametrize("config", [CHAT, TEXT], ids=["chat", "completions"])
def test_a_completion_probe_passes_on_a_choice(engine: Any, config: ProbeConfig) -> None:
    result = probe(_target(engine, config))
    assert result == ProbeResult(True, f"POST {config.completion} -> 200 with a choice")


def test_a_stopped_engine_fails_within_the_timeout(engine: Any) -> None:
    os.kill(engine.pid, signal.SIGSTOP)  # the kernel still accepts; nothing answers
    for config in (ProbeConfig(http=(("/health", None),), timeout_seconds=0.3), CHAT):
        limited = ProbeConfig(**{**_fields(config), "timeout_seconds": 0.3})
        result = probe(_target(engine, limited))
        assert result == ProbeResult(False, f"{limited.kind}: no answer within 0.3s"), result


def _fields(config: ProbeConfig) -> dict[str, Any]:
    return {k: getattr(config, k) for k in config.__dataclass_fields__}


# -- what a completion probe sends, and what is not healthy ---------------------------------


def _serve(answer: Callable[[bytes], bytes], seen: list[bytes], hold: float = 0.0) -> Iterator[int]:
    """A one-thread server recording each request; ``hold``: seconds it keeps the
    connection open after its answer (a server that never finishes its body)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                request = _read_request(conn)
                seen.append(request)
                conn.sendall(answer(request))
                stop.wait(hold)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    conn.settimeout(2)
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += conn.recv(65536)
    return head + b"\r\n\r\n" + body


def _json(status: str, body: object) -> Callable[[bytes], bytes]:
    data = json.dumps(body).encode()
    head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}"
    return lambda _: head.encode() + b"\r\n\r\n" + data


@pytest.mark.parametrize(
    ("answer", "ready", "detail"),
    [
        (_json("200 OK", {"choices": [{"text": ""}]}), True, "200 with a choice"),
        (_json("200 OK", {"choices": []}), False, "200 without a choice"),
        (_json("200 OK", ["not", "an", "object"]), False, "200 without a choice"),
        (
            _json("400 Bad Request", {"error": "max_tokens must be at least 32"}),
            False,
            '-> 400: {"error": "max_tokens must be at least 32"}',
        ),
        (_json("503 Service Unavailable", {"error": "CUDA error"}), False, "-> 503"),
    ],
    ids=["a-choice", "no-choice", "not-an-object", "refused", "gpu-gone"],
)
def test_healthy_is_a_200_with_a_choice(
    answer: Callable[[bytes], bytes], ready: bool, detail: str
) -> None:
    seen: list[bytes] = []
    server = _serve(answer, seen)
    port = next(server)
    try:
        result = probe(ProbeTarget("127.0.0.1", port, TEXT))
    finally:
        server.close()
    assert result.ready is ready and detail in result.detail, result


@pytest.mark.parametrize("config", [CHAT, TEXT], ids=["chat", "completions"])
def test_the_request_is_one_small_completion_a_reasoning_model_accepts(config: ProbeConfig) -> None:
    seen: list[bytes] = []
    server = _serve(_json("200 OK", {"choices": [{"index": 0}]}), seen)
    port = next(server)
    try:
        assert probe(ProbeTarget("127.0.0.1", port, config)).ready
    finally:
        server.close()
    head, _, body = seen[0].partition(b"\r\n\r\n")
    assert head.startswith(f"POST {config.completion} HTTP/1.0".encode())
    sent = json.loads(body)
    assert sent["model"] == "demo" and sent["max_tokens"] == MAX_TOKENS == 16
    assert ("messages" in sent) is (config is CHAT) and ("prompt" in sent) is (config is TEXT)
    assert "stream" not in sent  # one answer, not a stream


def test_a_server_that_drips_its_answer_is_cut_at_the_timeout() -> None:
    """The timeout bounds the whole exchange, not each read."""

    def drip(_: bytes) -> bytes:
        return b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"  # and never the rest

    seen: list[bytes] = []
    server = _serve(drip, seen, hold=2.0)
    port = next(server)
    try:
        result = probe(
            ProbeTarget("127.0.0.1", port, ProbeConfig(**{**_fields(TEXT), "timeout_seconds": 0.3}))
        )
    finally:
        server.close()
    assert result == ProbeResult(False, "completion (POST /v1/completions): no answer within 0.3s")


# -- the liveness prober ------------------------------------------------------------------


def _ready(engine: Any, nonce: str = "n1", period: float = 0.1) -> dict[str, RecordView]:
    live = ProbeConfig(http=(("/health", None),), period_seconds=period, timeout_seconds=0.3)
    rec = Record(
        name="web",
        owner="o",
        node="n",
        phase=Phase.READY,
        port=engine.port,
        nonce=nonce,
        liveness=live,
    )
    return {"web": RecordView(record=rec, alive=True)}


def test_once_probes_each_ready_engine_once_per_pass(engine: Any) -> None:
    prober = LivenessProber()
    prober.begin_pass()
    views = _ready(engine)
    assert prober.take(views) == {"web": (ProbeResult(True, "GET /health -> 200"),)}
    assert prober.take(views) == {}  # the pass's later rounds probe nothing again
    prober.begin_pass()
    assert list(prober.take(views)) == ["web"]


def test_the_daemons_prober_answers_from_its_threads_and_drops_a_gone_engine(engine: Any) -> None:
    news: list[bool] = []
    told = threading.Event()

    def answered(is_news: bool) -> None:
        news.append(is_news)
        told.set()

    prober = LivenessProber(background=True, on_answer=answered)
    try:
        views = _ready(engine)
        assert prober.take(views) == {}  # nothing due yet: the first comes a period later
        os.kill(engine.pid, signal.SIGSTOP)
        wait_for(lambda: prober.next_due() == 0.0, what="the first probe due")
        prober.start_due()  # the daemon's timer; returns at once
        assert told.wait(5), "no answer from the probe's thread"
        assert news[0] is True  # a failure asks for a pass
        taken = prober.take(views)
        assert [a.ready for a in taken["web"]][:1] == [False], taken
        wait_for(lambda: len(news) >= 3, what="probes going on while nothing is taken")
        prober.take(_ready(engine, nonce="n2"))  # restarted: the old engine's answers go
        assert prober.take(_ready(engine, nonce="n2")) == {}
    finally:
        prober.close()


def _keyed_completion(request: bytes) -> bytes:
    """An engine's completion behind the key `right`."""
    keyed = b"\r\nAuthorization: Bearer right\r\n" in request
    status, body = ("200 OK", {"choices": [{"text": "OK"}]}) if keyed else ("401 No", {})
    return _json(status, body)(request)


def test_the_prober_keeps_an_engines_key_while_it_runs() -> None:
    """No record holds an engine's API key: each pass finds it (reconciler/probekeys.py).
    A pass that finds none for a running engine (its manifest not read yet: a git source's
    first fetch) would probe it anonymously, get 401 and restart it as not live. The
    prober keeps the key it found for that engine (its nonce); a new engine gets none of
    it."""
    seen: list[bytes] = []
    with contextlib.contextmanager(_serve)(_keyed_completion, seen) as port:
        live = ProbeConfig(completion="/v1/completions", model="m", timeout_seconds=2.0)

        def views(nonce: str) -> dict[str, RecordView]:
            rec = Record(name="web", owner="o", node="n", phase=Phase.READY, port=port,
                         nonce=nonce, liveness=live)  # fmt: skip
            return {"web": RecordView(record=rec, alive=True)}

        prober = LivenessProber()
        for keys, nonce, ready in [
            (lambda rec: "right", "n1", True),  # a pass that read the manifest
            (lambda rec: "", "n1", True),  # one that did not: the engine's key is kept
            (lambda rec: "", "n2", False),  # a new engine: nothing of the old one's
        ]:
            prober.begin_pass()
            (answer,) = prober.take(views(nonce), keys)["web"]
            assert answer.ready is ready, answer
        assert "presented no API key" in answer.detail and "right" not in answer.detail
        assert [b"Bearer right" in r for r in seen] == [True, True, False], seen
