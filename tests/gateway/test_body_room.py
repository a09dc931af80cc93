"""The room for request bodies (``--max-body-total``) is not held by clients that send
little or nothing: the real gateway (in process), raw sockets, a real engine.

A chunked body reserved ``--max-body`` (32 MiB) before a byte of it came, so four
connections that sent a chunked head and a byte, then nothing, held the whole 128 MiB:
every other request with a body waited, then got a 503, for the 120 s body timeout,
renewed by reconnecting. A chunked body now holds what arrived of it; a body with a
Content-Length still reserves that up front, and gives it back once nothing of it came
for ``BODY_STALL`` s, or once it falls behind the minimum rate (a 408 either way), not
only after 120 s.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import select
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from harness.rawhttp import exchange, openai_error, parse, request
from procs import free_ports
from test_server import Served, answer, run
from test_upstream import Rude, ready, route

from controller.gateway.http.messages import Request, Response, StreamResponse
from controller.gateway.lifecycle.app import Gateway
from controller.gateway.routing.concurrency import Bodies, Held
from controller.gateway.settings import DEFAULT_MAX_BODY, DEFAULT_MAX_BODY_TOTAL, Settings
from controller.gateway.surface import bodies

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
HOLDERS = DEFAULT_MAX_BODY_TOTAL // DEFAULT_MAX_BODY  # heads that held all the room (4)


KEYS = ("sk-body-room-one-0000000000", "sk-body-room-two-0000000000")


def _serve(reconcile: Any, wait: float, keys: Path | None) -> Iterator[Gateway]:
    """A gateway in this process whose requests wait ``wait`` s for room (30 s by default:
    a request locked out is a 503 sooner), "m" routed to a real engine that answers."""
    reconcile.state.mkdir(parents=True, exist_ok=True)
    settings = Settings(
        host="127.0.0.1",
        port=free_ports(1),
        state_dir=reconcile.state,
        queue_wait=wait,
        api_keys=keys,
    )
    gateway = Gateway(settings)
    gateway.start(lambda: None)
    try:
        engine = Rude(reconcile, "engine", "--always", "ok")
        route(gateway, ready("m", "n0", engine.port))
        yield gateway
    finally:
        gateway.stop()


@pytest.fixture
def served(reconcile: Any) -> Iterator[Gateway]:
    yield from _serve(reconcile, 10.0, None)


@pytest.fixture
def keyed(reconcile: Any) -> Iterator[Gateway]:
    """With API keys (``KEYS``); a request waits 2 s for room, well within the holders'
    ``BODY_STALL`` (10 s): what it finds held is still held when its wait ends."""
    keys = reconcile.tmp / "keys.txt"
    keys.write_text("\n".join(KEYS) + "\n")
    os.chmod(keys, 0o600)
    yield from _serve(reconcile, 2.0, keys)


@contextlib.contextmanager
def holders(port: int, head: bytes, count: int = HOLDERS) -> Iterator[list[socket.socket]]:
    """``count`` connections that sent ``head`` and stay silent, open until the end."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            socks.append(sock)
            sock.sendall(head)
        yield socks
    finally:
        for sock in socks:
            sock.close()


def _held(gateway: Gateway) -> int:
    assert gateway.front is not None
    return gateway.front.bodies.held


