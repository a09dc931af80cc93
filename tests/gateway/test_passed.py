"""An engine's sized answer passed on whole (``messages.Passed``) is written byte for
byte as a ``Response`` made of the same fields writes it: the engine's fields in order,
then a type when it gave none, the length, ``Connection: close`` when the connection
ends, the gateway's ``Date`` only when the engine gave none; a HEAD or a 204 without
its body."""

from __future__ import annotations

import asyncio

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from controller.gateway.http import messages
from controller.gateway.http.messages import Body, Passed, Request, Response, StreamResponse


class Connection:
    def __init__(self, keep: bool) -> None:
        self.keep = keep
        self.sent = b""

    def send(self, data: bytes) -> None:
        self.sent += data

    def must_drain(self) -> bool:
        return False

    async def drain(self) -> None:
        """Nothing waits."""

    def reading(self, on: bool) -> None:
        """Nothing is paused."""

    def force_close(self) -> None:
        """Nothing to close."""

    def continue_once(self) -> None:
        """No 100 Continue."""

    def keeps_alive(self, request: Request) -> bool:
        return self.keep


ENGINE = [("Content-Type", "application/json"), ("X-Request-Id", "a1"), ("X-Many", "1")]
DATED = [("Date", "Sat, 05 Dec 2026 18:00:00 GMT"), *ENGINE, ("x-many", "2")]


def _sent(answer: StreamResponse, method: str, keep: bool) -> bytes:
    connection = Connection(keep)
    request = Request(
        method, "/v1/x", [], (1, 1), None, Body(connection, eof=True), connection, True
    )
    asyncio.run(answer.prepare(request))
    return connection.sent


@pytest.mark.parametrize("fields", [ENGINE, DATED, [("X-Only", "1")], []])
@pytest.mark.parametrize(
    ("status", "body"), [(200, b'{"ok":1}'), (404, b"no"), (204, b""), (200, b"")]
)
@pytest.mark.parametrize("method", ["POST", "HEAD"])
@pytest.mark.parametrize("keep", [True, False])
def test_passed_is_written_as_a_response_of_its_fields(
    fields: list[tuple[str, str]],
    status: int,
    body: bytes,
    method: str,
    keep: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One Date for both: the clock's second may turn between the two answers.
    monkeypatch.setattr(messages, "_date", lambda: "Sat, 05 Dec 2026 19:00:00 GMT")
    named = CIMultiDictProxy(CIMultiDict(fields))
    passed = Passed(status=status, reason=None, fields=list(fields), named=named, body=body)
    made = Response(status=status, body=body, headers=list(fields))
    assert _sent(passed, method, keep) == _sent(made, method, keep)
    assert (passed.keep_alive, passed.ended) == (keep, True)
