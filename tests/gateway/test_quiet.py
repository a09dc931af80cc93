"""The gateway's quiet edges alone: the rate limit of client-caused lines, the filter on
every line the HTTP library writes, the accept-error handler, path normal forms and
body decoding (issue 28: 3, 4, 5, 8, 9)."""

from __future__ import annotations

import asyncio
import gzip
import logging

import pytest
from harness.rawhttp import leaked

from controller.gateway.http import paths
from controller.gateway.http.quiet import LibraryFilter, Throttle, install
from controller.gateway.http.server import connection_cap, exception_handler
from controller.gateway.surface import bodies

KEY = "sk-Qz7WvKpLmRtYuXnJhGd3"


def test_throttle_says_a_burst_per_window_then_how_many_it_left_out() -> None:
    now = [0.0]
    throttle = Throttle(window=10, burst=2, clock=lambda: now[0])
    assert [throttle.allow("a") for _ in range(5)] == [0, 0, None, None, None]
    assert throttle.allow("b") == 0  # kinds are counted apart
    now[0] = 10.0
    assert throttle.allow("a") == 3  # the next window's first line says 3 were left out
    assert throttle.allow("a") == 0


def test_library_lines_lose_keys_and_tracebacks_become_redacted_text() -> None:
    install()
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    handler = Keep()
    logger = logging.getLogger("aiohttp.server")
    logger.addHandler(handler)
    try:
        try:
            raise ValueError(f"b'Authorization: Bearer {KEY}\\n'")
        except ValueError as exc:
            logger.error("bad %s", f"x-api-key: {KEY}", exc_info=exc)
    finally:
        logger.removeHandler(handler)
    (record,) = seen
    assert record.exc_info is None and "ValueError" in record.getMessage()
    assert not leaked(record.getMessage(), [KEY]), record.getMessage()
    assert LibraryFilter in {type(f) for f in logging.getLogger("asyncio").filters}


def test_the_accept_error_is_rate_limited() -> None:
    said: list[dict[str, object]] = []
    loop = asyncio.new_event_loop()
    try:
        loop.default_exception_handler = said.append  # type: ignore[assignment,method-assign]
        handle = exception_handler(Throttle(window=60, burst=1))
        for _ in range(1000):
            handle(loop, {"message": "socket.accept() out of system resource"})
        handle(loop, {"message": "something else"})
    finally:
        loop.close()
    assert said == [{"message": "something else"}]  # the rest: one line, not a thousand


def test_the_connection_cap_leaves_fds_to_the_daemon() -> None:
    assert connection_cap(256) == (256 - 64) // 2
    assert connection_cap(65536) == (65536 - 8192) // 2
    assert connection_cap(16) == 8


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("/v1/chat/completions", "/v1/chat/completions"),
        ("/v1/../../etc/passwd", "/etc/passwd"),
        ("/v1/%2e%2e/health", "/health"),
        ("/v1/%2E%2e/x", "/x"),
        ("/v1/./a/../b", "/v1/b"),
        ("//v1//a", "/v1/a"),
        ("/v1/a/..", "/v1/"),
        ("/v1/a%20b", "/v1/a%20b"),
        ("/v1/%2fslots", None),
        ("/v1/a\\b", None),
        ("/v1/%00", None),
        ("*", None),
        ("http://x/v1/a", None),
    ],
)
def test_path_normal_forms(raw: str, normal: str | None) -> None:
    assert paths.normalise(raw) == normal


def test_bodies_are_decoded_within_the_limit() -> None:
    assert bodies.decode(gzip.compress(b"abc"), "gzip", 10) == b"abc"
    assert bodies.decode(b"abc", None, 10) == b"abc"
    bomb = bodies.decode(gzip.compress(b" " * 1000), "gzip", 100)
    assert isinstance(bomb, bodies.BodyRefused) and bomb.status == 413
    wrong = bodies.decode(b"abc", "gzip", 10)
    assert isinstance(wrong, bodies.BodyRefused) and wrong.status == 400
    other = bodies.decode(b"abc", "br", 10)
    assert isinstance(other, bodies.BodyRefused) and other.status == 415
