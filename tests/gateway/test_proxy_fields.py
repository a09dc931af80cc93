"""``surface/proxy.py``'s ``_kept``: which of a message's header fields go on, in order.
A request's to the engine (hop-by-hop fields, those its ``Connection`` names, the
gateway's key headers when keys are on, the body's coding and an answered ``Expect``
out); an engine's answer to the client (hop-by-hop and ``Connection``-named out)."""

from __future__ import annotations

import pytest

from controller.gateway.surface.proxy import HOP_BY_HOP, SENT_DROPS, SENT_DROPS_KEYED, _kept

REQUEST = [
    ("Host", "gw:8080"),
    ("Connection", "X-Private, keep-alive"),
    ("X-Private", "for the gateway alone"),
    ("Keep-Alive", "timeout=5"),
    ("Authorization", "Bearer sk-1"),
    ("Content-Type", "application/json"),
    ("Content-Length", "17"),
    ("Content-Encoding", "gzip"),
    ("Expect", "100-continue"),
    ("Proxy-Authorization", "Basic x"),
    ("X-A", "1"),
    ("x-a", "2"),
    ("TE", "trailers"),
    ("User-Agent", "OpenAI/Python"),
]


@pytest.mark.parametrize(
    ("drop", "kept"),
    [
        (
            SENT_DROPS_KEYED,
            [("Content-Type", "application/json"), ("X-A", "1"), ("x-a", "2"),
             ("User-Agent", "OpenAI/Python")],
        ),
        (
            SENT_DROPS,
            [("Authorization", "Bearer sk-1"), ("Content-Type", "application/json"),
             ("X-A", "1"), ("x-a", "2"), ("User-Agent", "OpenAI/Python")],
        ),
    ],
)  # fmt: skip
def test_a_requests_fields_go_on_in_order_but_what_is_the_gateways(
    drop: frozenset[str], kept: list[tuple[str, str]]
) -> None:
    assert _kept(REQUEST, drop) == kept


def test_an_answers_fields_go_on_in_order_but_what_is_hop_by_hop() -> None:
    answer = [
        ("Date", "Sat, 05 Dec 2026 18:00:00 GMT"),
        ("connection", "close, X-Engine-Only"),
        ("x-engine-only", "1"),
        ("Transfer-Encoding", "chunked"),
        ("Set-Cookie", "a=1"),
        ("Content-Type", "text/event-stream"),
        ("Set-Cookie", "b=2"),
    ]
    assert _kept(answer, HOP_BY_HOP) == [
        ("Date", "Sat, 05 Dec 2026 18:00:00 GMT"),
        ("Set-Cookie", "a=1"),
        ("Content-Type", "text/event-stream"),
        ("Set-Cookie", "b=2"),
    ]
    assert _kept([], HOP_BY_HOP) == []
