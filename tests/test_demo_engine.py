"""The shipped demo engine is a small but faithful OpenAI server (issue 34, item 24): the
official `openai` client's every path against the real process (embeddings, usage,
streamed usage, ids), so token metrics and clients can be tried without a model."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import openai
import pytest
from procs import free_ports, wait_for

from controller.gateway.accounting.enginemetrics import parse


def _up(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


@pytest.fixture
def engine_port() -> Iterator[int]:
    """A demo engine serving model ``m``: its port."""
    port = free_ports(1)
    argv = [sys.executable, "-m", "controller.demo.engine", "--port", str(port), "--model", "m"]
    engine = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: _up(port), timeout=30, what="the demo engine")
        yield port
    finally:
        engine.terminate()
        engine.wait(timeout=30)


@pytest.fixture
def client(engine_port: int) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"http://127.0.0.1:{engine_port}/v1", api_key="none") as made:
        yield made


def _answer(reader: BinaryIO) -> tuple[bytes, dict[str, str], bytes]:
    """One answer read off a connection: its status line, headers (lower-case names), body."""
    status = reader.readline()
    headers = {}
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, reader.read(int(headers.get("content-length", 0)))


def test_its_http_keeps_connections_continues_and_refuses_with_a_status(engine_port: int) -> None:
    """The engine's own HTTP/1.1 server (controller/demo/httpserver.py; http.server was
    two thirds of its start): requests in turn on one connection, a body sent after
    ``100 Continue`` (http.server's 100 sat in the engine's write buffer until the answer,
    so a client that waits for it before its body, as curl does a second, waited), an
    HTTP/1.0 request's connection closed after its answer, and a method or request line
    it cannot serve refused with a status."""
    with (
        socket.create_connection(("127.0.0.1", engine_port), timeout=30) as sock,
        sock.makefile("rb") as reader,
    ):
        for _ in range(2):  # keep-alive: the same connection answers again
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
            status, headers, body = _answer(reader)
            assert status.startswith(b"HTTP/1.1 200 ") and json.loads(body) == {"status": "ok"}
            assert headers["date"].endswith(" GMT") and headers["server"].startswith("BaseHTTP/")
        body = b'{"prompt": "a b"}'
        head = b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
        sock.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body))
        assert reader.readline() == b"HTTP/1.1 100 Continue\r\n" and reader.readline() == b"\r\n"
        sock.sendall(body)
        status, _, answer = _answer(reader)
        assert status.startswith(b"HTTP/1.1 200 ") and json.loads(answer)["usage"]["prompt_tokens"]
        sock.sendall(b"DELETE /v1/models HTTP/1.1\r\nHost: t\r\n\r\n")
        status, headers, _ = _answer(reader)
        assert status.startswith(b"HTTP/1.1 501 ") and headers["connection"] == "close"
        assert reader.read() == b""  # and it closed the connection
    for request, code in ((b"GET /health HTTP/1.0\r\n\r\n", 200), (b"nonsense\r\n\r\n", 400)):
        with (
            socket.create_connection(("127.0.0.1", engine_port), timeout=30) as sock,
            sock.makefile("rb") as reader,
        ):
            sock.sendall(request)
            status, _, _ = _answer(reader)
            assert status.startswith(b"HTTP/1.1 %d " % code), status
            assert reader.read() == b""  # closed after the answer


def test_embeddings_are_deterministic_vectors_with_usage(client: openai.OpenAI) -> None:
    """It answered /v1/embeddings with a completion: the client could not parse it."""
    got = client.embeddings.create(model="m", input=["one two", "three"])  # base64, by default
    assert [d.index for d in got.data] == [0, 1] and got.model == "m"
    first = got.data[0].embedding
    assert len(first) == 16 and abs(sum(v * v for v in first) - 1) < 1e-3
    assert got.usage.prompt_tokens == 3 and got.usage.total_tokens == 3
    again = client.embeddings.create(model="m", input="one two", encoding_format="float")
    assert again.data[0].embedding == pytest.approx(first, abs=1e-6)  # same text, same vector
    sized = client.embeddings.create(model="m", input="x", dimensions=5)
    assert len(sized.data[0].embedding) == 5


def test_completions_and_chat_say_their_usage(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "say hello please"}]
    )
    assert chat.object == "chat.completion" and chat.id.startswith("chatcmpl-") and chat.created
    assert chat.choices[0].message.content == "hello from m"
    assert chat.usage is not None and chat.usage.prompt_tokens == 3
    assert chat.usage.completion_tokens == 3 and chat.usage.total_tokens == 6
    text = client.completions.create(model="m", prompt="a b")
    assert text.object == "text_completion" and text.id.startswith("cmpl-")
    assert text.usage is not None and text.usage.prompt_tokens == 2
    assert text.id != client.completions.create(model="m", prompt="a").id  # each its own


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_a_stream_ends_with_its_usage_when_asked(client: openai.OpenAI, chat: bool) -> None:
    options = {"include_usage": True}
    if chat:
        stream = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True,
            stream_options=options,
        )  # fmt: skip
        chunks = list(stream)
        said = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert chunks[0].choices[0].delta.role == "assistant"
    else:
        text_stream = client.completions.create(
            model="m", prompt="hi", stream=True, stream_options=options
        )
        chunks = list(text_stream)  # type: ignore[arg-type]
        said = "".join(c.choices[0].text for c in chunks if c.choices)  # type: ignore[union-attr]
    assert said == "chunk 0 chunk 1 chunk 2 "
    *body, last = chunks
    assert last.choices == [] and last.usage is not None, last
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (1, 6)
    assert all(c.usage is None for c in body) and body[-1].choices[0].finish_reason == "stop"
    assert len({c.id for c in chunks}) == 1 and all(c.created for c in chunks)
    plain = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    assert all(c.usage is None for c in plain)  # not asked: no usage chunk


def test_models_are_listed_as_openai_lists_them(client: openai.OpenAI) -> None:
    (model,) = client.models.list().data
    assert (model.id, model.object, model.owned_by) == ("m", "model", "demo") and model.created
    assert client.models.retrieve("m").id == "m"


def test_slots_run_that_many_streams_at_once_and_metrics_say_who_waits() -> None:
    """``--slots 1``: a second stream waits for the first, and /metrics (vLLM's series,
    what the gateway's engine reader parses) says 1 running and 1 waiting meanwhile."""
    port = free_ports(1)
    argv = [sys.executable, "-m", "controller.demo.engine", "--port", str(port), "--slots", "1"]
    argv += ["--chunks", "20", "--chunk-delay", "0.1"]
    engine = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: _up(port), timeout=30, what="the demo engine")
        url = f"http://127.0.0.1:{port}"

        def metrics() -> str:
            with urllib.request.urlopen(f"{url}/metrics", timeout=5) as answer:
                return str(answer.read().decode())

        assert parse(metrics()).waiting == 0
        body = b'{"model": "demo", "stream": true, "messages": []}'

        def stream() -> None:
            request = urllib.request.Request(f"{url}/v1/chat/completions", data=body)
            with urllib.request.urlopen(request, timeout=30) as answer:
                answer.read()

        streams = [threading.Thread(target=stream) for _ in range(2)]
        for one in streams:
            one.start()
        both = ('num_requests_running{model_name="demo"} 1.0', 'waiting{model_name="demo"} 1.0')

        def one_each() -> str | None:
            text = metrics()
            return text if all(line in text for line in both) else None

        said = wait_for(one_each, timeout=10, what="one stream running and one waiting")
        assert parse(said).waiting == 1
        for one in streams:
            one.join(timeout=30)
        assert parse(metrics()).waiting == 0
    finally:
        engine.terminate()
        engine.wait(timeout=30)


