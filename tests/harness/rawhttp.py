"""Raw HTTP over a socket: bytes no HTTP client library would send, and the answer as
it came back (status, headers, body), for the gateway's hostile-input tests.
"""

from __future__ import annotations

import contextlib
import json
import socket
from dataclasses import dataclass, field
from typing import Any

OPENAI_ERROR_FIELDS = {"message", "type", "param", "code"}


@dataclass
class Raw:
    """What came back: ``status`` None when no status line did (closed, timed out)."""

    data: bytes
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def json(self) -> Any:
        return json.loads(self.body)

    def is_json(self) -> bool:
        return self.headers.get("content-type", "").startswith("application/json")

    def __repr__(self) -> str:
        return f"Raw({self.status}, {self.data[:400]!r})"


def exchange(port: int, data: bytes, *, timeout: float = 10.0, complete: bool = True) -> Raw:
    """Send ``data``; read until the server closes (``complete``) or briefly (a request
    left half-sent on purpose gets no answer: it is not waited for)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        with contextlib.suppress(OSError):  # the server closed first: read what it said
            sock.sendall(data)
        sock.settimeout(timeout if complete else 0.3)
        chunks: list[bytes] = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except OSError:
            pass  # reset or timed out: what came back so far is the answer
    return parse(b"".join(chunks))


def parse(data: bytes) -> Raw:
    """One HTTP/1.x answer: status line, headers (lower-case names), body (de-chunked)."""
    head, sep, rest = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if not sep or len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        return Raw(data)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.decode("latin-1").strip().lower()] = value.decode("latin-1").strip()
    length = headers.get("content-length", "")
    if "chunked" in headers.get("transfer-encoding", ""):
        body = _dechunk(rest)
    else:  # what follows a sized body is a further answer (a pipelined request's)
        body = rest[: int(length)] if length.isdigit() else rest
    return Raw(data, int(parts[1]), headers, body)


def _dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        try:
            size = int(size_line.split(b";")[0], 16)
        except ValueError:
            break
        if size == 0:
            break
        out, data = out + data[:size], data[size + 2 :]
    return out


def request(
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> bytes:
    """A well-formed HTTP/1.1 request (``Connection: close``) with ``Content-Length``."""
    # A loopback name: a keyless gateway on loopback refuses any other (DNS rebinding).
    fields = {"Host": "127.0.0.1", "Connection": "close", **(headers or {})}
    if body or method in ("POST", "PUT", "PATCH"):
        fields.setdefault("Content-Length", str(len(body)))
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items())
    return head.encode("latin-1") + b"\r\n" + body


def openai_error(answer: Raw) -> dict[str, Any] | None:
    """The ``error`` object of an OpenAI error body, or None if the body is not one."""
    try:
        value = answer.json()
    except ValueError:
        return None
    error = value.get("error") if isinstance(value, dict) else None
    if isinstance(error, dict) and set(error) == OPENAI_ERROR_FIELDS and error["message"]:
        return error
    return None


def fragments(secret: str, size: int = 6) -> set[str]:
    """Every ``size``-character run of ``secret``: what a truncated label would leak."""
    return {secret[i : i + size] for i in range(len(secret) - size + 1)}


def leaked(text: str, secrets: list[str], size: int = 6) -> list[str]:
    """The runs of any secret found in ``text`` (empty: nothing leaked)."""
    return sorted(f for s in secrets for f in fragments(s, size) if f in text)
