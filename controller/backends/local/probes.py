"""Readiness probes (HTTP GET, TCP connect), each with a short timeout.

``probe_many`` runs them concurrently so one hung engine cannot stall a pass.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from controller.core.frozen import frozen
from controller.core.state import ProbeConfig, ProbeResult

TIMEOUT = 1.0


@frozen
class Target:
    host: str
    port: int
    config: ProbeConfig


def _connect_host(host: str) -> str:
    # An engine bound to every address is reached on loopback.
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


def probe(target: Target, timeout: float = TIMEOUT) -> ProbeResult:
    host = _connect_host(target.host)
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
    import http.client  # lazily: a pass with nothing to probe never pays for it

    for path, contains in checks:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            conn.request("GET", path, headers={"Connection": "close"})
            response = conn.getresponse()
            body = response.read(1 << 20).decode("utf-8", "replace")
        finally:
            conn.close()
        if not 200 <= response.status < 300:
            return ProbeResult(False, f"GET {path} -> {response.status}")
        if contains and contains not in body:
            return ProbeResult(False, f"GET {path} does not list {contains!r} yet")
    return ProbeResult(True, f"GET {checks[-1][0]} -> 2xx")


def probe_many(targets: Mapping[str, Target], timeout: float = TIMEOUT) -> dict[str, ProbeResult]:
    if not targets:
        return {}
    if len(targets) == 1:
        ((name, target),) = targets.items()
        return {name: probe(target, timeout)}
    workers = min(32, len(targets))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="probe") as pool:
        futures = {name: pool.submit(probe, t, timeout) for name, t in targets.items()}
        return {name: f.result() for name, f in futures.items()}