def test_a_client_gone_mid_stream_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """A client that closed a stream it stopped reading left two chained BrokenPipeError
    tracebacks in the engine's log (the trial's `reconcile logs` and a crash's log tail
    showed them): a client's hang-up is one line naming it."""
    port = free_ports(1)
    log = tmp_path / "engine.log"
    argv = [sys.executable, "-m", "controller.demo.engine", "--port", str(port)]
    argv += ["--chunks", "400", "--chunk-delay", "0.02"]
    with open(log, "wb") as out:
        engine = subprocess.Popen(argv, stdout=out, stderr=out, stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: _up(port), timeout=30, what="the demo engine")
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            body = b'{"model": "demo", "stream": true}'
            head = (
                "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            )
            sock.sendall(head.encode() + body)
            wait_for(lambda: b"data: " in sock.recv(4096), timeout=30, what="the first event")
        # the engine finds the client gone at one of its next writes: then it says so
        said = wait_for(
            lambda: ("mid-answer" in (t := log.read_text()) or "Traceback" in t) and t,
            timeout=30,
            what="the engine's word on the closed connection",
        )
        assert "Traceback" not in said and "During handling" not in said, said
        gone = ("(BrokenPipeError)", "(ConnectionResetError)")
        assert any(f"127.0.0.1 closed the connection mid-answer {g}" in said for g in gone), said
        assert engine.poll() is None  # and it serves on
        assert _up(port)
    finally:
        engine.terminate()
        engine.wait(timeout=30)
