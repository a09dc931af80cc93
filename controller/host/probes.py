"""Readiness probes (HTTP GET, TCP connect), each with a short timeout.

``probe_many`` runs them concurrently so one hung engine cannot stall a pass.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from controller.core.state import ProbeConfig, ProbeResult

TIMEOUT = 1.0
LIMIT = 1 << 20  # bytes of an answer read: a probe needs a status and a short body


@dataclass(frozen=True, slots=True)
class ProbeTarget:
    host: str
    port: int
    config: ProbeConfig


def connect_host(host: str) -> str:
    # An engine bound to every address is reached on loopback.
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


def probe(target: ProbeTarget, timeout: float = TIMEOUT) -> ProbeResult:
    host = connect_host(target.host)
    try:
        if target.config.http:
            return _http(host, target.port, target.config.http, timeout)
        if target.config.tcp:
            with socket.create_connection((host, target.port), timeout=timeout):
                return ProbeResult(True, f"tcp {target.port} accepts")
    except OSError as exc:
        return ProbeResult(False, f"{type(exc).__name__}: {exc}")
    return ProbeResult(True, "running (no readiness probe)")


def _http(
    host: str, port: int, checks: tuple[tuple[str, str | None], ...], timeout: float
) -> ProbeResult:
    for path, contains in checks:
        status, body = http_get(host, port, path, timeout)
        if not 200 <= status < 300:
            return ProbeResult(False, f"GET {path} -> {status}")
        if contains and contains not in body:
            return ProbeResult(False, f"GET {path} does not list {contains!r} yet")
    return ProbeResult(True, f"GET {checks[-1][0]} -> 2xx")


def http_get(host: str, port: int, path: str, timeout: float) -> tuple[int, str]:
    """One HTTP/1.0 GET over a plain socket: the status and up to 1 MiB of the body.

    Not http.client: it imports ssl and email (~6 MB resident in a daemon that only
    asks an engine for a status line). HTTP/1.0 with ``Connection: close`` is never
    chunked; the body ends at its Content-Length, or when the engine closes.
    """
    request = f"GET {path} HTTP/1.0\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
    data = bytearray()
    with socket.create_connection((host, port), timeout=timeout) as conn:
        conn.sendall(request.encode("latin-1"))
        while len(data) <= LIMIT and not _complete(data):
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = bytes(data).partition(b"\r\n\r\n")
    parts = head.split(b"\r\n", 1)[0].split()
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        raise ConnectionError(f"not an HTTP answer: {bytes(head[:60])!r}")
    return int(parts[1]), body[:LIMIT].decode("utf-8", "replace")


def _complete(data: bytearray) -> bool:
    """Headers in, and as much body as their Content-Length says (if they say)."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return False
    for line in bytes(data[:end]).split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return len(data) - end - 4 >= int(value)
    return False


def probe_many(
    targets: Mapping[str, ProbeTarget], timeout: float = TIMEOUT
) -> dict[str, ProbeResult]:
    if not targets:
        return {}
    if len(targets) == 1:
        ((name, target),) = targets.items()
        return {name: probe(target, timeout)}
    workers = min(32, len(targets))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="probe") as pool:
        futures = {name: pool.submit(probe, t, timeout) for name, t in targets.items()}
        return {name: f.result() for name, f in futures.items()}
