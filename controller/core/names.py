"""Deployment names that may become file names (no pydantic: every verb imports this)."""

from __future__ import annotations

import re

DNS1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def is_dns1123(name: object) -> bool:
    """A DNS-1123 label: the only names that ever become file names (invariant 9)."""
    return isinstance(name, str) and len(name) <= 63 and DNS1123.fullmatch(name) is not None
