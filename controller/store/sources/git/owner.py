"""Whose records a git source's are: the owner ``git:<url>#<path>`` kept whatever the
URL's spelling (the name the state dir already knows the source by), and the source
a state dir follows when it is another than the one named."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

from controller.errors import ConfigError
from controller.store.sources.git.settings import GitSettings, same_repository
from controller.store.sources.git.status import SourceStatus, peek_status
from controller.store.statedir import StateDir


def _owner_key(owner: str) -> tuple[str, str] | None:
    """``git:<url>#<path>``'s repository and path (None: another owner, ``--owner``'s)."""
    if not owner.startswith("git:") or "#" not in owner:
        return None
    url, _, path = owner.removeprefix("git:").rpartition("#")
    return same_repository(url), path


def spelled_as_before(
    state_dir: Path, s: GitSettings, owners: Callable[[], Iterable[str]]
) -> GitSettings:
    """``s`` owned by the name the state dir already knows it by when it is the same
    repository and path spelled otherwise (``file://`` or a path, ``.git`` or not): the
    records made under the first spelling stay its own, nothing conflicts or is pruned.
    The name is ``source.json``'s, else one its records carry (``owners``, read only when
    ``source.json`` names another source: a source followed again after another, whose
    name the file no longer holds, is known by its records)."""
    if s.owned_as is not None:
        return s
    key = _owner_key(s.owner)
    old = _remembered_owner(state_dir)
    if old == s.owner:
        return s
    if old is not None and _owner_key(old) == key:
        return replace(s, owned_as=old)
    known = {owner for owner in owners() if _owner_key(owner) == key}
    if not known or s.owner in known:
        return s
    return replace(s, owned_as=min(known))  # one name for every call (several: a conflict)


def _remembered_owner(state_dir: Path) -> str | None:
    if not StateDir(state_dir).git_source.exists():
        return None
    try:
        old = peek_status(state_dir)
    except ConfigError:
        return None  # `reconcile source` says what is wrong with the file
    return None if old is None else old.owner


def followed_instead(state_dir: Path, s: GitSettings) -> SourceStatus | None:
    """The source this state dir follows when it is not ``s`` (None: ``s``, or none)."""
    old = peek_status(state_dir)
    if old is None or old.names() == SourceStatus.fresh(s).names():
        return None
    return old
