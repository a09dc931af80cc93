"""Deployment names that may become file names (no pydantic: every verb imports this)."""

from __future__ import annotations

import re
from collections.abc import Iterable

DNS1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def is_dns1123(name: object) -> bool:
    """A DNS-1123 label: the only names that ever become file names (invariant 9)."""
    return isinstance(name, str) and len(name) <= 63 and DNS1123.fullmatch(name) is not None


# A RollingUpdate's new instance runs under a second record, ``<name>@next``, beside
# the old one until it is Ready. ``@`` is no DNS-1123 character, so no deployment a user
# can name ever collides with such a record (``web--next`` is a name like any other);
# as a file name it is safe because its base name is a DNS-1123 label (``record_name_ok``).
NEXT_SUFFIX = "@next"


def next_name(name: str) -> str:
    """The record a RollingUpdate of ``name`` starts its new instance under."""
    return f"{name}{NEXT_SUFFIX}"


def is_next(name: str) -> bool:
    return name.endswith(NEXT_SUFFIX)


def base_name(name: str) -> str:
    """The deployment a record belongs to: ``foo`` for ``foo`` and ``foo@next``."""
    return name.removesuffix(NEXT_SUFFIX)


def record_name_ok(name: object) -> bool:
    """A deployment name, or one with the reserved suffix: safe as a file name (inv. 9)."""
    return isinstance(name, str) and is_dns1123(base_name(name))


def model_names(name: str, model: str | None, aliases: Iterable[str]) -> tuple[str, ...]:
    """The model names the gateway routes to a deployment: its name, model and aliases
    (in that order, each once). Set on the record when it is made (``Record.models``)."""
    return tuple(dict.fromkeys([name, *([model] if model else []), *aliases]))
