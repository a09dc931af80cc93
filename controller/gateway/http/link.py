"""One connection to an engine (upstream.py's pool holds them): the protocol asyncio feeds,
with the reads an answer needs: up to a separator, an exact count, or what came.

Why not asyncio's streams (``open_connection``): a reader, a writer and a protocol between
them, each read a coroutine that waits in another, each byte fed through three objects.
On the gateway's request path that was 27 of its ~380 calls per request; here it is one
object, and a read whose bytes are already here returns them without waiting. The reads
keep the streams' contract (upstream.py relies on it): ``IncompleteReadError`` at an end
that came too soon, ``LimitOverrunError`` past ``limit`` bytes with no separator, and the
connection's own error (a reset, a keepalive probe's timeout) once it was lost with one.
"""

from __future__ import annotations

import asyncio
from typing import cast


class Link(asyncio.Protocol):
    """An engine connection's bytes as they come, read by one reader at a time. Past
    twice ``limit`` bytes unread, the socket is not read until they are (a fast engine
    streaming to a slow client is held back by its own socket's window)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._buffer = bytearray()
        self._eof = False  # the engine sent its FIN, or the connection was lost
        self._error: BaseException | None = None  # why the connection was lost, if not EOF
        self._transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiter: asyncio.Future[None] | None = None  # a read waiting for bytes
        self._writable: asyncio.Future[None] | None = None  # set while writes are paused
        self._paused = False  # reading paused: the buffer is full

    # -- asyncio's side
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        # Kept: on Python 3.11 each lookup of the running loop is a getpid() system call.
        self._loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if not self._paused and len(self._buffer) > 2 * self._limit:
            self._paused = True
            assert self._transport is not None
            self._transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return False  # the transport closes itself: an engine's FIN ends the connection

    def connection_lost(self, exc: BaseException | None) -> None:
        self._eof = True
        if exc is not None:
            self._error = exc
        self._wake()
        writable = self._writable
        if writable is not None and not writable.done():
            writable.set_exception(exc or ConnectionResetError("the connection was lost"))
            writable.exception()  # read here: no one may be waiting on it

    def pause_writing(self) -> None:
        if self._writable is None or self._writable.done():
            assert self._loop is not None
            self._writable = self._loop.create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    # -- the pool's side
    def open(self) -> bool:
        """Still open at both ends: an engine that closed it while idle left an EOF."""
        return not self._eof and self._transport is not None and not self._transport.is_closing()

    def write(self, data: bytes) -> None:
        if self._transport is None or self._transport.is_closing():
            raise self._error or ConnectionResetError("the connection was lost")
        self._transport.write(data)

    async def drain(self) -> None:
        """Wait while the socket's send buffer is full."""
        if self._error is not None:
            raise self._error
        writable = self._writable
        if writable is not None and not writable.done():
            await asyncio.shield(writable)
        elif not self.open():
            raise ConnectionResetError("the connection was lost")

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    # -- the reads
    async def readuntil(self, separator: bytes) -> bytes:
        """The bytes up to and with ``separator``."""
        while True:
            at = self._buffer.find(separator)
            if at >= 0:
                return self._take(at + len(separator))
            if len(self._buffer) > self._limit:
                raise asyncio.LimitOverrunError("no separator within the limit", self._limit)
            await self._more(None)

    def ready(self, n: int) -> bytes | None:
        """``n`` bytes if they are here already (a sized answer's body comes with its
        head), else None: read them with ``readexactly``."""
        return self._take(n) if len(self._buffer) >= n else None

    async def readexactly(self, n: int) -> bytes:
        """``n`` bytes."""
        while len(self._buffer) < n:
            await self._more(n)
        return self._take(n)

    async def read(self, most: int) -> bytes:
        """What came, up to ``most`` bytes; b"" at the end."""
        if not self._buffer:
            if self._eof and self._error is None:
                return b""
            await self._more(None, at_end=b"")
            if not self._buffer:
                return b""
        return self._take(min(most, len(self._buffer)))

    def _take(self, n: int) -> bytes:
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        if self._paused and len(self._buffer) <= self._limit:
            self._paused = False
            assert self._transport is not None
            self._transport.resume_reading()
        return data

    async def _more(self, expected: int | None, at_end: bytes | None = None) -> None:
        """Wait for more bytes; at the connection's end its error, else (unless the
        caller takes the end as ``at_end``) IncompleteReadError with what was left."""
        if self._error is not None:
            raise self._error
        if self._eof:
            if at_end is not None:
                return
            partial = bytes(self._buffer)
            self._buffer.clear()
            raise asyncio.IncompleteReadError(partial, expected)
        if self._paused:  # a read wants more than the full buffer holds (a long line)
            self._paused = False
            assert self._transport is not None
            self._transport.resume_reading()
        assert self._loop is not None
        self._waiter = waiter = self._loop.create_future()
        await waiter
