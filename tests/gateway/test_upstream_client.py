"""``gateway/http/upstream.py``, the gateway's plain HTTP/1.1 client to its engines, against
a real socket server: what it keeps alive and what it never reuses, a retry's new
connection, the cap on open connections, each way an answer can end, and the three
failures the proxy tells apart (not reached, dropped, malformed)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable

import pytest

from controller.gateway.http import upstream
from controller.gateway.http.upstream import Dropped, Malformed, Unreached, Upstream
from controller.gateway.surface import enginesock

Reply = Callable[[bytes], bytes | None]  # a request's bytes -> the answer (None: hang up)
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


class Engine:
    """A raw server: each request (head only, no body) answered by ``reply``; counts its
    connections, and those the client ended."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.connections = 0
        self.ended = 0
        self.server: asyncio.Server | None = None
        self._last: asyncio.StreamWriter | None = None  # the newest connection's

    async def __aenter__(self) -> Engine:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def send_to_last(self, data: bytes) -> None:
        """``data`` on the newest connection, unasked."""
        assert self._last is not None
        self._last.write(data)
        await self._last.drain()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._last = writer
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                answer = self.reply(head)
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
                if b"Connection: close" in answer:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.ended += 1
            writer.close()


def _client(limit: int = 8) -> Upstream:
    return Upstream(
        limit=limit,
        connect_timeout=enginesock.CONNECT_TIMEOUT,
        socket_factory=lambda triple: socket.socket(*triple),
    )


async def _get(
    up: Upstream, port: int, *, fresh: bool = False, path: str = "/x"
) -> tuple[int, bytes]:
    answer = await up.request("GET", "127.0.0.1", port, path, [], None, fresh=fresh)
    async with answer:
        return answer.status, await answer.read()


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(test())


def test_a_kept_alive_connection_serves_the_next_request() -> None:
    async def test() -> None:
        async with Engine(lambda head: OK) as engine:
            up = _client()
            for _ in range(3):
                assert await _get(up, engine.port) == (200, b"ok")
            assert engine.connections == 1
            await up.close()

    run(test)


def _timers() -> list[asyncio.TimerHandle]:
    """The running loop's live timers (asyncio's own loop keeps them in ``_scheduled``;
    a cancelled one stays there until its time)."""
    loop = asyncio.get_running_loop()
    return [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]


def test_an_idle_connection_is_closed_when_due_and_an_empty_pool_arms_no_timer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One timer while a connection is pooled, due at its ``IDLE_TIMEOUT``; none once
    nothing is. The pool was swept every 5 s from the first request on, for good: a
    gateway beside a Ready engine it had proxied to once woke every 5 s for nothing
    (tests/gateway/test_idle.py's held case)."""
    monkeypatch.setattr(upstream, "IDLE_TIMEOUT", 0.3)  # the test's seconds

    async def test() -> None:
        async with Engine(lambda head: OK) as engine:
            up = _client()
            assert _timers() == []
            await _get(up, engine.port)
            ((conn,),) = up._idle.values()
            (timer,) = _timers()  # the sweep, at the connection's end
            due = conn.idle_since + upstream.IDLE_TIMEOUT
            assert timer.when() == pytest.approx(due, abs=1.0)  # not 5 s on: the old sweep
            async with asyncio.timeout(30):
                while engine.ended == 0:
                    await asyncio.sleep(0.01)
            assert up._idle == {}
            assert _timers() == []  # nothing pooled: the loop sleeps
            assert await _get(up, engine.port) == (200, b"ok")  # a new one, swept in turn
            assert engine.connections == 2 and len(_timers()) == 1
            await up.close()
            assert _timers() == []

    run(test)


def test_a_retry_goes_on_a_new_connection() -> None:
    async def test() -> None:
        async with Engine(lambda head: OK) as engine:
            up = _client()
            await _get(up, engine.port)
            await _get(up, engine.port, fresh=True)
            assert engine.connections == 2
            await up.close()

    run(test)


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",  # 1.0 without keep-alive
    ],
)
def test_an_answer_that_ends_its_connection_is_never_pooled(answer: bytes) -> None:
    async def test() -> None:
        async with Engine(lambda head: answer) as engine:
            up = _client()
            for _ in range(2):
                assert await _get(up, engine.port) == (200, b"ok")
            assert engine.connections == 2
            await up.close()

    run(test)


