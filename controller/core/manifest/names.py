"""Deployment names that may become file names, and a manifest file's name for people
(no pydantic: every verb imports this)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable
from pathlib import Path

from controller.redact import printable

DNS1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def is_dns1123(name: object) -> bool:
    """A DNS-1123 label: the only names that ever become file names (invariant 9)."""
    return isinstance(name, str) and len(name) <= 63 and DNS1123.fullmatch(name) is not None


# A deployment with ``replicas: N`` runs N records: replica 0 keeps the plain name (one
# replica changes nothing for existing records) and replica i >= 1 is ``<name>@<i>``.
# A RollingUpdate's new instance of any of them runs under a second record,
# ``<instance>@next`` (``web@next``, ``web@2@next``), beside the old one until it is
# Ready. ``@`` is no DNS-1123 character, so no deployment a user can name ever collides
# with such a record (``web--next`` is a name like any other); as a file name it is safe
# because it is a DNS-1123 label plus digits and ``next`` (``record_name_ok``).
SEPARATOR = "@"
NEXT_SUFFIX = "@next"
RECORD_NAME = re.compile(r"(?P<base>[^@]+)(?:@(?P<replica>[1-9][0-9]*))?(?:@next)?")


def replica_name(name: str, replica: int) -> str:
    """The record of replica ``replica`` of deployment ``name``: ``web``, ``web@1``, …"""
    if replica < 0:
        raise ValueError(f"a replica index is never negative (got {replica})")
    return name if replica == 0 else f"{name}{SEPARATOR}{replica}"


def replica_of(name: str) -> int:
    """The replica index a record holds: 0 for ``web`` and ``web@next``, 2 for ``web@2``
    and ``web@2@next``."""
    match = RECORD_NAME.fullmatch(name)
    replica = match.group("replica") if match else None
    return int(replica) if replica else 0


def next_name(instance: str) -> str:
    """The record a RollingUpdate of ``instance`` starts its new instance under."""
    return f"{instance}{NEXT_SUFFIX}"


def is_next(name: str) -> bool:
    return name.endswith(NEXT_SUFFIX)


def instance_of(name: str) -> str:
    """The instance a rolling ``@next`` record replaces: ``web@2`` for ``web@2@next``;
    any other record is its own instance."""
    return name.removesuffix(NEXT_SUFFIX)


def base_name(name: str) -> str:
    """The deployment a record belongs to: ``web`` for ``web``, ``web@2`` and ``web@next``."""
    return name.split(SEPARATOR, 1)[0]


def record_name_ok(name: object) -> bool:
    """A deployment name, optionally ``@<i>`` (i >= 1, no leading zero), optionally
    ``@next``: exactly the names safe as a file name (invariant 9)."""
    if not isinstance(name, str):
        return False
    match = RECORD_NAME.fullmatch(name)
    return match is not None and is_dns1123(match.group("base"))


def model_names(name: str, model: str | None, aliases: Iterable[str]) -> tuple[str, ...]:
    """The model names the gateway routes to a deployment: its name, model and aliases
    (in that order, each once). Set on the record when it is made (``Record.models``)."""
    return tuple(dict.fromkeys([name, *([model] if model else []), *aliases]))


def in_repo(checkout: Path | None, file: str) -> str:
    """A manifest file of a git source's ``checkout`` named as in the repository
    (``manifests/a.yaml``), for people: the checkout's place under the state dir is
    reconcile's, not theirs. Any other file (or no checkout) as it is. Its control
    characters escaped (``\\x1b``): a file's name is whatever a push made it, and a
    name holding a terminal's escapes set the title or hid lines of `status` and `--once`."""
    if checkout is not None:
        with contextlib.suppress(ValueError):
            file = Path(file).relative_to(checkout).as_posix()
    return printable(file)
