"""The gateway's front door, one category of abuse at a time (gatewayfuzz.py's random mix
misses some on purpose: they need many connections or big sizes): bad request lines,
headers past 64 KB, bad JSON, ``model`` of every wrong type, bodies over the limit,
chunked tricks, requests cut mid-body, pipelining, unknown methods, and slowloris with
200 half-open connections. After each category a normal request is served; no client
error is ever answered with a 5xx; the daemon and the gateway never restart; their RSS
and open descriptors are back within 10% (plus a small floor) at the end.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import procs
import pytest

from .cluster import Cluster
from .gatewayfuzz import MAX_BODY
from .rawhttp import exchange, request
from .test_gateway_fuzz import KEY, start

AUTH = {"x-api-key": KEY, "Content-Type": "application/json"}
HALF_OPEN = 200
SLACK_FDS = 8  # descriptors a Python process may open lazily (a log, a resolver socket)
SLACK_RSS = 4 << 20  # bytes: the allocator's arenas after 200 connections


def _post(body: bytes, **headers: str) -> bytes:
    return request("POST", "/v1/completions", body, {**AUTH, **headers})


WRONG_MODELS: list[object] = [1, 1.5, True, None, [], ["m"], {}, {"m": 1}, "", "x" * 70_000]


def categories() -> Iterator[tuple[str, list[bytes]]]:
    yield (
        "bad request lines",
        [
            b"\r\n\r\n",
            b"GARBAGE\r\n\r\n",
            b"GET\r\n\r\n",
            b"GET / HTTP/1.1 extra words\r\nHost: g\r\n\r\n",
            b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: g\r\n\r\n",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,  # a TLS hello
        ],
    )
    yield (
        "headers past 64 KB",
        [
            _post(b'{"model": "m"}', **{"X-Big": "v" * 70_000}),
            _post(b'{"model": "m"}', **{f"X-H{i}": "v" * 100 for i in range(700)}),
        ],
    )
    yield (
        "bad JSON",
        [
            _post(b"{"),
            _post(b'{"model": "m",}'),
            _post(b"\xff\xfe{}"),
            _post(b"[" * 10_000),
            _post(b'{"model": "m", "model": "n"}'),
            _post(b"null"),
        ],
    )
    yield (
        "model of every wrong type",
        [_post(json.dumps({"model": m}).encode()) for m in WRONG_MODELS],
    )
    yield (
        "bodies over the limit",
        [
            _post(b'{"model": "m", "prompt": "' + b"x" * (MAX_BODY * 2) + b'"}'),
            _post(b"", **{"Content-Length": str(MAX_BODY * 1000)}),
        ],
    )
    chunk = b'{"model": "m"}'
    yield (
        "chunked tricks",
        [
            _chunked(b"%x\r\n%s\r\n0\r\n\r\n" % (len(chunk), chunk), "chunked"),
            _chunked(b"zz\r\nxx\r\n0\r\n\r\n", "chunked"),
            _chunked(b"ffffffffffffffff\r\n", "chunked"),
            _chunked(b"5;ext=" + b"e" * 70_000 + b"\r\nhello\r\n0\r\n\r\n", "chunked"),
            _chunked(b"0\r\n\r\n", "chunked, chunked"),
            _chunked(b"4\r\nabcd\r\n0\r\n\r\n", "identity, chunked", length="4"),
        ],
    )
    yield (
        "unknown methods",
        [
            request(m, "/v1/completions", b"", AUTH)
            for m in ("BREW", "PROPFIND", "CONNECT", "TRACE")
        ],
    )
    # The demo engine answers these 501 itself: a 5xx about the request, which once made
    # passive health eject the healthy engine (then 503 for everyone for 30 s).
    yield (
        "methods the engine does not implement",
        [request("DELETE", "/v1/completions", b'{"model": "m"}', AUTH) for _ in range(5)],
    )


def _chunked(body: bytes, coding: str, length: str | None = None) -> bytes:
    head = "POST /v1/completions HTTP/1.1\r\nHost: g\r\nConnection: close\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in AUTH.items())
    head += f"Transfer-Encoding: {coding}\r\n"
    if length is not None:
        head += f"Content-Length: {length}\r\n"
    return head.encode() + b"\r\n" + body


def _cut_mid_body(port: int) -> None:
    """Requests that stop halfway through their body, the socket then closed."""
    for _ in range(20):
        body = b'{"model": "m", "prompt": "' + b"x" * 1000
        data = _post(body + b'"}')[: -len(body) // 2]
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(data)


def _pipelined(port: int) -> list[int | None]:
    """Three requests in one write on one keep-alive connection: each answered in order."""
    one = _post(b'{"model": "m"}').replace(b"Connection: close", b"Connection: keep-alive")
    last = _post(b'{"model": "m"}')
    answer = exchange(port, one + one + last, timeout=30)
    lines = answer.data.split(b"\r\n")
    statuses: list[int | None] = [
        int(line.split()[1]) for line in lines if line.startswith(b"HTTP/1.1 ")
    ]
    return statuses or [answer.status]


def _slowloris(port: int, count: int) -> None:
    """``count`` connections, each a header block begun and never finished, held open
    while a normal request must still be served; then all closed."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: g\r\nX-Slow: ")
            socks.append(sock)
        for sock in socks[::20]:
            sock.sendall(b"a")  # a trickle, as slowloris sends
        _served(port, "while 200 connections hang half-open")
    finally:
        for sock in socks:
            sock.close()


