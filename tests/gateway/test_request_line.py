"""A request log line written at once (``requestlog.line``) is the very line json's
encoder makes of its fields: same keys in the same order, strings escaped as json
escapes them, numbers as json writes them, ``null`` for what is missing, and the time as
``datetime.isoformat`` writes it, its rounding to the microsecond included."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.gateway.accounting import requestlog
from controller.gateway.accounting.usage import Meter, Usage

ENCODE = json.JSONEncoder(separators=(",", ":")).encode
NOW, CLOCK = 1000.5, 1_796_000_000.25  # monotonic and wall clock, as the line reads them


def _fields(key: str, deployment: str, status: int, meter: Meter) -> dict[str, Any]:
    """The line's fields, as the request log's readers take them (FIELDS)."""
    began = CLOCK - (NOW - meter.started)
    used = meter.usage
    return {
        "time": datetime.fromtimestamp(began, UTC).isoformat(timespec="milliseconds"),
        "key": key,
        "model": meter.model,
        "deployment": deployment,
        "instance": meter.instance,
        "status": status,
        "ttfb_s": round(meter.first - meter.started, 4) if meter.first is not None else None,
        "first_comment_s": (
            round(meter.commented - meter.started, 4) if meter.commented is not None else None
        ),
        "duration_s": round(NOW - meter.started, 4),
        "prompt_tokens": used.prompt if used else None,
        "completion_tokens": used.completion if used else None,
    }


def _meter(
    model: str | None,
    instance: str | None,
    first: float | None,
    used: Usage | None,
    commented: float | None = None,
) -> Meter:
    meter = Meter(started=1000.0)
    meter.model, meter.instance, meter.usage = model, instance, used
    meter.first = None if first is None else meter.started + first
    meter.commented = None if commented is None else meter.started + commented
    return meter


@pytest.mark.parametrize(
    ("key", "deployment", "status", "meter"),
    [
        ("-", "-", 401, _meter(None, None, None, None)),
        ("a1b2c3d4", "web", 200, _meter("web", "web@1", 0.01234567, Usage(12, 7))),
        ("-", "chat", 502, _meter('qu"ote\\back\tslash', "chat@0", 3.0, Usage(0, 0))),
        ("-", "ünï", 200, _meter("模型🙂", "ünï@2", 1e-05, None)),
        ("-", "x", 200, _meter("\x00\x1f\x7f", "x@0", 123456.78901, Usage(10**9, 1))),
        ("-", "cold", 200, _meter("cold", "cold@0", 0.49, Usage(3, 4), commented=0.2)),
    ],
)
def test_a_line_is_its_fields_encoded(
    key: str, deployment: str, status: int, meter: Meter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(requestlog.time, "monotonic", lambda: NOW)
    monkeypatch.setattr(requestlog.time, "time", lambda: CLOCK)
    made = requestlog.line(key, deployment, status, meter)
    assert made == (ENCODE(_fields(key, deployment, status, meter)) + "\n").encode()
    assert list(json.loads(made)) == list(requestlog.FIELDS)


def _as_isoformat_writes_it(at: float) -> None:
    assert requestlog._when(at) == datetime.fromtimestamp(at, UTC).isoformat(
        timespec="milliseconds"
    )


@given(st.floats(min_value=0, max_value=4e9, allow_nan=False, allow_infinity=False))
def test_the_time_is_written_as_isoformat_writes_it(at: float) -> None:
    _as_isoformat_writes_it(at)


@pytest.mark.parametrize("at", [0.0, 0.9999995, 0.0004995, 1_796_000_000.9999996, 59.9995])
def test_the_time_rounds_at_the_edges_as_isoformat_does(at: float) -> None:
    _as_isoformat_writes_it(at)
