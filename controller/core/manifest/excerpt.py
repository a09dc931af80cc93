"""Short, printable excerpts of values users wrote, for error messages. Pure.

A message quotes what was wrong, never a whole value: a manifest can be anything
(a symlink to a secret, a 1 MB string), and errors land in CI logs and journals.
"""

from __future__ import annotations

from collections.abc import Iterable

from controller.redact import redact_url


# "Did you mean …?" for a field name that is one slip away from a known one. Pure.
#
# The slips people make in YAML: a letter off (``periodSecond``), Python's snake_case
# for the manifest's camelCase (``base_port``), or the wrong case (``BasePort``).
def _folded(name: str) -> str:
    return name.replace("_", "").replace("-", "").lower()


def did_you_mean(word: str, known: Iterable[str], *, cutoff: float = 0.85) -> str | None:
    """The known field ``word`` was most likely meant as, or None when none is close.

    ``cutoff``: difflib's similarity needed; a short word (``prot`` for ``port``, 0.75)
    among a few known ones can take a lower one than field names do.
    """
    import difflib  # only when a message is made (not in every `status`)

    names = list(known)
    for name in names:  # same letters, other case or separators: certainly this one
        if _folded(name) == _folded(word):
            return name
    for name in names:  # two letters swapped (``spce``): too short for difflib's cutoff
        if _swapped(_folded(name), _folded(word)):
            return name
    close = difflib.get_close_matches(word, names, n=1, cutoff=cutoff)
    return close[0] if close else None


def _swapped(a: str, b: str) -> bool:
    """``b`` is ``a`` with two neighbouring letters swapped."""
    if len(a) != len(b) or a == b:
        return False
    diff = [i for i in range(len(a)) if a[i] != b[i]]
    return (
        len(diff) == 2
        and diff[1] == diff[0] + 1
        and a[diff[0]] == b[diff[1]]
        and a[diff[1]] == b[diff[0]]
    )


LIMIT = 40


def short(value: object, limit: int = LIMIT) -> str:
    """``repr(value)`` cut to ``limit`` characters (``…`` marks the cut): one printable
    line, with no URL's password or secret query value (``redact_url``)."""
    try:
        text = redact_url(repr(value))
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
    """``text`` itself when short and printable, else ``short(text)``: quoted, escaped, cut
    (a URL's password out of either: `git.url` written as a mapping quoted its token)."""
    text = redact_url(text)
    if len(text) <= limit and text.isprintable():
        return text
    return short(text, limit)
