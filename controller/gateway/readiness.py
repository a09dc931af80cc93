"""The gateway's own look at a starting engine that a request is waiting for.

The daemon probes a Starting engine every ``periodSeconds`` and records it Ready;
a request waiting for it would pay up to a whole period on top of the engine's
start. While requests wait, the gateway runs the record's own probe every
``POLL`` seconds: the moment it passes, the table routes to that engine and the
daemon is asked for a pass (which records it Ready by the same probe).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import aiohttp

from controller.core.state import Record

POLL = 0.01  # seconds between probes while a request waits (loopback: cheap)
FAST_FOR = 5.0  # seconds of POLL; then SLOW_POLL (most engines start within that or take minutes)
SLOW_POLL = 0.1
TIMEOUT = aiohttp.ClientTimeout(total=1.0)


async def passes(session: aiohttp.ClientSession, rec: Record) -> bool:
    """The record's readiness probe, once: every HTTP check 2xx (and its text), or TCP."""
    assert rec.port is not None
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(rec.host, rec.host)
    netloc = f"[{host}]:{rec.port}" if ":" in host else f"{host}:{rec.port}"
    try:
        for path, contains in rec.probe.http:
            async with session.get(f"http://{netloc}{path}", timeout=TIMEOUT) as resp:
                text = await resp.text(errors="replace")
                if not 200 <= resp.status < 300 or (contains and contains not in text):
                    return False
        if not rec.probe.http and rec.probe.tcp:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, rec.port), 1.0)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    except (OSError, aiohttp.ClientError, TimeoutError):
        return False
    return True


async def watch(session: aiohttp.ClientSession, rec: Record, wanted: Callable[[], bool]) -> bool:
    """True once ``rec``'s engine passes its probe; False when no longer ``wanted`` (the
    daemon judged it first, or no request waits). The caller bounds the wait."""
    started = time.monotonic()
    while wanted():
        if await passes(session, rec):
            return True
        # An engine that loads for minutes is not asked 100 times a second all along.
        await asyncio.sleep(POLL if time.monotonic() - started < FAST_FOR else SLOW_POLL)
    return False
