"""Flag values parsed once, by argparse itself: a bad one is a one-line usage error (64).

Every verb then reads typed values (seconds as floats, ``(host, port)``) from the
namespace: nothing downstream parses a flag's text again.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from controller.core.durations import parse_duration
from controller.core.limits import parse_limits
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


def count(text: str) -> int:
    """A whole number, 0 or more (``--tail -5`` read the whole log as if asked for none)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative: give 0 or more")
    return value


def max_instances(text: str) -> str:
    """``8``, ``nvidia=2`` or ``8,nvidia=2``, checked here; the text goes on to the config."""
    try:
        parse_limits(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def node_name(text: str) -> str:
    """A node's name names a folder of records: no '/'."""
    if "/" in text:
        raise argparse.ArgumentTypeError(f"node name {text!r} may not contain '/'")
    return text
