"""Token counts from the engines' answers, read without re-encoding anything.

- a JSON answer: its ``usage`` object (OpenAI's ``prompt_tokens``/``completion_tokens``,
  Anthropic's ``input_tokens``/``output_tokens``), found from the end of the body and
  decoded alone;
- a stream: the events that carry a ``usage`` object (OpenAI's last chunk, Anthropic's
  ``message_start`` and ``message_delta``), each field's largest value kept.

A streamed chat or completion request that says nothing about ``stream_options`` gets
``"stream_options":{"include_usage":true}`` inserted after its opening brace (the rest
of the body byte for byte as the client sent it), and the usage chunk it brings is taken
out of the answer: the client sees the stream it asked for. A client that set
``stream_options`` itself gets exactly what it asked for.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

STREAMED_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
ASKED = b'"stream_options":{"include_usage":true},'
PENDING_MAX = 1024 * 1024  # bytes of an unfinished event kept to read its usage
# An event ends at a blank line, its lines ended by LF or CRLF (the SSE spec allows both;
# sse-starlette, which llama-cpp-python's server streams with, writes CRLF).
_EVENT_END = re.compile(rb"(\r\n\r\n|\n\n)")
_USAGE_OBJECT = re.compile(rb'"usage"\s*:\s*\{')
_COLON = re.compile(rb"\s*:\s*")
_DECODER = json.JSONDecoder()
PROMPT_FIELDS = ("prompt_tokens", "input_tokens")
COMPLETION_FIELDS = ("completion_tokens", "output_tokens")


@dataclass
class Usage:
    prompt: int = 0
    completion: int = 0

    def add(self, found: dict[str, Any]) -> None:
        self.prompt = max(self.prompt, _count(found, PROMPT_FIELDS))
        self.completion = max(self.completion, _count(found, COMPLETION_FIELDS))

    @property
    def total(self) -> int:
        return self.prompt + self.completion


@dataclass
class Meter:
    """One request's figures: when it began, its first waiting comment and its first answer
    byte went out, what the engine said it used, and whether the gateway asked for the
    usage chunk itself."""

    started: float = field(default_factory=time.monotonic)
    first: float | None = None  # the answer's first byte (the engine's), not a comment's
    commented: float | None = None  # the first waiting comment, if its start was waited for
    usage: Usage | None = None
    strip: bool = False
    model: str | None = None  # as the body named it (the request log's)
    instance: str | None = None  # the engine that answered (``web@1``)
    deployment: str | None = None  # the deployment of that engine
    status: int | None = None  # the status the client was sent, once its answer began
    # The status of the error a begun stream ended with instead of its answer (its 200
    # was sent already): what the request log and the error counts say of it.
    ended_with: int | None = None

    def answered(self) -> None:
        if self.first is None:
            self.first = time.monotonic()

    def saw(self, found: dict[str, Any]) -> None:
        if self.usage is None:
            self.usage = Usage()
        self.usage.add(found)


def ask(body: bytes, fields: dict[str, Any], path: str) -> tuple[bytes, bool]:
    """The body to send and whether the gateway asked for usage the client did not."""
    if path not in STREAMED_PATHS or fields.get("stream") is not True:
        return body, False
    if "stream_options" in fields:
        return body, False  # the client said what it wants
    at = body.find(b"{")
    if at < 0:
        return body, False
    return body[: at + 1] + ASKED + body[at + 1 :], True


def from_json(data: bytes, meter: Meter) -> None:
    """The ``usage`` object of a JSON answer (the last one at the top of the body)."""
    end = len(data)
    while (at := data.rfind(b'"usage"', 0, end)) >= 0:
        end = at
        found = _object_after(data, at + len(b'"usage"'))
        if found is not None:
            meter.saw(found)
            return


def _object_after(data: bytes, at: int) -> dict[str, Any] | None:
    match = _COLON.match(data, at)
    if match is None or data[match.end() : match.end() + 1] != b"{":
        return None
    try:
        value, _ = _DECODER.raw_decode(data[match.end() :].decode("utf-8", errors="replace"))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class StreamUsage:
    """Reads usage from a server-sent stream as it passes; with ``meter.strip``, takes
    out the usage-only chunk the gateway asked for (whole events only: one cut across
    two reads is held until its end comes)."""

    def __init__(self, meter: Meter) -> None:
        self.meter = meter
        self.pending = b""

    def feed(self, chunk: bytes) -> bytes:
        if not self.meter.strip:
            self._read(chunk)
            return chunk
        data = self.pending + chunk
        end = _whole(data)
        if not end:
            # Held whole, a stream of CRLF events (no LF LF in it) reached its client
            # only at its end, and one event with no end grew the gateway for ever.
            # An event this long is no usage chunk: it goes on as it is.
            self.pending = data if len(data) <= PENDING_MAX else b""
            return b"" if self.pending else data
        whole, self.pending = data[:end], data[end:]
        if not _USAGE_OBJECT.search(whole):
            return whole
        parts = _EVENT_END.split(whole)  # event, its end, event, its end, ..., b""
        events = zip(parts[0::2], parts[1::2], strict=False)
        return b"".join([e + blank for e, blank in events if not self._usage_only(e)])

    def flush(self) -> bytes:
        rest, self.pending = self.pending, b""
        return rest if self.meter.strip else b""

    def _read(self, chunk: bytes) -> None:
        data = self.pending + chunk
        end = _whole(data)
        if not end:
            self.pending = data[-PENDING_MAX:]
            return
        whole, self.pending = data[:end], data[end:][-PENDING_MAX:]
        if _USAGE_OBJECT.search(whole):
            for event in _EVENT_END.split(whole)[0::2]:
                self._usage_only(event)

    def _usage_only(self, event: bytes) -> bool:
        """Count the event's usage; True if it is a chunk with usage and no choices."""
        if not _USAGE_OBJECT.search(event):
            return False
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            try:
                value: Any = json.loads(line[5:])
            except ValueError:
                continue
            if not isinstance(value, dict):
                continue
            message = value.get("message")
            found = value.get("usage") or (
                message.get("usage") if isinstance(message, dict) else None
            )
            if isinstance(found, dict):
                self.meter.saw(found)
                return value.get("choices") == []
        return False


def _whole(data: bytes) -> int:
    """Where the last whole event of ``data`` ends (past its blank line); 0: none does."""
    lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


def _count(found: dict[str, Any], names: tuple[str, ...]) -> int:
    for name in names:
        value = found.get(name)
        if value.__class__ is int and value >= 0:  # an int, not a bool: no calls, twice a request
            return value
    return 0
