"""``accounting/usage.py``'s ``StreamUsage`` on a stream for which the gateway asked the
usage chunk itself (``meter.strip``): events that end CRLF CRLF are whole events, and an
event with no end is passed on past ``PENDING_MAX``, never held for ever."""

from __future__ import annotations

import json

from controller.gateway.accounting.usage import PENDING_MAX, Meter, StreamUsage


def sse(value: object, end: bytes) -> bytes:
    return b"data: " + json.dumps(value).encode() + end


def test_crlf_events_go_on_whole_and_their_usage_chunk_is_taken_out() -> None:
    meter = Meter(strip=True)
    usage = StreamUsage(meter)
    one = sse({"choices": [{"delta": {"content": "one"}}]}, b"\r\n\r\n")
    counted = sse({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}, b"")
    # The first event at once (it was held until the stream's end), the rest as it ends.
    assert usage.feed(one + b'data: {"choi') == one
    rest = b'ces": []}\r\n\r\n' + counted + b"\r\n\r\ndata: [DONE]\r\n\r\n"
    assert usage.feed(rest) == b'data: {"choices": []}\r\n\r\ndata: [DONE]\r\n\r\n'
    assert usage.flush() == b""
    assert meter.usage is not None and (meter.usage.prompt, meter.usage.completion) == (3, 2)


def test_an_event_with_no_end_is_passed_on_not_held() -> None:
    usage = StreamUsage(Meter(strip=True))
    piece = b"x" * 65536
    out = b"".join(usage.feed(b"data: " + piece if i == 0 else piece) for i in range(48))
    assert len(out) >= 48 * len(piece) - PENDING_MAX, len(out)
    assert len(usage.pending) <= PENDING_MAX
