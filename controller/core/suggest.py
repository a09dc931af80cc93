""" "Did you mean …?" for a field name that is one slip away from a known one. Pure.

The slips people make in YAML: a letter off (``periodSecond``), Python's snake_case
for the manifest's camelCase (``base_port``), or the wrong case (``BasePort``).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def _folded(name: str) -> str:
    return name.replace("_", "").replace("-", "").lower()


def did_you_mean(word: str, known: Iterable[str], *, cutoff: float = 0.85) -> str | None:
    """The known field ``word`` was most likely meant as, or None when none is close.

    ``cutoff``: difflib's similarity needed; a short word (``prot`` for ``port``, 0.75)
    among a few known ones can take a lower one than field names do.
    """
    names = list(known)
    for name in names:  # same letters, other case or separators: certainly this one
        if _folded(name) == _folded(word):
            return name
    close = difflib.get_close_matches(word, names, n=1, cutoff=cutoff)
    return close[0] if close else None
