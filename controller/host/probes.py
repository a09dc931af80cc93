"""Readiness and liveness probes (HTTP GET, TCP connect, a one-token completion), each
bounded by its timeout as a whole (connect, send and every read), not per step.

``probe_many`` runs them concurrently so one hung engine cannot stall a pass.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from controller.core.state import ProbeConfig, ProbeResult

TIMEOUT = 1.0
LIMIT = 1 << 20  # bytes of an answer read: a probe needs a status and a short body
# A completion probe's budget: 16 tokens, not 1. A reasoning model's server may refuse a
# max_tokens too small for it (LiteLLM's max_tokens=1 probe did), and one that spends all
# 16 thinking still answers 200 with a choice (finish_reason "length"): healthy.
MAX_TOKENS = 16
PROMPT = "Say OK."
# The answers of an engine that wants a key (or a key it does not take).
REFUSED = (401, 403)


@dataclass(frozen=True, slots=True)
class ProbeTarget:
    host: str
    port: int
    config: ProbeConfig
    # The engine's own API key (core/engines/apikey.py), sent as a bearer token: a keyed
    # engine refuses an anonymous probe. Found by the prober, never in a record, a repr,
    # a message or an event.
    bearer: str = field(default="", repr=False)


def connect_host(host: str) -> str:
    # An engine bound to every address is reached on loopback.
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


def probe(target: ProbeTarget, timeout: float | None = None) -> ProbeResult:
    """One verdict; ``timeout`` (default: the probe's own ``timeout_seconds``) bounds it all."""
    host = connect_host(target.host)
    config = target.config
    limit = config.timeout_seconds if timeout is None else timeout
    try:
        if config.completion:
            return _completion(host, target.port, config, limit, target.bearer)
        if config.http:
            return _http(host, target.port, config.http, limit, target.bearer)
        if config.tcp:
            with socket.create_connection((host, target.port), timeout=limit):
                return ProbeResult(True, f"tcp {target.port} accepts")
    except TimeoutError:
        return ProbeResult(False, f"{config.kind}: no answer within {limit:g}s")
    except OSError as exc:
        return ProbeResult(False, f"{config.kind}: {type(exc).__name__}: {exc}")
    return ProbeResult(True, "running (no readiness probe)")


def _completion(
    host: str, port: int, config: ProbeConfig, timeout: float, bearer: str
) -> ProbeResult:
    path = config.completion or ""
    body: dict[str, object] = {"model": config.model, "max_tokens": MAX_TOKENS}
    if path.endswith("/chat/completions"):
        body["messages"] = [{"role": "user", "content": PROMPT}]
    else:
        body["prompt"] = PROMPT
    payload = json.dumps(body).encode()
    status, text = request(host, port, "POST", path, timeout, payload, bearer)
    if status in REFUSED:
        return ProbeResult(False, refused(f"POST {path}", status, bearer))
    if status != 200:
        return ProbeResult(False, f"POST {path} -> {status}: {text[:120].strip()}")
    try:
        choices = json.loads(text).get("choices")
    except (ValueError, AttributeError):
        choices = None
    if not isinstance(choices, list) or not choices:
        return ProbeResult(False, f"POST {path} -> 200 without a choice: {text[:120].strip()}")
    return ProbeResult(True, f"POST {path} -> 200 with a choice")


def _http(
    host: str,
    port: int,
    checks: tuple[tuple[str, str | None], ...],
    timeout: float,
    bearer: str = "",
) -> ProbeResult:
    for path, contains in checks:
        status, body = request(host, port, "GET", path, timeout, bearer=bearer)
        if status in REFUSED:
            return ProbeResult(False, refused(f"GET {path}", status, bearer))
        # Kubernetes' httpGet: 200-399 passes, and a redirect is not followed (an engine
        # that sends /health to /health/ is up, and its Location may name another host).
        if not 200 <= status < 400:
            return ProbeResult(False, f"GET {path} -> {status}")
        if contains and contains not in body:
            return ProbeResult(False, f"GET {path} does not list {contains!r} yet")
    return ProbeResult(True, f"GET {checks[-1][0]} -> {status}")


def http_get(host: str, port: int, path: str, timeout: float) -> tuple[int, str]:
    return request(host, port, "GET", path, timeout)


def refused(what: str, status: int, bearer: str) -> str:
    """A probe the engine turned away, and the next move; never the key itself."""
    if bearer:
        return (
            f"{what} -> {status}: the engine refused the API key the probe presented (its "
            "--api-key, llama.cpp's --api-key-file, or VLLM_API_KEY / LLAMA_API_KEY / "
            "API_KEY in spec.env or envFrom): check that the engine reads the key given there"
        )
    return (
        f"{what} -> {status}: the engine refused the probe, which presented no API key: "
        "give the engine's key in spec.args (--api-key), spec.env or envFrom (VLLM_API_KEY, "
        "LLAMA_API_KEY, API_KEY), or probe a path the key does not guard "
        "(readiness.httpGet: {path: /health})"
    )


def request(
    host: str,
    port: int,
    method: str,
    path: str,
    timeout: float,
    body: bytes = b"",
    bearer: str = "",
) -> tuple[int, str]:
    """One HTTP/1.0 request over a plain socket: the status and up to 1 MiB of the body,
    all within ``timeout`` seconds (a stopped engine accepts, then never answers).

    Not http.client: it imports ssl and email (~6 MB resident in a daemon that only
    asks an engine for a status line). HTTP/1.0 with ``Connection: close`` is never
    chunked; the body ends at its Content-Length, or when the engine closes.
    """
    head = f"{method} {path} HTTP/1.0\r\nHost: {host}:{port}\r\nConnection: close\r\n"
    if bearer:
        head += f"Authorization: Bearer {bearer}\r\n"
    if body:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    deadline = time.monotonic() + timeout
    data = bytearray()
    with socket.create_connection((host, port), timeout=timeout) as conn:
        conn.sendall(head.encode("latin-1") + b"\r\n" + body)
        while len(data) <= LIMIT and not _complete(data):
            conn.settimeout(_left(deadline))
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
    top, _, rest = bytes(data).partition(b"\r\n\r\n")
    parts = top.split(b"\r\n", 1)[0].split()
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        raise ConnectionError(f"not an HTTP answer: {bytes(top[:60])!r}")
    return int(parts[1]), rest[:LIMIT].decode("utf-8", "replace")


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    return left


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
    targets: Mapping[str, ProbeTarget], timeout: float | None = None
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
