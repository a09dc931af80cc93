"""The Host header at the real gateway (in process, keyless on loopback, raw sockets): RFC
9112 §3.2's 400 for an HTTP/1.1 request without one and any with two; the 403 for a
foreign one (DNS rebinding) is not got past with a loopback Host ahead of it."""

from __future__ import annotations

from typing import Any

import pytest
from harness.rawhttp import exchange, openai_error

from controller.gateway.lifecycle.app import Gateway


def _get(gateway: Gateway, *fields: bytes, version: bytes = b"HTTP/1.1") -> Any:
    head = b"GET /healthz " + version + b"\r\n" + b"".join(f + b"\r\n" for f in fields)
    return exchange(gateway.settings.port, head + b"Connection: close\r\n\r\n")


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        # The 403's check read the first Host; a proxy in front may route by the last.
        ((b"Host: 127.0.0.1", b"Host: evil.example"), "2 Host headers"),
        ((b"Host: evil.example", b"Host: 127.0.0.1"), "2 Host headers"),
        ((), "no Host header"),
    ],
)
def test_two_hosts_or_none_are_a_400_not_answered(
    inproc: Gateway, fields: tuple[bytes, ...], said: str
) -> None:
    answer = _get(inproc, *fields)
    error = openai_error(answer)
    assert answer.status == 400 and error is not None, answer
    assert error["code"] == "malformed_request" and said in error["message"], error


def test_one_host_is_judged_as_before_and_http_1_0_may_have_none(inproc: Gateway) -> None:
    assert _get(inproc, b"Host: 127.0.0.1").status == 200
    foreign = _get(inproc, b"Host: evil.example")
    assert foreign.status == 403 and "evil.example" in foreign.json()["error"]["message"]
    assert _get(inproc, version=b"HTTP/1.0").status == 200