def _served(port: int, after: str) -> None:
    answer = exchange(port, _post(b'{"model": "m", "prompt": "hi"}'), timeout=30)
    assert answer.status == 200, f"a normal request after {after}: {answer!r}"


def _usage(pid: int) -> tuple[int, int]:
    """(RSS bytes, open descriptors) of a live process."""
    rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def _within(before: tuple[int, int], after: tuple[int, int]) -> bool:
    return after[0] <= before[0] * 1.1 + SLACK_RSS and after[1] <= before[1] * 1.1 + SLACK_FDS


def _settled(pid: int, before: tuple[int, int]) -> tuple[int, int]:
    """Usage once closed connections are reaped (the gateway closes them in the background)."""
    now = _usage(pid)
    deadline = time.monotonic() + 30
    while not _within(before, now) and time.monotonic() < deadline:
        time.sleep(0.5)
        now = _usage(pid)
    return now


@pytest.mark.slow  # ~55 s: the default run's budget (15 min) keeps the 200-request fuzz
def test_every_category_of_abuse(cluster: Cluster) -> None:
    daemon, port = start(cluster)
    gateways = procs.marked_pids(f"{cluster.node}/", marker=procs.GATEWAY_MARKER)
    assert len(gateways) == 1, gateways
    gateway = gateways.pop()
    for _ in range(20):  # warm: first requests allocate what every later one reuses
        _served(port, "warming up")
    before = {p: _usage(p) for p in (daemon.pid, gateway)}
    tried: dict[str, int] = {}
    checks: list[tuple[str, Callable[[], None]]] = [
        ("requests cut mid-body", lambda: _cut_mid_body(port)),
        ("slowloris", lambda: _slowloris(port, HALF_OPEN)),
    ]
    for name, cases in categories():
        for data in cases:
            answer = exchange(port, data, timeout=30)
            engine = answer.headers.get("server", "").startswith("BaseHTTP")
            client_error = answer.status is None or answer.status < 500 or engine
            assert client_error, (name, data[:100], answer)
        tried[name] = len(cases)
        _served(port, name)
    for name, check in checks:
        check()
        tried[name] = 1
        _served(port, name)
    statuses = _pipelined(port)
    assert all(s == 200 for s in statuses) and statuses, statuses
    tried["pipelining"] = 1
    _served(port, "pipelining")
    assert procs.marked_pids(f"{cluster.node}/", marker=procs.GATEWAY_MARKER) == {gateway}
    assert daemon.poll() is None, cluster.stderr(daemon)[-3000:]
    after = {p: _settled(p, before[p]) for p in before}
    grown = {p: (before[p], after[p]) for p in before if not _within(before[p], after[p])}
    assert not grown, f"RSS or descriptors grew past 10% (before, after): {grown}"
    assert "Traceback" not in cluster.stderr(daemon)
    print(f"\ngateway categories: {tried}; usage before/after: {before} {after}")
