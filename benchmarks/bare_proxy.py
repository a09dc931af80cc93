"""The gateway's framework alone: an aiohttp reverse proxy with nothing of the gateway's own.

    python benchmarks/bare_proxy.py --port P --upstream U

A baseline for ``benchmarks.gateway``: the same libraries and settings as the gateway's
data path (uvloop when installed, an ``aiohttp`` server with cancellation and no access
log, one keep-alive ``ClientSession`` to the engine, no decompression), forwarding every
request as it came and passing the answer back (a sized one whole, a stream chunk by
chunk), with no routing, keys, limits, metrics, logs or retries. Its distance from nginx
is what the framework costs; the gateway's distance from it is what the gateway's own
work costs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade", "host",
     "content-length"}
)  # fmt: skip


def _headers(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in HOP_BY_HOP)


def app(upstream: str) -> web.Application:
    state: dict[str, aiohttp.ClientSession] = {}

    async def session(_: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=0)
        state["s"] = aiohttp.ClientSession(connector=connector, auto_decompress=False)

    async def close(_: web.Application) -> None:
        await state["s"].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        async with state["s"].request(
            request.method,
            upstream + request.rel_url.raw_path_qs,
            headers=_headers(request.headers),
            data=body or None,
            allow_redirects=False,
        ) as answer:
            if answer.content_length is not None:
                data = await answer.read()
                return web.Response(
                    status=answer.status, body=data, headers=_headers(answer.headers)
                )
            out = web.StreamResponse(status=answer.status, headers=_headers(answer.headers))
            await out.prepare(request)
            async for chunk in answer.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out

    made = web.Application()
    made.on_startup.append(session)
    made.on_cleanup.append(close)
    made.router.add_route("*", "/{tail:.*}", forward)
    return made


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", type=int, required=True)
    args = parser.parse_args()
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    upstream = f"http://127.0.0.1:{args.upstream}"
    web.run_app(
        app(upstream),
        host="127.0.0.1",
        port=args.port,
        access_log=None,
        handler_cancellation=True,
        print=None,
    )


if __name__ == "__main__":
    main()