@pytest.mark.parametrize("coding", ["", "Content-Encoding: gzip\r\n"])
def test_chunked_heads_that_sent_a_byte_leave_room_for_other_requests(
    reconcile: Any, served: Gateway, coding: str
) -> None:
    """Four chunked heads (encoded too: its decoded size is unknown as well) and a byte
    each, then nothing: another client's small POST is answered by its engine, not made
    to wait for a 503 `server_busy`; the four hold the bytes they sent, not 128 MiB."""
    port = served.settings.port
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\n{coding}Transfer-Encoding: chunked\r\n\r\n1\r\n{{\r\n"
    ).encode()
    with holders(port, head):
        # Each has its byte read (held: 1 byte each; 32 MiB each before).
        reconcile.wait_for(lambda: _held(served) >= HOLDERS, what="the four bodies begun")
        answer = exchange(port, request("POST", "/v1/chat/completions", BODY), timeout=30)
        assert answer.status == 200 and answer.json()["object"] == "ok", answer
        assert _held(served) == HOLDERS, _held(served)
    reconcile.wait_for(lambda: _held(served) == 0, what="the room given back")


def test_a_sized_body_that_stops_coming_gives_its_room_back(
    reconcile: Any, served: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four heads of 32 MiB bodies (a Content-Length reserves its size up front) that sent
    a byte, then nothing: their room is given back ``BODY_STALL`` s later (10 s; 3 here)
    with a 408 that says why, not after the body's 120 s, and the other client's POST,
    waiting for room (up to 10 s here), is answered by its engine."""
    monkeypatch.setattr(bodies, "BODY_STALL", 3.0)
    port = served.settings.port
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {DEFAULT_MAX_BODY}\r\n\r\n{{"
    ).encode()
    with holders(port, head) as socks:
        reconcile.wait_for(
            lambda: _held(served) == DEFAULT_MAX_BODY_TOTAL, what="the room all reserved"
        )
        answer = exchange(port, request("POST", "/v1/chat/completions", BODY), timeout=30)
        assert answer.status == 200 and answer.json()["object"] == "ok", answer
        late = parse(_answer(socks[0]))
        error = openai_error(late)
        assert late.status == 408 and error is not None, late
        assert "nothing of it arrived for 3 seconds" in error["message"], error
    reconcile.wait_for(lambda: _held(served) == 0, what="the room given back")


def test_a_sized_body_that_drips_falls_behind_and_a_fast_large_one_passes(
    reconcile: Any, served: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four heads of 32 MiB bodies (all the room) that send a byte a second, never
    ``BODY_STALL`` apart: they held their room for the body's 120 s, and every other body
    waited for a 503. Each falls behind the minimum rate (1 KB a second) once its
    ``BODY_GRACE`` (10 s; 2 here) is out: a 408 that says so, its room given back, and
    another client's 8 MiB body, sent at once and waiting for room (up to 10 s here), is
    answered by its engine."""
    monkeypatch.setattr(bodies, "BODY_GRACE", 2.0)
    port = served.settings.port
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {DEFAULT_MAX_BODY}\r\n\r\n{{"
    ).encode()
    prompt = "x" * (8 << 20)
    large = json.dumps({"model": "m", "messages": [{"role": "user", "content": prompt}]})
    stop = threading.Event()
    with holders(port, head) as socks, ThreadPoolExecutor(len(socks)) as pool:
        try:
            dripped = [pool.submit(_drip, sock, stop) for sock in socks]
            reconcile.wait_for(
                lambda: _held(served) == DEFAULT_MAX_BODY_TOTAL, what="the room all reserved"
            )
            answer = exchange(
                port, request("POST", "/v1/chat/completions", large.encode()), timeout=30
            )
            assert answer.status == 200 and answer.json()["object"] == "ok", answer
            for late in (parse(done.result()) for done in dripped):
                error = openai_error(late)
                assert late.status == 408 and error is not None, late
                assert "the request body came too slowly" in error["message"], error
                assert "1024 bytes a second or more" in error["message"], error
        finally:
            stop.set()
    reconcile.wait_for(lambda: _held(served) == 0, what="the room given back")


def _drip(sock: socket.socket, stop: threading.Event) -> bytes:
    """Send a byte of JSON a second on ``sock`` until the gateway answers (then what it
    sent until it closed), ``stop`` is set or a minute has passed (then b"")."""
    deadline = time.monotonic() + 60
    while not stop.is_set() and time.monotonic() < deadline:
        readable, _, _ = select.select([sock], [], [], 1.0)  # its answer, or a second
        if readable:
            return _answer(sock)
        try:
            sock.sendall(b" ")
        except OSError:  # closed after its answer: read it
            return _answer(sock)
    return b""


def test_one_api_key_holds_at_most_half_of_the_room(reconcile: Any, keyed: Gateway) -> None:
    """Four heads of 32 MiB bodies under one key and a byte each (clients that send 1 KB
    a second, the minimum rate, hold their room for the body's 120 s): the key holds
    half the room (two of them; the others wait), and another key's POST is answered at
    once; the first key's own next request waits for its share, and its 503 says so."""
    served = keyed
    port = served.settings.port
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {KEYS[0]}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {DEFAULT_MAX_BODY}\r\n\r\n{{"
    ).encode()
    one = hashlib.sha256(KEYS[0].encode()).hexdigest()[:8]  # the key's label
    half = DEFAULT_MAX_BODY_TOTAL // 2
    with holders(port, head):
        assert served.front is not None
        room = served.front.bodies
        reconcile.wait_for(lambda: room.peer_held(one) == half, what="the key's half held")
        other = request("POST", "/v1/chat/completions", BODY, {"x-api-key": KEYS[1]})
        answer = exchange(port, other, timeout=30)
        assert answer.status == 200 and answer.json()["object"] == "ok", answer
        own = request("POST", "/v1/chat/completions", BODY, {"x-api-key": KEYS[0]})
        refused = exchange(port, own, timeout=30)  # after its 2 s wait
        error = openai_error(refused)
        assert refused.status == 503 and error is not None, refused
        assert f"API key {one} holds {half} bytes" in error["message"], error
        assert room.held == half
    reconcile.wait_for(lambda: _held(served) == 0, what="the room given back")


def _answer(sock: socket.socket) -> bytes:
    """What the gateway sent on ``sock`` until it closed it."""
    chunks: list[bytes] = []
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


ROOM = 4096  # --max-body-total (and --max-body) of the test below
CHUNKED = b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (3000, b"x" * 3000)
GZIPPED = gzip.compress(b" " * 100_000)  # ~150 bytes that decode to 100 kB


@pytest.mark.parametrize(
    "rest",
    [CHUNKED, b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s" % (len(GZIPPED), GZIPPED)],
    ids=["chunked", "gzip"],
)
def test_a_body_that_outgrows_the_room_left_is_a_503_and_gives_it_back(rest: bytes) -> None:
    """Half the room held by another request: a chunked body of 3000 bytes, or a gzip
    body that decodes to 100 kB (its Content-Length reserved, not what it decodes to),
    finds no room for what it takes: a 503 `server_busy` that says to send a
    Content-Length, and what it held is given back."""
    room = Bodies(total=ROOM, wait=0.1)

    async def read(request: Request) -> StreamResponse:
        hold = Held(room, bodies.held(request, ROOM, None))
        assert await room.take(hold.size)
        try:
            said = await bodies.read(request, 100_000, None, hold)
        finally:
            hold.give()
        assert isinstance(said, Response)
        return said

    async def test() -> None:
        other = Held(room, ROOM // 2)
        assert await room.take(other.size)
        async with Served(read) as s:
            reader, writer = await s.connect()
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + rest)
            status, _, body = await answer(reader)
            error = json.loads(body)["error"]
            assert (status, error["code"]) == (503, "server_busy"), body
            assert "send it with a Content-Length" in error["message"], error
            assert room.held == ROOM // 2

    run(test)
