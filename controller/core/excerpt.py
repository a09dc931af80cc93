"""Short, printable excerpts of values users wrote, for error messages. Pure.

A message quotes what was wrong, never a whole value: a manifest can be anything
(a symlink to a secret, a 1 MB string), and errors land in CI logs and journals.
"""

from __future__ import annotations

LIMIT = 40


def short(value: object, limit: int = LIMIT) -> str:
    """``repr(value)`` cut to ``limit`` characters (``…`` marks the cut): one printable line."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's digit limit
        text = f"<a {type(value).__name__} too long to show>"
    if len(text) <= limit:
        return text
    return text[: limit - 1] + "…"


def key(text: str, limit: int = LIMIT) -> str:
    """A mapping key as a field path shows it: bare when short and printable, else ``short``."""
    if len(text) <= limit and text.isprintable() and " " not in text:
        return text
    return short(text, limit)


def clip(text: str, limit: int = LIMIT) -> str:
    """``text`` itself when short and printable, else ``short(text)``: quoted, escaped, cut."""
    if len(text) <= limit and text.isprintable():
        return text
    return short(text, limit)
