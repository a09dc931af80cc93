"""Closing the listener loses no connection it accepted (controller/gateway/lifecycle/listener.py).

As in a hand-over, another descriptor of the listening socket stays open (the successor's),
so a connection is either attached here (its protocol told ``connection_made``) or still
in the kernel's queue for the successor to accept. asyncio's own ``Server.close()`` loses
one accepted a turn before it (CPython gh-109564): neither attached nor queued, it is
reset when the process exits. The close comes 0 to 6 loop turns after the connect.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import socket
from collections.abc import Awaitable, Callable

import pytest

from controller.gateway.lifecycle.listener import close_listener

TURNS = range(7)


async def _plain_close(server: asyncio.Server) -> None:
    server.close()


async def _found(close: Callable[[asyncio.Server], Awaitable[None]], turns: int) -> int:
    """Where a connection made ``turns`` loop turns before the close ends up: 1 when it was
    attached or is still queued for the successor, 0 when it was lost."""
    made: list[asyncio.BaseTransport] = []

    class Seen(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            made.append(transport)

    server = await asyncio.get_running_loop().create_server(Seen, "127.0.0.1", 0)
    listening = server.sockets[0]
    successor = socket.socket(fileno=os.dup(listening.fileno()))  # the socket lives on
    successor.setblocking(False)
    client = socket.create_connection(listening.getsockname()[:2])
    try:
        client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\n\r\n")
        for _ in range(turns):
            await asyncio.sleep(0)
        await close(server)
        for _ in range(5):
            await asyncio.sleep(0)
        queued = []
        with contextlib.suppress(BlockingIOError):
            while True:
                queued.append(successor.accept()[0])
        for conn in queued:
            conn.close()
        for transport in made:
            transport.close()
        return len(made) + len(queued)
    finally:
        client.close()
        successor.close()


def test_a_connection_accepted_as_the_listener_closes_is_attached_or_left_queued() -> None:
    found = [asyncio.run(_found(close_listener, turns)) for turns in TURNS]
    assert found == [1] * len(TURNS), found


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_asyncio_s_own_close_loses_one_so_the_case_above_is_real() -> None:
    """The control: the same sweep with ``Server.close()`` alone loses the connection at
    some turn (its socket, never closed, warns when collected: ignored here)."""
    found = [asyncio.run(_found(_plain_close, turns)) for turns in TURNS]
    gc.collect()  # the lost socket warns now, here, not in whichever test runs next
    assert 0 in found, found
