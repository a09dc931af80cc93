"""The gateway's own look at an engine: a starting one that a request is waiting for,
and a silent one a client gave up on (``silent``).

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

from controller.core.state import ProbeConfig, Record
from controller.host import probes

# Seconds a silent engine gets to answer any HTTP request (a liveness probe's default).
SILENT_TIMEOUT = 5.0
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


async def silent(host: str, port: int, rec: Record | None) -> str | None:
    """Why the engine looks hung, or None when it answers HTTP (any status) at once.

    A client gave up on it before a byte of its answer: a hung engine (SIGSTOP'd: the
    kernel still accepts) or a slow answer (a long completion sends nothing until it is
    done). A slow engine still answers another request, so a quick GET tells them apart:
    its record's probe path (``/`` without one), any status. A TCP probe could not tell:
    a stopped process's port still accepts.
    """
    path = next((p for config in _configs(rec) for p, _ in config.http), "/")
    try:
        await asyncio.to_thread(
            probes.request, probes.connect_host(host), port, "GET", path, SILENT_TIMEOUT
        )
    except TimeoutError:
        return f"no answer within {SILENT_TIMEOUT:g}s, nor to GET {path}"
    except OSError as exc:
        return f"no answer, and GET {path} failed: {type(exc).__name__}"
    return None


def _configs(rec: Record | None) -> tuple[ProbeConfig, ...]:
    if rec is None:
        return ()
    return (rec.liveness, rec.probe) if rec.liveness is not None else (rec.probe,)
