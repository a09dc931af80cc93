"""``gateway/http/server.py``, the gateway's own HTTP/1.1 server, on a real socket with a
raw client (the bytes are the test's): keep-alive and pipelining, bodies chunked and
sized, ``Expect: 100-continue``, an answer before an unread body, HEAD and HTTP/1.0,
unreadable requests, the header deadline and the idle timeout, the connection cap, a
client that goes away, a handler that fails, and a draining server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Awaitable, Callable

import pytest
import uvloop
from structlog.testing import capture_logs

from controller.gateway.http import server as srv
from controller.gateway.http.answers import error
from controller.gateway.http.messages import Request, Response, StreamResponse, json_response
from controller.gateway.http.server import Connections, Server
from controller.gateway.surface import bodies

Handler = Callable[[Request], Awaitable[StreamResponse]]
END = b"\r\n\r\n"


async def echo(request: Request) -> StreamResponse:
    body = await request.read()
    return json_response({"method": request.method, "path": request.raw_path, "body": len(body)})


class Served:
    """A server on 127.0.0.1 for the length of a test."""

    def __init__(self, handler: Handler = echo, cap: int = 64, max_body: int = 1 << 20) -> None:
        self.server = Server(handler, Connections(cap), max_body)
        self.listener: asyncio.Server | None = None
        self.clients: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> Served:
        loop = asyncio.get_running_loop()
        self.listener = await loop.create_server(self.server.protocol, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.listener is not None
        self.listener.close()
        for writer in self.clients:
            writer.close()
        await self.server.cut(0.1, "the test ends")

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        assert self.listener is not None
        port = self.listener.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        self.clients.append(writer)
        return reader, writer


async def answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One answer: status, headers (lower-case names), body (sized or chunked)."""
    head = (await asyncio.wait_for(reader.readuntil(END), 5)).decode("latin-1")
    status_line, *lines = head[:-4].split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    if "content-length" in headers:
        return (
            int(status_line.split()[1]),
            headers,
            await reader.readexactly(int(headers["content-length"])),
        )
    body = b""
    if headers.get("transfer-encoding") == "chunked":
        while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
            body += await reader.readexactly(size + 2)
            body = body[:-2]
        await reader.readexactly(2)
    return int(status_line.split()[1]), headers, body


async def closed(reader: asyncio.StreamReader, within: float = 5.0) -> bool:
    """The server closed the connection (EOF or a reset) within ``within`` s."""
    try:
        return await asyncio.wait_for(reader.read(), within) == b""
    except ConnectionError:
        return True


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(test())


def test_a_kept_alive_connection_carries_requests_one_after_another() -> None:
    async def test() -> None:
        async with Served() as s:
            reader, writer = await s.connect()
            for path in ("/a", "/b"):
                writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                status, headers, body = await answer(reader)
                assert status == 200 and json.loads(body)["path"] == path
                assert "connection" not in headers and "date" in headers
            writer.close()

    run(test)


# Every status the gateway answers with itself (a 302 to the page, a 409 of a refused
# button, the OpenAI errors): each with its standard reason phrase. A 302 said `Unknown`.
SENT = {
    200: "OK", 202: "Accepted", 302: "Found", 400: "Bad Request", 401: "Unauthorized",
    403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
    409: "Conflict", 413: "Content Too Large", 415: "Unsupported Media Type",
    429: "Too Many Requests", 500: "Internal Server Error", 502: "Bad Gateway",
    503: "Service Unavailable", 504: "Gateway Timeout",
}  # fmt: skip


