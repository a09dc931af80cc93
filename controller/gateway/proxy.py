"""Forwarding: the request as it came (method, path, query, headers, body), the answer
streamed back chunk by chunk as the engine sends it (a small answer with a
Content-Length, which the engine sends whole anyway, in one write). A client that goes away cancels
the handler, which closes the upstream connection: the engine stops generating.
"""

from __future__ import annotations

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from controller.gateway.routing import Target

# RFC 9110 §7.6.1 hop-by-hop fields, plus what aiohttp sets for the new connection.
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
WHOLE_MAX = 256 * 1024  # bytes: a sized answer up to this is passed on in one write
KEY_HEADERS = frozenset({"authorization", "x-api-key"})  # the gateway's keys stay here


class UpstreamDown(Exception):
    """The engine refused the connection before anything was sent: safe to retry."""


def _headers(
    headers: CIMultiDictProxy[str], drop: frozenset[str] = frozenset()
) -> CIMultiDict[str]:
    out: CIMultiDict[str] = CIMultiDict()
    connection = {h.strip().lower() for h in headers.get("Connection", "").split(",")}
    for key, value in headers.items():
        low = key.lower()
        if low not in HOP_BY_HOP and low not in connection and low not in drop:
            out.add(key, value)
    return out


async def forward(
    session: aiohttp.ClientSession,
    request: web.Request,
    body: bytes,
    target: Target,
    *,
    strip_keys: bool,
) -> web.StreamResponse:
    url = f"http://{_host(target.host)}:{target.port}{request.rel_url}"
    headers = _headers(request.headers, KEY_HEADERS if strip_keys else frozenset())
    try:
        upstream = await session.request(
            request.method,
            url,
            headers=headers,
            data=body,
            allow_redirects=False,
            auto_decompress=False,
        )
    except aiohttp.ClientConnectorError as exc:
        raise UpstreamDown(str(exc)) from exc
    async with upstream:
        length = upstream.content_length
        if length is not None and length <= WHOLE_MAX:
            # A sized answer (not a stream) is complete when the engine sends it: passing it
            # on as one write (headers and body together) saves a send per request.
            body = await upstream.read()
            whole = web.Response(status=upstream.status, reason=upstream.reason, body=body)
            whole.headers.extend(_headers(upstream.headers))
            return whole
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        response.headers.extend(_headers(upstream.headers))
        if length is not None:
            response.content_length = length
        await response.prepare(request)
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
        return response


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
