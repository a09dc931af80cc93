"""Durations as people write them: ``30s``, ``5m``, ``1h``, ``1h30m``, or plain seconds."""

from __future__ import annotations

import re

from controller.errors import ConfigError

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")


def parse_duration(text: str) -> float:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    parts = PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        # ConfigError is a ValueError: a bad flag value is an error for people, not a traceback.
        raise ConfigError(f"{text!r} is not a duration (examples: 30s, 5m, 1h, 1h30m)")
    return sum(float(n) * UNITS[u] for n, u in parts)


def format_age(seconds: float) -> str:
    """kubectl-style ages: 42s, 5m, 3h12m, 2d."""
    s = int(max(seconds, 0))
    if s < 120:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        h, m = divmod(s // 60, 60)
        return f"{h}h{m}m" if m and h < 10 else f"{h}h"
    return f"{s // 86400}d"
