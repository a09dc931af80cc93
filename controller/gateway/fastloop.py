"""The gateway's event loop: uvloop's (a plain dependency since issue 41), asyncio's own
where it cannot be imported (a platform without a wheel, a broken build).

uvloop (libuv underneath, kept by the MagicStack authors, the loop uvicorn uses) cuts
the loop's own cost per request; nothing in the gateway depends on which loop runs.
``RECONCILE_GATEWAY_LOOP=asyncio`` keeps asyncio's (to compare, or to rule it out).
"""

from __future__ import annotations

import asyncio
import importlib
import os

ENV = "RECONCILE_GATEWAY_LOOP"


def new_loop() -> asyncio.AbstractEventLoop:
    if os.environ.get(ENV, "").strip().lower() != "asyncio":
        try:
            uvloop = importlib.import_module("uvloop")
        except ImportError:
            pass
        else:
            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
            return loop
    return asyncio.new_event_loop()


def name(loop: asyncio.AbstractEventLoop) -> str:
    """``uvloop`` or ``asyncio``, for the start line."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