def test_every_status_the_gateway_sends_has_its_reason_phrase() -> None:
    async def status(request: Request) -> StreamResponse:
        return Response(status=int(request.raw_path[1:]), headers={"Location": "/ui"})

    async def test() -> None:
        async with Served(status) as s:
            reader, writer = await s.connect()
            for code, phrase in SENT.items():
                writer.write(f"GET /{code} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                line = (await asyncio.wait_for(reader.readline(), 5)).decode()
                assert line == f"HTTP/1.1 {code} {phrase}\r\n"
                await reader.readuntil(END)  # the rest of the head; no body (length 0)
            writer.close()

    run(test)


def test_pipelined_requests_are_answered_in_order() -> None:
    async def test() -> None:
        async with Served() as s:
            reader, writer = await s.connect()
            heads = (f"GET /{i} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for i in range(5))
            writer.write(b"".join(heads))
            paths = [json.loads((await answer(reader))[2])["path"] for _ in range(5)]
            assert paths == [f"/{i}" for i in range(5)]
            writer.close()

    run(test)


def test_a_chunked_body_is_read_whole_and_a_stream_goes_out_chunked() -> None:
    async def streamer(request: Request) -> StreamResponse:
        body = await request.read()
        out = StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for piece in (body[:3], body[3:]):
            await out.write(piece)
        await out.write_eof()
        return out

    async def test() -> None:
        async with Served(streamer) as s:
            reader, writer = await s.connect()
            writer.write(
                b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"4\r\nabcd\r\n3\r\nefg\r\n0\r\n\r\n"
            )
            status, headers, body = await answer(reader)
            assert (status, headers["transfer-encoding"], body) == (200, "chunked", b"abcdefg")
            writer.close()

    run(test)


def test_100_continue_is_sent_only_when_the_handler_reads_the_body() -> None:
    async def refusing(request: Request) -> StreamResponse:
        if request.raw_path == "/refuse":
            return error(401, "no key", "invalid_api_key")
        return await echo(request)

    async def test() -> None:
        async with Served(refusing) as s:
            reader, writer = await s.connect()
            writer.write(b"POST /ok HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n")
            writer.write(b"Content-Length: 5\r\n\r\n")
            interim = await asyncio.wait_for(reader.readuntil(END), 5)
            assert interim.startswith(b"HTTP/1.1 100 Continue")
            writer.write(b"hello")
            assert json.loads((await answer(reader))[2])["body"] == 5
            # Refused before its body: no 100, the answer, then the connection ends (the
            # client may not send the body it was waiting to send).
            writer.write(b"POST /refuse HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n")
            writer.write(b"Content-Length: 5\r\n\r\n")
            status, headers, _ = await answer(reader)
            assert (status, headers["connection"]) == (401, "close")
            assert await closed(reader)

    run(test)


def test_an_answer_before_a_large_unread_body_reaches_the_client() -> None:
    """A 413 for a body still on its way: the server reads the rest (and drops it) before
    it closes; a close at once could reset the connection before the answer was read."""

    async def too_large(request: Request) -> StreamResponse:
        return error(413, "too large", "request_too_large")

    async def test() -> None:
        async with Served(too_large) as s:
            reader, writer = await s.connect()
            size = 4 << 20
            writer.write(f"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n".encode())
            writer.write(b"x" * size)
            await writer.drain()
            status, headers, _ = await answer(reader)
            assert (status, headers["connection"]) == (413, "close")
            assert await closed(reader)

    run(test)


async def refuse_413(request: Request) -> StreamResponse:
    return error(413, "too large", "request_too_large")


def _send_slowly_then_read(port: int, pieces: int, pause: float) -> bytes:
    """A client as http.client and requests are: its whole body sent, ``pieces`` pieces
    ``pause`` s apart (its pace: a slow uplink, not a wait for the server), then the
    answer read to the close."""
    piece = b"x" * (64 << 10)
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        size = pieces * len(piece)
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size)
        for _ in range(pieces):
            time.sleep(pause)
            sock.sendall(piece)
        said = b""
        while chunk := sock.recv(1 << 16):
            said += chunk
        return said


def test_an_answer_before_a_body_sent_slowly_reaches_the_client() -> None:
    """A 413 before a body that comes at a steady pace for twice ``LINGER`` s: what comes
    is dropped as it comes, and the client reads the answer once its body is sent. The
    close came ``LINGER`` s after the answer, whatever still came: the client's next send
    broke ("broken pipe"), as the 503s of a burst of 30 MiB bodies did on a loaded box
    (tests/gateway/test_bodies.py)."""

    async def test() -> None:
        async with Served(refuse_413) as s:
            assert s.listener is not None
            port = s.listener.sockets[0].getsockname()[1]
            pause = srv.LINGER / 5
            said = await asyncio.to_thread(_send_slowly_then_read, port, 10, pause)
            head, _, body = said.partition(END)
            assert head.startswith(b"HTTP/1.1 413 "), said[:200]
            assert b"connection: close" in head.lower(), head
            assert json.loads(body)["error"]["code"] == "request_too_large", body

    run(test)


def _send_until_closed(port: int, within: float) -> bool:
    """A body that never ends, sent at a steady pace: whether the server ended the
    connection within ``within`` s (a send then fails)."""
    deadline = time.monotonic() + within
    with socket.create_connection(("127.0.0.1", port), timeout=within) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (1 << 40))
        try:
            while time.monotonic() < deadline:
                sock.sendall(b"x" * 1024)
                time.sleep(0.05)  # its pace
        except OSError:  # broken pipe, or reset: closed
            return True
    return False


