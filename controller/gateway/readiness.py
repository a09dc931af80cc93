"""The gateway's own look at a starting engine that a request is waiting for.

The daemon probes a Starting engine every ``periodSeconds`` and records it Ready;
a request waiting for it would pay up to a whole period on top of the engine's
start. While requests wait, the gateway runs the record's own probe every
``POLL`` seconds: the moment it passes, the table routes to that engine and the
daemon is asked for a pass (which records it Ready by the same probe).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from controller.core.state import Record
from controller.host import probes

POLL = 0.01  # seconds between probes while a request waits (loopback: cheap)
FAST_FOR = 5.0  # seconds of POLL; then SLOW_POLL (most engines start within that or take minutes)
SLOW_POLL = 0.1


async def passes(rec: Record) -> bool:
    """The record's readiness probe, once: the daemon's own (same checks, same verdict)."""
    assert rec.port is not None
    target = probes.ProbeTarget(host=rec.host, port=rec.port, config=rec.probe)
    return (await asyncio.to_thread(probes.probe, target)).ready


async def watch(rec: Record, wanted: Callable[[], bool]) -> bool:
    """True once ``rec``'s engine passes its probe; False when no longer ``wanted`` (the
    daemon judged it first, or no request waits). The caller bounds the wait."""
    started = time.monotonic()
    while wanted():
        if await passes(rec):
            return True
        # An engine that loads for minutes is not asked 100 times a second all along.
        await asyncio.sleep(POLL if time.monotonic() - started < FAST_FOR else SLOW_POLL)
    return False
