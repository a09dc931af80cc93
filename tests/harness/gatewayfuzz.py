"""Fuzzed raw requests for the gateway: malformed request lines, headers, paths,
encodings, methods and bodies, as bytes for a raw socket (no client library would send
most of them). Seeded: a failing case is found again by its index.

Each :class:`Case` says whether the request is whole (an answer is due) and whether it
targets ``/v1/`` (then a JSON answer must be an OpenAI error or the engine's own).
"""

from __future__ import annotations

import gzip
import json
import random
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

MAX_BODY = 65536  # the fuzzed daemon's --max-body: bombs and floods stay cheap

METHODS = ["GET", "POST", "POST", "POST", "PUT", "PATCH", "DELETE", "HEAD", "TRACE"]
METHODS += ["OPTIONS", "MKCOL", "PROPFIND", "CONNECT", "BREW", "get", "G ET", "P" * 300, ""]
PATHS = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/models",
    "/healthz",
    "/v1/../../etc/passwd",
    "/v1/%2e%2e/health",
    "/v1/%2E%2e/%2e%2E/metrics",
    "/v1/../metrics",
    "/v1/../v1/../slots?action=erase",
    "/v1/%2f..%2fslots",
    "/v1/..%5cslots",
    "/v1/a\\..\\..\\slots",
    "/v1/%00",
    "//v1//chat/completions",
    "/v1/./completions?x=1&y=../..",
    "/v1/x/../completions",
    "*",
    "http://evil.example/v1/completions",
    "/v1/" + "a" * 9000,
    "/v1/\xff\xfe",
    "/v1/completions?%zz",
    "/nothing",
    "/",
    "",
]
CODINGS = ["gzip", "deflate", "br", "zstd", "gzip, gzip", "identity", "x-unknown", "gzip, br"]


@dataclass(frozen=True)
class Case:
    index: int
    data: bytes
    complete: bool  # False: left half-sent on purpose, no answer is waited for
    v1: bool  # the target is under /v1/ (as sent)


def cases(seed: int, count: int, key: str) -> Iterator[Case]:
    for index in range(count):
        yield make(random.Random(f"{seed}:{index}"), index, key)


def make(rng: random.Random, index: int, key: str) -> Case:
    method = rng.choice(METHODS)
    path = rng.choice(PATHS)
    body, headers, complete = _body(rng)
    headers = [*_auth(rng, key), *headers]
    line_end = b"\n" if rng.random() < 0.05 else b"\r\n"
    head, whole = _headers(rng, headers, line_end)
    version = rng.choice(["HTTP/1.1"] * 12 + ["HTTP/1.0", "HTTP/9.9", "HTTP/1.1 extra", ""])
    request_line = f"{method} {path} {version}".encode("latin-1", "replace")
    data = request_line + line_end + head + line_end + body
    return Case(index, data, complete and whole, path.startswith("/v1/"))


def _auth(rng: random.Random, key: str) -> list[tuple[str, str]]:
    choice = rng.random()
    if choice < 0.5:
        return [("Authorization", f"Bearer {key}")]
    if choice < 0.6:
        return [("x-api-key", key)]
    if choice < 0.65:
        return [("Authorization", f"Bearer {key}" + "A" * 9000)]  # past the line limit
    if choice < 0.7:
        return [("Authorization", f"Bearer {key[:-1]}")]  # a near miss
    return []


def _headers(rng: random.Random, headers: list[tuple[str, str]], end: bytes) -> tuple[bytes, bool]:
    """The header block and whether it is whole (ends the header section)."""
    fields = [("Host", "gateway"), ("Connection", "close"), *headers]
    extra: list[Callable[[], tuple[str, str]]] = [
        lambda: ("X-Junk", "v" * rng.choice([10, 9000])),
        lambda: ("Bad Header", "x"),
        lambda: ("X-Ctl", "a\x01b\x7f"),
        lambda: ("Content-Length", rng.choice(["-1", "abc", "1e3", "99999999999999999999"])),
        lambda: ("Transfer-Encoding", rng.choice(["chunked", "gzip, chunked", "bogus"])),
        lambda: ("Expect", "100-continue"),
        lambda: ("Upgrade", rng.choice(["websocket", "h2c"])),
        lambda: ("Connection", "Upgrade, keep-alive"),
        lambda: ("Content-Type", "application/json; charset=\xff"),
    ]
    for _ in range(rng.choice([0, 0, 0, 1, 2])):
        fields.append(rng.choice(extra)())
    if rng.random() < 0.03:
        fields += [(f"X-Many-{i}", "1") for i in range(200)]
    lines = [f"{k}: {v}".encode("latin-1", "replace") + end for k, v in fields]
    if rng.random() < 0.03:
        lines.insert(1, b" folded continuation" + end)  # obs-fold
    rng.shuffle(lines)
    whole = rng.random() > 0.03
    return b"".join(lines) if whole else b"".join(lines)[: rng.randrange(1, 40)], whole


def _body(rng: random.Random) -> tuple[bytes, list[tuple[str, str]], bool]:
    """The body, the headers that frame it, and whether it is all sent."""
    model = json.dumps({"model": "m", "prompt": "hi", "stream": rng.random() < 0.2}).encode()
    plain = rng.choice(
        [
            model,
            model,
            model,
            b"not json",
            b"[]",
            b'{"model": 1}',
            b"[" * 50000,
            bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 300))),
            b"",
            b"x" * (MAX_BODY + 1),
        ]
    )
    headers: list[tuple[str, str]] = []
    body = plain
    if rng.random() < 0.3:
        coding = rng.choice(CODINGS)
        headers.append(("Content-Encoding", coding))
        if rng.random() < 0.7 and coding in ("gzip", "deflate"):
            body = gzip.compress(plain) if coding == "gzip" else zlib.compress(plain)
        if rng.random() < 0.05:
            body = gzip.compress(b" " * (MAX_BODY * 4))  # a small bomb
    if rng.random() < 0.1:
        framed = rng.random() < 0.7  # else the raw body: a chunk parser may wait for more
        sent = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if framed else body
        return sent, [*headers, ("Transfer-Encoding", "chunked")], framed
    length = len(body)
    complete = True
    if rng.random() < 0.03:
        length += rng.randrange(1, 100)  # says more than it sends
        complete = False
    return body, [*headers, ("Content-Length", str(length))], complete
