"""Flag values parsed once, by argparse itself: a bad one is a one-line usage error (64).

Every verb then reads typed values (seconds as floats, ``(host, port)``) from the
namespace: nothing downstream parses a flag's text again.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from controller.core.durations import parse_duration
from controller.core.listen import split_listen


def duration(text: str) -> float:
    """``30s``, ``5m``, ``1h30m`` or plain seconds, 0 or more."""
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative (examples: 30s, 5m, 1h)")
    return seconds


def positive_duration(text: str) -> float:
    """A duration that must be more than zero (a drain of 0 s would end as it begins)."""
    seconds = duration(text)
    if seconds == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is zero: give a length (examples: 30s, 1h)")
    return seconds


def listen_address(example: str) -> Callable[[str], tuple[str, int]]:
    """``[HOST:]PORT`` -> (host, port), loopback when no host is given."""

    def parse(text: str) -> tuple[str, int]:
        found = split_listen(text)
        if found is None:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not PORT or HOST:PORT (example: {example})"
            )
        return found

    return parse