@pytest.mark.parametrize("late", [False, True])
def test_bytes_past_an_answer_are_never_the_next_requests_answer(
    late: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine that sends a second answer to one request (a bug; ``late``: once the
    first was read, while the connection sits in the pool): the extra answer was read as
    the next request's own, which got another request's answer. Now the connection is
    not reused, and the next request gets its own answer on a new one."""
    monkeypatch.setattr(upstream, "IDLE_TIMEOUT", 3600.0)  # no sweep ends it meanwhile
    extra = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale"

    def reply(head: bytes) -> bytes:
        path = head.split(b" ", 2)[1]
        answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(path), path)
        return answer if late or path != b"/first" else answer + extra

    async def test() -> None:
        async with Engine(reply) as engine:
            up = _client()
            answer = await up.request("GET", "127.0.0.1", engine.port, "/first", [], None)
            async with answer:
                assert await answer.read() == b"/first"
            if late:  # the extra answer comes while the connection is idle in the pool
                (conn,) = up._idle[("127.0.0.1", engine.port)]
                await engine.send_to_last(extra)
                deadline = asyncio.get_running_loop().time() + 30
                while conn.usable():
                    assert asyncio.get_running_loop().time() < deadline, "never noticed"
                    await asyncio.sleep(0.01)
            answer = await up.request("GET", "127.0.0.1", engine.port, "/second", [], None)
            async with answer:
                assert await answer.read() == b"/second"
            assert engine.connections == 2
            await up.close()

    run(test)


def test_a_chunked_answer_comes_in_its_chunks_and_keeps_the_connection() -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n3\r\ncde\r\n0\r\n\r\n"
    )

    async def test() -> None:
        async with Engine(lambda head: chunked) as engine:
            up = _client()
            answer = await up.request("GET", "127.0.0.1", engine.port, "/", [], None)
            async with answer:
                assert answer.content_length is None
                assert [c async for c in answer.chunks()] == [b"ab", b"cde"]
            assert await _get(up, engine.port) == (200, b"abcde")
            assert engine.connections == 1
            await up.close()

    run(test)


def test_no_more_connections_than_the_limit_are_open() -> None:
    async def test() -> None:
        release = asyncio.Event()
        async with Engine(lambda head: OK) as engine:
            up = _client(limit=1)
            first = await up.request("GET", "127.0.0.1", engine.port, "/", [], None)
            second = asyncio.create_task(_get(up, engine.port))
            await asyncio.sleep(0.2)
            assert not second.done()  # waits for room: the one connection is in use
            async with first:
                assert await first.read() == b"ok"
            release.set()
            assert await asyncio.wait_for(second, 10) == (200, b"ok")
            assert engine.connections == 1
            await up.close()

    run(test)


def test_a_refused_port_is_unreached() -> None:
    async def test() -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]  # bound, not listening: refused
            up = _client()
            with pytest.raises(Unreached):
                await _get(up, port)
            await up.close()

    run(test)


def test_a_connection_closed_before_the_answer_is_dropped() -> None:
    async def test() -> None:
        async with Engine(lambda head: None) as engine:
            up = _client()
            with pytest.raises(Dropped, match="before its answer"):
                await _get(up, engine.port)
            await up.close()

    run(test)


@pytest.mark.parametrize(
    "answer",
    [
        b"SPDY/3 200 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: two\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n no-name\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-A: 1\r\nnot a header: 2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-A: 1\r\nno colon\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-A: 1\nX-B: 2\r\n\r\n",  # a line ended by LF alone
        b"HTTP/1.1 200 OK\r\nX-A: 1\r\n\nX-B: 2\r\n\r\n",  # ... an empty one too
        b"HTTP/1.1 200 OK\r\nX-A: a\rb\r\n\r\n",  # a CR alone, inside a value
        b"HTTP/1.1 200 OK\r\nX\xa0A: 1\r\n\r\n",  # a name with a (latin-1) space
    ],
)
def test_an_answer_that_is_not_http_1_is_malformed(answer: bytes) -> None:
    async def test() -> None:
        async with Engine(lambda head: answer) as engine:
            up = _client()
            with pytest.raises(Malformed):
                await _get(up, engine.port)
            await up.close()

    run(test)


@pytest.mark.parametrize("reads", [1, 40])
def test_an_answer_head_past_its_bound_is_malformed_however_it_comes(reads: int) -> None:
    """A 100 KB head (one header of it) is refused, whether it comes in one read (parsed
    whole at once: it was taken, its body passed on) or in many; 60 KB of them is not."""
    big = b"HTTP/1.1 200 OK\r\nX-Big: " + b"y" * 100_000 + b"\r\nContent-Length: 2\r\n\r\nok"
    fine = b"HTTP/1.1 200 OK\r\n" + b"X-Many: " + b"y" * 1000 + b"\r\n"
    fine = fine[:-2] + b"\r\n" + (b"X-Many: " + b"y" * 1000 + b"\r\n") * 59
    fine += b"Content-Length: 2\r\n\r\nok"

    async def send(writer: asyncio.StreamWriter, data: bytes) -> None:
        step = -(-len(data) // reads)
        for at in range(0, len(data), step):
            writer.write(data[at : at + step])
            await writer.drain()

    served: list[asyncio.Task[None]] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while head := await reader.readuntil(b"\r\n\r\n"):
                await send(writer, big if b"/big" in head else fine)
        writer.close()
        with contextlib.suppress(ConnectionError):  # reset: the client cut the big head
            await writer.wait_closed()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served.append(asyncio.create_task(answer(reader, writer)))

    async def test() -> None:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        up = _client()
        with pytest.raises(Malformed, match="an answer head over 65536 bytes"):
            await _get(up, port, path="/big")
        assert await _get(up, port) == (200, b"ok")
        await up.close()  # the server's side of each connection ends with the client's
        await asyncio.wait_for(asyncio.gather(*served), 30)
        server.close()

    run(test)


def test_an_answers_headers_are_kept_in_order_and_found_by_name() -> None:
    head = b"HTTP/1.1 200\r\nX-A:  one \t\r\nx-b:two\r\nX-A: three\r\nContent-Length: 0\r\n\r\n"

    async def test() -> None:
        async with Engine(lambda _: head) as engine:
            up = _client()
            answer = await up.request("GET", "127.0.0.1", engine.port, "/", [], None)
            assert (answer.status, answer.reason) == (200, "")
            assert answer.fields == [
                ("X-A", "one"), ("x-b", "two"), ("X-A", "three"), ("Content-Length", "0")
            ]  # fmt: skip
            assert answer.headers.getall("x-a") == ["one", "three"]
            answer.release()
            await up.close()

    run(test)


def test_a_wake_taken_by_a_request_then_cancelled_goes_on_to_the_next() -> None:
    """The first waiter is woken by the connection given back and cancelled (its client
    hung up) before it runs: the second waiter still gets the connection."""

    async def test() -> None:
        async with Engine(lambda head: OK) as engine:
            up = _client(limit=1)
            first = await up.request("GET", "127.0.0.1", engine.port, "/", [], None)
            assert await first.read() == b"ok"
            second = asyncio.create_task(_get(up, engine.port))
            third = asyncio.create_task(_get(up, engine.port))
            await asyncio.sleep(0.2)
            assert not second.done() and not third.done()
            first.release()  # wakes `second`, which has not run yet...
            second.cancel()  # ...and is cancelled before it does
            assert await asyncio.wait_for(third, 10) == (200, b"ok")
            with pytest.raises(asyncio.CancelledError):
                await second
            assert engine.connections == 1
            await up.close()

    run(test)


def test_a_request_waiting_for_room_gets_it_when_a_connection_to_another_engine_ends() -> None:
    """The cap is over all engines: a connection to one, given back idle, is closed to
    make room for a request to another."""

    async def test() -> None:
        async with Engine(lambda head: OK) as one, Engine(lambda head: OK) as other:
            up = _client(limit=1)
            first = await up.request("GET", "127.0.0.1", one.port, "/", [], None)
            waiting = asyncio.create_task(_get(up, other.port))
            await asyncio.sleep(0.2)
            assert not waiting.done()
            async with first:
                assert await first.read() == b"ok"
            assert await asyncio.wait_for(waiting, 10) == (200, b"ok")
            assert (one.connections, other.connections) == (1, 1)
            await up.close()

    run(test)


@pytest.mark.parametrize(
    "failure",
    [
        TimeoutError(110, "Connection timed out"),  # keepalive probes unanswered: a cut host
        OSError(113, "No route to host"),
        ConnectionResetError(104, "Connection reset by peer"),
    ],
)
def test_any_socket_error_on_an_open_connection_is_a_drop(failure: OSError) -> None:
    """Not only ConnectionError: a partitioned host's kept-alive connection ends with
    ETIMEDOUT, a TimeoutError, which the proxy answered with a 500 (the namespace
    partition test caught it); it is a drop like a reset (the request may go elsewhere)."""

    async def test() -> None:
        # GET /hang: no answer, the connection left open
        async with Engine(lambda head: b"" if head.startswith(b"GET /hang") else OK) as engine:
            up = _client()
            await _get(up, engine.port)  # a pooled connection to break
            key = ("127.0.0.1", engine.port)
            (conn,) = up._idle[key]
            waiting = asyncio.create_task(_get(up, engine.port, path="/hang"))
            deadline = asyncio.get_running_loop().time() + 30
            while up._idle.get(key) or conn._waiter is None:  # sent; waits for its answer
                assert asyncio.get_running_loop().time() < deadline, "the request never waited"
                await asyncio.sleep(0.01)
            conn.connection_lost(failure)  # what the loop does when the socket fails
            with pytest.raises(Dropped, match="connection failed"):
                await waiting
            await up.close()

    run(test)
