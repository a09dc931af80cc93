"""Kubernetes-style memory quantities (``20Gi``, ``512Mi``, ``80G``) as whole bytes, and
durations (``30s``, ``1h30m``) as seconds and ages (``3h12m``) for people. Pure.

One parser for the manifest (``spec.devices.memory``) and the static inventory
(``--devices nvidia:0=80Gi``), so both spell sizes the same way and a typo gets the
same message in both places.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from controller.core.manifest.excerpt import short
from controller.errors import ConfigError

# Durations as people write them: ``30s``, ``5m``, ``1h``, ``1h30m``, or plain seconds.
SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")


def parse_duration(text: str) -> float:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        # ConfigError is a ValueError: a bad flag value is an error for people, not a traceback.
        raise ConfigError(f"{text!r} is not a duration (examples: 30s, 5m, 1h, 1h30m)")
    return sum(float(n) * SECONDS[u] for n, u in parts)


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


# Binary suffixes first: Kubernetes' own set (Ki, Mi, Gi, Ti) plus its decimal ones.
UNITS: dict[str, int] = {
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
    "k": 10**3,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "": 1,
}
_QUANTITY = re.compile(r"^\s*([+-]?[0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")
EXAMPLE = "e.g. 20Gi, 512Mi or 80G (units Ki, Mi, Gi, Ti; k, M, G, T; none: bytes)"


def parse_quantity(text: object) -> int:
    """Bytes in a quantity; ValueError saying what is wrong (unknown unit, zero, negative).

    Takes whatever YAML gave: a float (``1.5``, ``.inf``), a list or a map is refused
    with a message like any other bad size, never a TypeError (a TypeError here once
    ended every command and the daemon's passes).
    """
    if isinstance(text, int) and not isinstance(text, bool):
        return _bytes_meant(_positive(Decimal(text), str(text)), str(text))
    if not isinstance(text, str):  # YAML `true`, 1.5, [], {}: not a size
        raise ValueError(f"memory {short(text)} is not a quantity ({EXAMPLE})")
    match = _QUANTITY.match(text)
    if match is None:
        raise ValueError(f"memory {short(text)} is not a quantity ({EXAMPLE})")
    number, unit = match.groups()
    if unit not in UNITS:
        said = f"memory {short(text)} has an unknown unit {short(unit)}"
        raise ValueError(f"{said}{_unit_meant(number, unit) or f' ({EXAMPLE})'}")
    try:
        value = Decimal(number) * UNITS[unit]
    except InvalidOperation:  # pragma: no cover - the pattern admits only numbers
        raise ValueError(f"memory {short(text)} is not a quantity ({EXAMPLE})") from None
    size = _positive(value, text)
    return size if unit else _bytes_meant(size, number)


# `memory: 16` is 16 bytes, as Kubernetes reads it: as a device's share it packed engines
# onto a GPU for free. No size under a MiB is meant without its unit.
LEAST_BARE = 1 << 20


def _bytes_meant(size: int, number: str) -> int:
    if size >= LEAST_BARE:
        return size
    raise ValueError(
        f"memory {number} has no unit, so it is {number} bytes, surely not meant: "
        f"write {number}Gi (GiB) or {number}G (GB); units Ki, Mi, Gi, Ti; k, M, G, T"
    )


def _unit_meant(number: str, unit: str) -> str:
    """`16GB`, `16g`, `16GiB`: the spellings Kubernetes reads for the size meant."""
    letter, rest = unit[:1].upper(), unit[1:].lower()
    if letter not in "KMGT" or rest not in ("", "b", "i", "ib"):
        return ""
    binary, decimal = f"{number}{letter}i", f"{number}{'k' if letter == 'K' else letter}"
    if rest.startswith("i"):
        return f": write {binary} (units Ki, Mi, Gi, Ti; k, M, G, T)"
    return (
        f": write {binary} ({letter}iB, powers of 1024) or {decimal} (powers of 1000); "
        "units Ki, Mi, Gi, Ti; k, M, G, T"
    )


def _positive(value: Decimal, text: str) -> int:
    if value < 0:
        raise ValueError(f"memory {short(text)} is negative: a request is a size, at least 1 byte")
    if int(value) == 0:  # a zero request would share a device for free
        raise ValueError(
            f"memory {short(text)} is zero: a size is at least 1 byte (for a whole device, "
            "leave the size out)"
        )
    return int(value)  # a fraction of a byte rounds down


def format_bytes(size: int) -> str:
    """The shortest exact binary spelling (``20Gi``), else one decimal (``1.5Gi``)."""
    for unit in ("Ti", "Gi", "Mi", "Ki"):
        scale = UNITS[unit]
        if size >= scale:
            whole, rest = divmod(size, scale)
            return f"{whole}{unit}" if rest == 0 else f"{size / scale:.1f}{unit}"
    return f"{size}B"