def test_the_read_after_an_early_answer_ends_however_long_the_body_comes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A body still coming after its answer is dropped for at most ``LINGER_MAX`` s (120;
    1 here), then the connection closes: a client sending without end holds it no longer."""
    monkeypatch.setattr(srv, "LINGER_MAX", 1.0)

    async def test() -> None:
        async with Served(refuse_413) as s:
            assert s.listener is not None
            port = s.listener.sockets[0].getsockname()[1]
            assert await asyncio.to_thread(_send_until_closed, port, 30.0)

    run(test)


def test_the_read_after_an_early_answer_outlasts_the_idle_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The lingering read has its own ends (``LINGER``, ``LINGER_MAX``): the idle
    timeout (60 s; 1 here) cut it too, as the connection has no request in progress, so a
    burst's rests read at a share of a loaded gateway's pace were reset at 60 s, not 120."""
    monkeypatch.setattr(srv, "IDLE_TIMEOUT", 1.0)
    monkeypatch.setattr(srv, "HEADER_TIMEOUT", 0.2)  # the timer's step: never more ahead

    async def test() -> None:
        async with Served(refuse_413) as s:
            assert s.listener is not None
            port = s.listener.sockets[0].getsockname()[1]
            pause = srv.LINGER / 5
            said = await asyncio.to_thread(_send_slowly_then_read, port, 10, pause)
            assert said.startswith(b"HTTP/1.1 413 "), said[:200]

    run(test)


