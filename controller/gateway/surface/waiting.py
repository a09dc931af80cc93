"""Waiting comments: a streaming request held while its engine starts gets an SSE comment
line every few seconds (``: waiting for <name>: <phase> <n>s``) until the engine's answer
begins, so clients and proxies with idle timeouts do not give up during a cold start.

Nothing is sent while the wait is shorter than one period: a warm engine's stream is
untouched. Once the first comment is due the answer is begun (200, ``text/event-stream``);
its head says who serves it (``x-reconcile-deployment``) only when the deployment asked
for alone can (``sole``): where a pool of several or a fallback may still serve it, or
the request waits for a fallback (which may fail as well: nothing would have served it), the head
announces the field as a trailer, and the engine's answer (proxy.py's ``_into_begun``)
names its deployment in a comment before its first event and in that trailer;
the engine's stream then goes on in it (proxy.py's ``settle``), and whatever the gateway
would have answered instead (a 503, a 502) becomes the stream's last event, an OpenAI error
body, as an engine failing mid-stream does. SSE clients (the ``openai`` client included)
skip comment lines by the standard.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable

from controller.gateway.accounting.usage import Meter
from controller.gateway.http.answers import body as error_body
from controller.gateway.http.messages import Request, Response, StreamResponse
from controller.gateway.routing.table import Table
from controller.gateway.surface.proxy import SERVED_BY, end_with_error


def wants_stream(fields: dict[str, object]) -> bool:
    return fields.get("stream") is True


def sole(table: Table, model: str) -> str | None:
    """The deployment that serves ``model``'s requests when it alone can (its pool is one
    deployment with no fallback), else None: who serves it is known only once an engine
    answers."""
    facts = table.facts(model)
    return facts.label if len(table.pools.get(model, ())) == 1 and not facts.fallbacks else None


class Waiting:
    """The comments of one request; ``settle`` stops them and gives the begun stream."""

    def __init__(
        self,
        request: Request,
        name: str,
        phase: Callable[[], str],
        every: float,
        *,
        serves: str | None,
        meter: Meter,
    ) -> None:
        self._request = request
        self._meter = meter  # the request log's first_comment_s
        self._name = name
        self._phase = phase
        self._serves = serves  # the deployment that will serve it, if only one can (sole)
        self._every = every
        self._began = time.monotonic()
        self._stop = asyncio.Event()
        self.response: StreamResponse | None = None
        self._task = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self._every)
            if self._stop.is_set():
                return
            if self.response is None:
                response = StreamResponse(status=200)
                response.headers["Content-Type"] = "text/event-stream"
                response.headers["Cache-Control"] = "no-cache"
                if self._serves is not None:
                    response.headers[SERVED_BY] = self._serves
                elif self._request.version >= (1, 1):  # a chunked body: it may have trailers
                    response.headers["Trailer"] = SERVED_BY  # set by proxy.py's _into_begun
                self.response = response
                await response.prepare(self._request)
            waited = round(time.monotonic() - self._began)
            line = f": waiting for {self._name}: {self._phase()} {waited}s\n\n"
            await self.response.write(line.encode())
            if self._meter.commented is None:
                self._meter.commented = time.monotonic()

    def follow(self, name: str, phase: Callable[[], str]) -> None:
        """The request now waits for ``name`` (a fallback): the next comments say so. A head
        begun from now on names no one, even where ``name`` alone could serve it: it may
        fail too (the gateway's 503 then ends the stream), and a head cannot be taken
        back; who answered is named once it does (proxy.py's ``_into_begun``)."""
        self._name = name
        self._phase = phase
        self._serves = None

    async def settle(self) -> StreamResponse | None:
        """No more comments (one being written is finished); the begun stream, if any."""
        self._stop.set()
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self._task
        return self.response

    async def answer(self, answer: StreamResponse) -> StreamResponse:
        """The request's answer as the client gets it: the gateway's own answer, once a
        stream was begun for comments, becomes that stream's last event."""
        begun = await self.settle()
        if begun is None or answer is begun:
            return answer
        said: object = error_body(answer.status, "the gateway could not answer", "api_error")
        if isinstance(answer, Response) and isinstance(answer.body, bytes):
            with contextlib.suppress(ValueError):
                said = json.loads(answer.body)
        await end_with_error(begun, said)
        return begun
