"""Closing the gateway's listener without resetting a connection it has just accepted.

asyncio's selector loop accepts a connection in the listener's callback, but builds its
transport in a task that runs a turn later; that step asserts the server is still open
(``Server._attach``). ``Server.close()`` in between makes it fail, silently unless the
loop is in debug mode (CPython gh-109564, open): the connection is never read nor closed,
and when the process exits the kernel resets the request its client sent. A gateway
handing its socket over closes its listener under load, and lost about one request in
ten hand-overs on 2 busy cores that way. So the callback comes off first, the connections
it accepted are let attach, and only then is the server closed. (uvloop attaches in the
accept callback itself: nothing is pending there.)
"""

from __future__ import annotations

import asyncio
from asyncio.selector_events import BaseSelectorEventLoop

# Loop turns for an accepted connection's transport task to run: it is scheduled by the
# accept callback and attaches in its first step, so one turn; three for margin.
ATTACH_TURNS = 3


async def close_listener(server: asyncio.Server) -> None:
    """Stop accepting on ``server``, let what it accepted attach, then close it."""
    loop = asyncio.get_running_loop()
    if isinstance(loop, BaseSelectorEventLoop):
        for sock in server.sockets:
            loop.remove_reader(sock.fileno())  # no accept after this: nothing new pends
        for _ in range(ATTACH_TURNS):
            await asyncio.sleep(0)
    server.close()
