"""Forwarding: the request as it came (method, normalised path, query, headers, plain
body; none on GET or HEAD), the answer streamed back chunk by chunk as the engine sends
it (a small answer with a Content-Length, which the engine sends whole anyway, in one
write). A client that
goes away cancels the handler, which closes the upstream connection: the engine stops
generating.

An engine that fails mid-way: before any byte of its answer, :class:`UpstreamFailed`
(the caller answers 502, or retries elsewhere when ``retry`` says it may); once the
answer has begun reaching the client, a server-sent stream ends with an error event
the client can read, any other answer is cut off (an incomplete body, never a
complete-looking one).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping

from controller.gateway.accounting.usage import Meter, StreamUsage, from_json
from controller.gateway.http.answers import body as error_body
from controller.gateway.http.messages import Passed, Request, Response, StreamResponse
from controller.gateway.http.upstream import Answer, Dropped, Malformed, Unreached, Upstream
from controller.gateway.routing.table import Target
from controller.gateway.surface.upload import Upload
from controller.logsetup import get_logger

log = get_logger("reconcile")

# RFC 9110 §7.6.1 hop-by-hop fields, plus what the engine client sets for its connection.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
# Who served it: the deployment whose engine answered (a pool's member, or a fallback's).
SERVED_BY = "x-reconcile-deployment"
# What an engine's answer loses on its way to the client: its hop-by-hop fields, and a
# who-served-it of its own (an engine that is itself a gateway): the client gets ours.
ANSWER_DROPS = HOP_BY_HOP | {SERVED_BY}
WHOLE_MAX = 256 * 1024  # bytes: a sized answer up to this is passed on in one write
TAIL_MAX = 64 * 1024  # bytes of a long JSON answer's end kept to read its usage
EVENT_MAX = 8 * 1024 * 1024  # bytes: a JSON answer passed on as a begun stream's one event
KEY_HEADERS = frozenset({"authorization", "x-api-key"})  # the gateway's keys stay here
DECODED = frozenset({"content-encoding"})  # the body goes on plain (bodies.py)
# The gateway answered a client's `Expect: 100-continue` itself: the engine gets the body.
ANSWERED = frozenset({"expect"})
# What a request's headers lose on the way to the engine, with API keys off and on (one
# set each, made once: each header is looked up in one).
SENT_DROPS = HOP_BY_HOP | DECODED | ANSWERED
SENT_DROPS_KEYED = SENT_DROPS | KEY_HEADERS
# Methods whose body is never sent on (it routed the request: its `model`). An engine on
# http.server does not read a GET's body: left on the kept-alive connection, it was parsed
# as the next request, and another client's POST got a 400.
BODILESS = frozenset({"GET", "HEAD"})
BAD_GATEWAY = 502  # an engine that failed mid-answer
UNAVAILABLE = 503  # the gateway stopping


class UpstreamDown(Exception):
    """The engine was not reached (refused, unreachable, or the connect timed out): nothing
    was sent, so the request may go to another instance."""


class UpstreamFailed(Exception):
    """The engine's connection failed before the client got a byte of the answer.

    ``retry``: it closed or reset the connection before sending any byte of its
    answer, so the request may go to another instance; not once its answer had begun.
    """

    def __init__(self, message: str, *, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


def _kept(fields: list[tuple[str, str]], drop: frozenset[str]) -> list[tuple[str, str]]:
    """``fields`` but those named in ``drop`` (lower case) or in their ``Connection``,
    in order: one pass, a second only for a message that has a ``Connection`` field
    (``connection`` is in every ``drop``)."""
    kept = []
    for field in fields:
        name = field[0].lower()
        if name not in drop:
            kept.append(field)
        elif name == "connection":
            return _kept_named(fields, drop)
    return kept


def _kept_named(fields: list[tuple[str, str]], drop: frozenset[str]) -> list[tuple[str, str]]:
    """``_kept`` for a message with a ``Connection`` field: the fields it names go too."""
    lowered = [name.lower() for name, _ in fields]
    named = ",".join([v for (_, v), n in zip(fields, lowered, strict=True) if n == "connection"])
    drop = drop | {h.strip().lower() for h in named.split(",")}
    return [field for field, name in zip(fields, lowered, strict=True) if name not in drop]


async def forward(
    upstream_client: Upstream,
    request: Request,
    body: bytes | Upload,
    target: Target,
    path: str,
    query: str,
    meter: Meter,
    *,
    strip_keys: bool,
    settle: Callable[[], Awaitable[StreamResponse | None]] | None = None,
    inject: Callable[[MutableMapping[str, str]], None] | None = None,
    fresh: bool = False,
) -> StreamResponse:
    """``path``: the normalised path and query (``http/paths.py``), the only one sent on.

    ``settle``: called once the engine's answer has begun (its head came); it stops the
    waiting comments (waiting.py) and gives the stream already begun for them, if any,
    into which the answer then goes. ``inject``: puts the trace context (``traceparent``)
    in the headers sent on (tracing.py). ``fresh``: on a new connection, not a pooled one
    (a retry's)."""
    # The path as normalised (http/paths.py), never re-normalised or re-quoted.
    sent = f"{path}?{query}" if query else path
    drop = SENT_DROPS_KEYED if strip_keys else SENT_DROPS
    context: dict[str, str] = {}  # the trace's, in place of the client's own
    if inject is not None:
        inject(context)
        drop = drop | {name.lower() for name in context}
    headers = _kept(request.fields, drop)
    headers += context.items()
    data: bytes | AsyncIterator[bytes] | None = None
    length = None  # a streamed upload's, as the client sent it
    if request.method not in BODILESS:
        data = body if isinstance(body, bytes) else body.chunks()
        length = body.length if isinstance(body, Upload) else None
    try:
        upstream = await upstream_client.request(
            request.method,
            target.host,
            target.port,
            sent,
            headers,
            data,
            length=length,
            fresh=fresh,
        )
    except Unreached as exc:
        # Refused, unreachable, or a SYN never answered (a cut link): nothing was sent.
        raise UpstreamDown(str(exc)) from exc
    except Dropped as exc:
        raise UpstreamFailed(_said(exc), retry=True) from exc
    except Malformed as exc:  # the engine did answer
        raise UpstreamFailed(_said(exc), retry=False) from exc
    try:
        begun = await settle() if settle is not None else None
        if begun is not None:
            return await _into_begun(request, begun, upstream, target, meter)
        length = upstream.content_length
        if length is None or length > WHOLE_MAX:
            return await _stream(request, upstream, target, meter)
        # A sized answer (not a stream) is complete when the engine sends it: passing it
        # on as one write (headers and body together) saves a send per request.
        try:
            data = await upstream.read()
        except (Dropped, Malformed) as exc:
            raise UpstreamFailed(_said(exc), retry=False) from exc
        meter.answered()
        headers = _kept(upstream.fields, ANSWER_DROPS)
        headers.append((SERVED_BY, target.deployment))
        whole = Passed(
            status=upstream.status,
            reason=upstream.reason,
            fields=headers,
            named=upstream.headers,
            body=data,
        )
        await _send_now(request, whole)
    finally:
        # Kept alive when read to its end, else closed; after the client's answer, not
        # on its way.
        upstream.release()
    if upstream.status < 300:
        from_json(data, meter)  # the tokens it used: once the client has its answer
    return whole


async def _send_now(request: Request, whole: Response) -> None:
    """The whole answer to the client now, not once the request's handling has unwound:
    the counts, the log line and the limits' releases then follow the answer instead of
    delaying it (about a third of the gateway's own time at one client)."""
    try:
        await whole.prepare(request)
    except ConnectionError:  # the client went away: its connection ends with this answer
        whole.force_close()


async def _into_begun(
    request: Request,
    begun: StreamResponse,
    upstream: Answer,
    target: Target,
    meter: Meter,
) -> StreamResponse:
    """The engine's answer into a stream already begun (200, event-stream) for waiting
    comments: an event stream goes on as it comes; another 2xx, its one event
    (``_as_event``); anything else (an engine's error) can no longer be its status, so it
    becomes the stream's last event, an OpenAI error body.
    A head that could not say who serves it (waiting.py) announced a trailer: now that
    it is known, a comment names the deployment at once, and the trailer at the end."""
    if SERVED_BY not in begun.headers:
        begun.trailers = ((SERVED_BY, target.deployment),)
        with contextlib.suppress(ConnectionError):  # _pump's writes find a client gone
            await begun.write(f": {SERVED_BY}: {target.deployment}\n\n".encode())
    kind = upstream.headers.get("Content-Type", "")
    if upstream.status < 300 and kind.startswith("text/event-stream"):
        return await _pump(request, begun, upstream, target, meter)
    if upstream.status < 300:
        return await _as_event(begun, upstream, target, meter, kind)
    try:
        said = (await upstream.read_some(TAIL_MAX)).decode("utf-8", "replace")
    except (Dropped, Malformed) as exc:
        said = _said(exc)
    meter.answered()
    meter.ended_with = upstream.status
    why = f"the engine of {target.deployment!r} answered {upstream.status}: {said[:2000]}"
    code = "upstream_error" if upstream.status < 400 else "engine_error"
    await end_with_error(begun, error_body(upstream.status, why, code))
    return begun


async def _as_event(
    begun: StreamResponse, upstream: Answer, target: Target, meter: Meter, kind: str
) -> StreamResponse:
    """A 2xx that is no event stream (a path that answers JSON to ``stream: true``) into
    a stream begun for waiting comments: the JSON as the stream's one ``data:`` event, then
    ``data: [DONE]``, as OpenAI-compatible proxies pass a whole answer on. Without a cold
    start the client got that JSON as it is; it became an error event, so the outcome hung
    on the timing. A body that is not JSON, or past EVENT_MAX, cannot be one event: the
    last event then says what the engine answered."""
    try:
        data = await upstream.read_some(EVENT_MAX + 1)
        whole = len(data) <= EVENT_MAX and _is_json(data)
        said = "" if whole else f"{kind or 'no Content-Type'}, not JSON in {EVENT_MAX} bytes"
    except (Dropped, Malformed) as exc:
        data, whole, said = b"", False, f"its body failed: {_said(exc)}"
    meter.answered()
    if not whole:
        meter.ended_with = BAD_GATEWAY
        why = (
            f"the engine of {target.deployment!r} answered {upstream.status} with {said}, "
            "which an event stream cannot carry (the stream had begun while it started); "
            "retry now that it is Ready (no stream begins: its answer comes as it is), or "
            "send the request without `stream: true`"
        )
        await end_with_error(begun, error_body(BAD_GATEWAY, why, "upstream_error"))
        return begun
    from_json(data, meter)  # the tokens it used
    # Raw CR and LF in JSON are whitespace only (never inside a string): one event's line.
    line = data.replace(b"\r", b"").replace(b"\n", b"")
    with contextlib.suppress(ConnectionError):
        await begun.write(b"data: " + line + b"\n\ndata: [DONE]\n\n")
        await begun.write_eof()
    return begun


def _is_json(data: bytes) -> bool:
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


async def end_with_error(begun: StreamResponse, body: object) -> None:
    """A begun event stream's last event: an error body (its status is sent already)."""
    with contextlib.suppress(ConnectionError):
        await begun.write(f"data: {json.dumps(body)}\n\n".encode())
        await begun.write_eof()


async def _stream(
    request: Request, upstream: Answer, target: Target, meter: Meter
) -> StreamResponse:
    headers = _kept(upstream.fields, ANSWER_DROPS)
    headers.append((SERVED_BY, target.deployment))
    response = StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
    kind = upstream.headers.get("Content-Type", "")
    sse = kind.startswith("text/event-stream")
    if upstream.content_length is not None and not (sse and meter.strip):
        response.content_length = upstream.content_length
    return await _pump(request, response, upstream, target, meter)


async def _pump(
    request: Request,
    response: StreamResponse,
    upstream: Answer,
    target: Target,
    meter: Meter,
) -> StreamResponse:
    """The engine's body into ``response`` (prepared here if it is not yet)."""
    kind = upstream.headers.get("Content-Type", "")
    sse = StreamUsage(meter) if kind.startswith("text/event-stream") else None
    json_tail = b"" if sse is None and "json" in kind and upstream.status < 300 else None
    try:
        if not response.prepared:
            await response.prepare(request)
        meter.status = response.status  # what a client gone mid-answer is logged with
        async for chunk in upstream.chunks():
            out = sse.feed(chunk) if sse is not None else chunk
            if json_tail is not None:
                json_tail = (json_tail + chunk)[-TAIL_MAX:]
            if out:
                meter.answered()
                await response.write(out)
        if sse is not None and (rest := sse.flush()):
            await response.write(rest)
        if json_tail:
            from_json(json_tail, meter)
        await response.write_eof()
    except (Dropped, Malformed) as exc:  # the engine's side (only its chunks raise these)
        meter.ended_with = BAD_GATEWAY
        await _cut(request, response, upstream, target, exc)
    except ConnectionError:  # the client hung up (often right after `data: [DONE]`)
        log.info("client went away mid-answer", deployment=target.deployment)
    except asyncio.CancelledError:
        why = request.protocol.cut
        if why is not None and sse is not None and response.prepared:
            # the gateway's drain ran out: the stream's last event says so, not a bare close
            meter.ended_with = UNAVAILABLE
            await end_with_error(response, error_body(UNAVAILABLE, why, "gateway_stopping"))
        raise
    return response


async def _cut(
    request: Request,
    response: StreamResponse,
    upstream: Answer,
    target: Target,
    exc: BaseException,
) -> None:
    """The engine failed mid-answer: an SSE stream's last event says so; other answers
    are cut off (the client sees an incomplete body, not a complete-looking one)."""
    log.info(
        "engine connection lost mid-answer",
        deployment=target.deployment,
        instance=target.instance,
        error=_said(exc),
        next=f"if it recurs, its own log may say why: reconcile logs {target.deployment}",
    )
    sse = upstream.headers.get("Content-Type", "").startswith("text/event-stream")
    try:
        if sse and response.prepared:
            name = target.deployment
            why = (
                f"the engine of {name!r} closed the connection mid-stream; retry, and if it "
                f"recurs, `reconcile describe {name}` and `reconcile logs {name}` say why it ended"
            )
            event = json.dumps(error_body(BAD_GATEWAY, why, "upstream_error"))
            await response.write(f"data: {event}\n\n".encode())
            await response.write_eof()
            return
    except ConnectionError:
        return
    request.protocol.force_close()  # the client sees the answer cut off


def _said(exc: BaseException) -> str:
    if isinstance(exc, (Dropped, Malformed)):  # upstream.py's own words, for people
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