class _Stall:
    """The gateway's loop held in an I/O callback, as a long read holds it, or the kernel
    does when it leaves the process waiting on a loaded box: ``seconds`` (the stall
    itself, which the client's pace goes on through), and until the client sent a piece
    during it (bytes the loop has not read yet when it wakes)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._wake, self._trigger = socket.socketpair()
        self.began, self.sent, self.over = (threading.Event() for _ in range(3))

    def watch(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.add_reader(self._wake.fileno(), self._hold, loop)

    def start(self) -> None:
        """From the client's thread."""
        self._trigger.send(b"!")

    def _hold(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.remove_reader(self._wake.fileno())
        self.began.set()
        time.sleep(self.seconds)  # the stall under test, not a wait for something
        self.sent.wait(60)
        self.over.set()

    def close(self) -> None:
        self._wake.close()
        self._trigger.close()


def _answered(sock: socket.socket) -> bool:
    """Some of the answer is there to read (peeked: the client reads it at the end)."""
    try:
        return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except BlockingIOError:
        return False


def _send_through_a_stall(port: int, stall: _Stall, pace: float) -> bytes:
    """A chunked body at a steady pace: on through the gateway's stall once its answer
    came, a few pieces more, its end; then the answer read to the close."""
    piece = b"1000\r\n" + b"x" * 4096 + b"\r\n"
    deadline = time.monotonic() + 60
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        while not _answered(sock):
            assert time.monotonic() < deadline, "no answer in 60 s"
            sock.sendall(piece)
            time.sleep(pace)  # its pace
        stall.start()
        assert stall.began.wait(60), "the loop never stalled"
        sock.sendall(piece)
        stall.sent.set()
        while not stall.over.is_set():
            time.sleep(pace)
            sock.sendall(piece)
        for _ in range(5):
            time.sleep(pace)
            sock.sendall(piece)
        sock.sendall(b"0\r\n\r\n")
        said = b""
        while chunk := sock.recv(1 << 16):
            said += chunk
        return said


def test_the_gateways_own_stall_does_not_end_the_read_after_an_early_answer() -> None:
    """A body that came while the gateway did not read (its loop busy, its process left
    waiting by a loaded kernel) is still coming. uvloop, the gateway's loop, runs the
    timers due before it reads what came during such a stall: the close ``LINGER`` s
    after the last read came first, and a client still sending read a reset (the burst of
    tests/gateway/test_bodies.py, once at load ~33). The read looks at what the kernel
    holds before it ends, on the process's clock, not the loop's cached one."""
    stall = _Stall(srv.LINGER * 1.5)

    async def test() -> None:
        async with Served(refuse_413) as s:
            assert s.listener is not None
            port = s.listener.sockets[0].getsockname()[1]
            stall.watch(asyncio.get_running_loop())
            said = await asyncio.to_thread(_send_through_a_stall, port, stall, srv.LINGER / 10)
            head, _, body = said.partition(END)
            assert head.startswith(b"HTTP/1.1 413 "), said[:200]
            assert json.loads(body)["error"]["code"] == "request_too_large", body

    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(test())
    finally:
        stall.close()


def test_a_body_that_stops_coming_is_a_408(monkeypatch: pytest.MonkeyPatch) -> None:
    """Content-Length 100, 16 bytes sent, the client silent with its connection open (a
    trial's client waited 90 s for an answer): the body's deadline (``BODY_TIMEOUT``,
    120 s; 0.5 here) answers 408 and ends the connection."""
    monkeypatch.setattr(bodies, "BODY_TIMEOUT", 0.5)

    async def read(request: Request) -> StreamResponse:
        said = await bodies.read(request, 1 << 20, None)
        assert isinstance(said, Response)
        return said

    async def test() -> None:
        async with Served(read) as s:
            reader, writer = await s.connect()
            head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
            writer.write(head + b"\r\n" + b'{"model": "lazy"')
            status, headers, body = await answer(reader)
            assert (status, headers["connection"]) == (408, "close"), body
            error = json.loads(body)["error"]
            assert error["code"] == "request_timeout" and "within 0.5 seconds" in error["message"]
            assert await closed(reader)

    run(test)


def test_a_dropped_body_that_breaks_gets_no_second_answer() -> None:
    """An answer went out before its chunked body came; the rest, read to be dropped,
    turns out unreadable: the connection ends, with no 400 after the answer given."""

    async def refuse(request: Request) -> StreamResponse:
        return error(401, "no key", "invalid_api_key")

    async def test() -> None:
        async with Served(refuse) as s:
            reader, writer = await s.connect()
            head = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            writer.write(head + b"5\r\nhello\r\n")
            status, headers, _ = await answer(reader)
            assert (status, headers["connection"]) == (401, "close")
            writer.write(b"zz\r\n")  # no chunk size
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, nothing more

    run(test)


def test_an_answer_has_one_content_type_its_own_or_a_default() -> None:
    async def typed(request: Request) -> StreamResponse:
        whole = Response(status=200, body=b"{}")
        if request.raw_path == "/json":
            whole.headers.extend({"Content-Type": "application/json"})  # as a proxy adds it
        return whole

    async def test() -> None:
        async with Served(typed) as s:
            reader, writer = await s.connect()
            for path, kind in (("/json", "application/json"), ("/raw", "application/octet-stream")):
                writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                head = await asyncio.wait_for(reader.readuntil(END), 5)
                assert head.lower().count(b"content-type:") == 1, head
                assert f"Content-Type: {kind}".encode() in head
                await reader.readexactly(2)

    run(test)


def test_an_answer_has_one_date_the_engines_or_the_gateways() -> None:
    """Date is a singleton field (RFC 9110 §6.6.1): a proxied answer keeps the engine's,
    and the server adds its own only to an answer without one."""
    engine_date = "Sat, 05 Dec 2026 14:00:00 GMT"

    async def dated(request: Request) -> StreamResponse:
        whole = Response(status=200, body=b"{}")
        if request.raw_path == "/proxied":
            whole.headers.extend({"Date": engine_date})  # as the proxy passes it on
        return whole

    async def test() -> None:
        async with Served(dated) as s:
            reader, writer = await s.connect()
            for path in ("/proxied", "/own"):
                writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                head = (await asyncio.wait_for(reader.readuntil(END), 5)).decode("latin-1")
                dates = [line for line in head.split("\r\n") if line.lower().startswith("date:")]
                assert len(dates) == 1, head
                if path == "/proxied":
                    assert dates == [f"Date: {engine_date}"], head
                await reader.readexactly(2)

    run(test)


def test_an_upgrade_is_answered_as_plain_http_and_ends_its_connection() -> None:
    async def test() -> None:
        async with Served() as s:
            reader, writer = await s.connect()
            writer.write(
                b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
            )
            status, headers, body = await answer(reader)
            assert (status, headers["connection"]) == (200, "close")
            assert json.loads(body)["path"] == "/ws"
            assert await closed(reader)

    run(test)


def test_head_has_the_length_and_no_body_and_http_1_0_ends_its_connection() -> None:
    async def test() -> None:
        async with Served() as s:
            reader, writer = await s.connect()
            writer.write(b"HEAD /h HTTP/1.1\r\nHost: x\r\n\r\nGET /g HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(END), 5)
            assert b"Content-Length: " in head
            status, _, body = await answer(reader)  # the next answer follows at once
            assert status == 200 and json.loads(body)["path"] == "/g"
            writer.close()
            reader, writer = await s.connect()
            writer.write(b"GET /old HTTP/1.0\r\n\r\n")
            status, headers, _ = await answer(reader)
            assert (status, headers["connection"]) == (200, "close")
            assert await closed(reader)

    run(test)


# Two past: llhttp tells of a header once the next line begins (it might be a folded one).
HEADERS_PAST_MAX = b"".join(b"X-%d: v\r\n" % i for i in range(srv.HEADERS_MAX + 2))


def test_a_request_with_as_many_headers_as_allowed_is_answered() -> None:
    fields = b"Host: x\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(srv.HEADERS_MAX - 2))
    long = b"a" * srv.LINE_MAX

    async def test() -> None:
        async with Served(lambda request: _fields(request)) as s:
            reader, writer = await s.connect()
            writer.write(b"GET / HTTP/1.1\r\n" + fields + b"X-" + long[2:] + b": " + long + END)
            status, _, body = await answer(reader)
            got = json.loads(body)
            assert status == 200 and got["count"] == srv.HEADERS_MAX
            assert got["first"] == ["Host", "x"]
            assert got["last"] == ["X-" + "a" * (srv.LINE_MAX - 2), "a" * srv.LINE_MAX]

    run(test)


async def _fields(request: Request) -> StreamResponse:
    fields = request.fields
    return json_response({"count": len(fields), "first": fields[0], "last": fields[-1]})


# A head past the limits: the answer says them and the next move (it said "longer than the
# gateway accepts" alone, and a gateway trial's client could not tell how long, nor what to do).
TOO_LONG = (
    "longer than the gateway accepts (at most 8190 bytes a target, header name or value, and "
    "256 headers): send long data in the request body"
)


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (b"G@T / HTTP/1.1\r\nAuthorization: Bearer sk-secret1234\r\n\r\n", "method"),
        (b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n", TOO_LONG),
        (b"GET / HTTP/1.1\r\nX-" + b"a" * 9000 + b": 1\r\n\r\n", TOO_LONG),
        (b"GET /?" + b"q" * 9000 + b" HTTP/1.1\r\n\r\n", TOO_LONG),
        (b"GET / HTTP/1.1\r\n" + HEADERS_PAST_MAX + b"\r\n", TOO_LONG),
        # ... and refused before its end, which never comes
        (b"GET / HTTP/1.1\r\n" + HEADERS_PAST_MAX, TOO_LONG),
        # trailer fields past the limit, after a chunked body (they were kept, without end)
        (
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n"
            + HEADERS_PAST_MAX,
            TOO_LONG,
        ),
        (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", "request"),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", "TLS handshake"),  # https://
    ],
)
def test_unreadable_requests_get_a_400_that_quotes_none_of_their_bytes(
    raw: bytes, said: str
) -> None:
    async def test() -> None:
        async with Served() as s:
            reader, writer = await s.connect()
            writer.write(raw)
            status, headers, body = await answer(reader)
            message = json.loads(body)["error"]["message"]
            assert (status, headers["connection"]) == (400, "close")
            assert said in message and "sk-secret" not in message and "aaaa" not in message
            assert await closed(reader)

    run(test)


@pytest.mark.parametrize(
    ("head", "said"),
    [
        # Two Hosts: the gateway's checks (its 403 for a foreign Host) read the first, a
        # proxy in front may route by the last; each was answered, by the first.
        (b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n", "2 Host headers"),
        (b"GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\nhOsT: a\r\n", "2 Host headers"),
        (b"GET / HTTP/1.1\r\n", "no Host header, which HTTP/1.1 requires"),
        (b"GET / HTTP/1.1\r\nHost: a b\r\n", "Host header is not a host name"),
        (b"GET / HTTP/1.1\r\nHost: evil.example@127.0.0.1\r\n", "is not a host name"),
        (b"GET / HTTP/1.1\r\nHost: 127.0.0.1/x\r\n", "is not a host name"),
    ],
)
def test_a_request_without_one_host_is_a_400(head: bytes, said: str) -> None:
    """RFC 9112 §3.2: a 400 for an HTTP/1.1 request with no Host header, and any with
    two, or one that is no host; the handler never sees it, and the connection ends."""
    seen: list[str] = []

    async def handler(request: Request) -> StreamResponse:
        seen.append(request.raw_path)
        return await echo(request)

    async def test() -> None:
        async with Served(handler) as s:
            reader, writer = await s.connect()
            writer.write(head + b"\r\n")
            status, headers, body = await answer(reader)
            error = json.loads(body)["error"]
            assert (status, headers["connection"]) == (400, "close"), body
            assert error["code"] == "malformed_request" and said in error["message"], error
            assert await closed(reader)

    run(test)
    assert seen == []


@pytest.mark.parametrize(
    "head",
    [
        b"GET / HTTP/1.0\r\n",  # Host came with HTTP/1.1: a 1.0 request may have none
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n",
        b"GET / HTTP/1.1\r\nHost: [::1]:8080\r\n",
        b"GET / HTTP/1.1\r\nHost: localhost\r\n",
        b"GET / HTTP/1.1\r\nHost:\r\n",  # empty: a target with no authority (RFC 9110 §7.2)
    ],
)
def test_a_request_with_one_host_or_http_1_0_without_is_answered(head: bytes) -> None:
    async def test() -> None:
        async with Served() as s:
            reader, writer = await s.connect()
            writer.write(head + b"\r\n")
            status, _, body = await answer(reader)
            assert status == 200 and json.loads(body)["path"] == "/", body

    run(test)


def test_an_https_client_on_the_plain_port_is_named_in_the_log() -> None:
    """A client of https:// on a plain gateway: the log line says so and what to do. (It
    said "the request method is not a valid HTTP method", and the operator looked for a
    broken client.) A request whose method is bad is still called that."""

    async def test() -> None:
        async with Served() as s:
            for raw in (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", b"G@T / HTTP/1.1\r\n\r\n"):
                reader, writer = await s.connect()
                writer.write(raw)
                await answer(reader)
                assert await closed(reader)

    with capture_logs() as logs:
        run(test)
    said = [line["event"] for line in logs if line["event"].startswith("malformed request")]
    assert said == [
        f"malformed request: {srv.TLS_HERE}",
        "malformed request: the request method is not a valid HTTP method",
    ]
    assert "--tls-cert FILE --tls-key FILE" in srv.TLS_HERE


@pytest.mark.parametrize(
    ("head", "endless"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: ", b"a"),  # a header value
        (b"GET / HTTP/1.1\r\nHost: x\r\nX-", b"a"),  # a header name
        # a trailer
        (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-T: ", b"a"),
        # a chunk extension
        (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;x=", b"a"),
    ],
)
def test_a_line_past_the_limits_is_refused_before_it_ends(
    head: bytes, endless: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a trial of the gateway's front door: a header line past the limits was
    refused only once it ended; one that did not end was kept whole (httptools holds it,
    copied at each read: 64 MB sent in 10 s took 110 MB and 6 s of the gateway's CPU) for
    the header timeout, a trailer's or chunk extension's for the body's 120 s, and was
    then closed without a word. It is a 400 once ``HELD_MAX`` bytes of it came (and one
    read more at most), which the client reads whole though it is still sending (what it
    sends is dropped until the close: closed at once, with those bytes unread, the
    connection was reset and the 400 lost)."""
    monkeypatch.setattr(srv, "HEADER_TIMEOUT", 60.0)  # no deadline ends it within the test

    async def test() -> None:
        async with Served() as s:
            reader, writer = await s.connect()

            async def send() -> None:  # up to 4 MB, in reads the server takes one by one
                writer.write(head)
                with contextlib.suppress(ConnectionError):
                    for _ in range(256):
                        writer.write(endless * 16384)
                        await writer.drain()

            sending = asyncio.create_task(send())
            try:
                status, headers, body = await answer(reader)  # 5 s at most
            finally:
                sending.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sending
            message = json.loads(body)["error"]["message"]
            assert (status, headers["connection"]) == (400, "close") and TOO_LONG in message
            assert await closed(reader)

    run(test)


async def _read_fields(request: Request) -> StreamResponse:
    body = await request.read()
    return json_response({"fields": request.fields, "body": body.decode()})


def test_a_chunked_bodys_trailer_fields_are_dropped_not_added_to_its_headers() -> None:
    """Found by a trial of the gateway's front door: a chunked body's trailer fields were
    added to the request's headers once its body was read, and so forwarded to the engine
    as headers none of the gateway's checks had seen (RFC 9110 §6.5.1: not merged)."""

    async def test() -> None:
        async with Served(_read_fields) as s:
            reader, writer = await s.connect()
            writer.write(
                b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"3\r\nabc\r\n0\r\nX-Forwarded-For: 6.6.6.6\r\nX-T: 1\r\n\r\n"
                b"GET / HTTP/1.1\r\nHost: y\r\n\r\n"
            )
            status, _, body = await answer(reader)
            got = json.loads(body)
            assert status == 200 and got["body"] == "abc"
            assert got["fields"] == [["Host", "x"], ["Transfer-Encoding", "chunked"]]
            status, _, body = await answer(reader)  # the next request: its own fields alone
            assert status == 200 and json.loads(body)["fields"] == [["Host", "y"]]
            writer.close()

    run(test)


@pytest.mark.parametrize(
    "body",
    [
        b"zz\r\nhello\r\n",  # a chunk size that is no hex number
        b"5\r\nhelloXX",  # a chunk that does not end where its size says
    ],
)
def test_a_body_whose_framing_breaks_mid_way_is_answered_400_at_once(body: bytes) -> None:
    """Found by a flakes round (tests/gateway/test_keys.py's random headers sent a
    `transfer-encoding: chunked` beside http.client's Content-Length): the parser fails in
    the body of the request being answered; its handler waited for the rest of a body
    that could not come (the parser is done with the connection) until its 120 s body
    timeout, and a draining gateway waited for that handler past `down`'s patience."""

    async def test() -> None:
        async with Served() as s:
            reader, writer = await s.connect()
            head = b"POST /v1/x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
            writer.write(head + body)
            status, headers, said = await answer(reader)
            assert (status, headers["connection"]) == (400, "close"), said
            assert "framing" in json.loads(said)["error"]["message"]
            assert await closed(reader)
            assert not [c for c in s.server.connections.all() if c.serving is not None]

    run(test)


def test_a_request_whose_headers_are_late_is_closed_and_one_in_time_is_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 1 s: the gap below (0.1 s) would have to stall ten times over to be late.
    monkeypatch.setattr(srv, "HEADER_TIMEOUT", 1.0)

    async def test() -> None:
        async with Served() as s:
            reader, writer = await s.connect()
            loop = asyncio.get_running_loop()
            began = loop.time()
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")  # and nothing more
            assert await closed(reader)
            assert 0.9 <= loop.time() - began < 5.0  # at the deadline, not at once
            reader, writer = await s.connect()
            await asyncio.sleep(1.5)  # idle before its first byte is not a late header
            writer.write(b"GET / HTTP/1.1\r\n")
            await asyncio.sleep(0.1)
            writer.write(b"Host: x\r\n\r\n")
            assert (await answer(reader))[0] == 200
            writer.close()

    run(test)


def test_an_idle_connection_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(srv, "IDLE_TIMEOUT", 0.3)
    monkeypatch.setattr(srv, "HEADER_TIMEOUT", 0.1)  # the timer's step: never more ahead

    async def test() -> None:
        async with Served() as s:
            reader, writer = await s.connect()
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await answer(reader))[0] == 200
            assert await closed(reader, within=3.0)

    run(test)


def test_past_the_cap_the_oldest_idle_connection_is_closed() -> None:
    async def test() -> None:
        async with Served(cap=2) as s:
            first = await s.connect()
            second = await s.connect()
            while len(s.server.connections) < 2:  # both admitted, in this order
                await asyncio.sleep(0.01)
            third = await s.connect()
            assert await closed(first[0])
            for reader, writer in (second, third):
                writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                assert (await answer(reader))[0] == 200
                writer.close()

    run(test)


def test_a_client_that_goes_away_cancels_its_handler() -> None:
    cancelled, began = asyncio.Event(), asyncio.Event()

    async def forever(request: Request) -> StreamResponse:
        began.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return Response()

    async def test() -> None:
        async with Served(forever) as s:
            for hang_up in ("close", "write_eof"):  # a FIN alone ends the request too
                cancelled.clear()
                began.clear()
                _, writer = await s.connect()
                writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                await asyncio.wait_for(began.wait(), 5)  # the handler runs: now hang up
                getattr(writer, hang_up)()
                await asyncio.wait_for(cancelled.wait(), 5)

    run(test)


def test_a_client_that_reads_nothing_of_its_answer_is_cut(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client that sends its request, then reads nothing (a stuck script, a peer gone
    without a FIN): once its answer fills the socket's buffers, the handler waited for
    it for good, holding the engine's request and a --max-inflight slot (a gateway
    trial's client held one for minutes). Past SEND_TIMEOUT without a byte taken it is
    cut as a client gone; one that reads is never cut, however long its answer runs."""
    monkeypatch.setattr(srv, "SEND_TIMEOUT", 0.3)
    ended: asyncio.Queue[str] = asyncio.Queue()

    async def endless(request: Request) -> StreamResponse:
        out = StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        try:
            if request.raw_path == "/slow":  # longer than SEND_TIMEOUT, read as it comes
                for _ in range(8):
                    await out.write(b"data: x\n\n")
                    await asyncio.sleep(0.1)
                await out.write_eof()
                return out
            while True:
                await out.write(b"x" * 65536)
        except (ConnectionResetError, asyncio.CancelledError) as exc:
            await ended.put(type(exc).__name__)
            raise

    async def test() -> None:
        async with Served(endless) as s:
            reader, writer = await s.connect()
            writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            status, _, body = await answer(reader)
            assert (status, body.count(b"data: x")) == (200, 8)
            assert ended.empty()
            _, writer = await s.connect()  # its reader is never read: its buffer fills
            with capture_logs() as said:
                writer.write(b"GET /endless HTTP/1.1\r\nHost: x\r\n\r\n")
                assert await asyncio.wait_for(ended.get(), 30) == "ConnectionResetError"
            cut = [line for line in said if line["event"].startswith("client read nothing")]
            assert cut and cut[0]["after"] == "0.3s", said

    run(test)


def test_a_failing_handler_answers_500_and_a_draining_server_says_close(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def failing(request: Request) -> StreamResponse:
        if request.raw_path == "/fail":
            raise RuntimeError("a bug")
        return Response(text="fine")

    async def test() -> None:
        async with Served(failing) as s:
            reader, writer = await s.connect()
            writer.write(b"GET /fail HTTP/1.1\r\nHost: x\r\n\r\n")
            status, headers, body = await answer(reader)
            assert (status, headers["connection"]) == (500, "close")
            assert json.loads(body)["error"]["code"] == "internal_error"
            assert await closed(reader)
            reader, writer = await s.connect()
            s.server.draining = True
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            status, headers, body = await answer(reader)
            assert (status, headers["connection"], body) == (200, "close", b"fine")
            assert await closed(reader)

    run(test)


def test_a_drain_waits_for_a_connection_still_arriving() -> None:
    """A TLS connection mid-handshake (``Connections.arriving``, tlsaccept.Acceptor) is
    not yet admitted: a drain that saw nothing open ended, and the process exited under
    its handshake, a reset for its client."""

    async def test() -> None:
        connections = Connections(8)
        connections.arriving = 1
        drain = asyncio.create_task(connections.drain(grace=30))
        await asyncio.sleep(srv.DRAIN_TICK * (srv.SETTLE_LOOKS + 3))
        assert not drain.done()
        connections.arriving = 0
        # It ends SETTLE_LOOKS ticks later (0.1 s); the cap is generous: a process stalled
        # past a cap of a few ticks (a loaded box) timed out a drain that was ending.
        await asyncio.wait_for(drain, 30)

    run(test)
