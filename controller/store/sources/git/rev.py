"""The git commit a manifests folder is checked out at, read from ``.git`` directly.

A pass runs every few seconds, so the commit is read without ``git``: it finds the enclosing
``.git`` (a folder, or a ``gitdir:`` file for worktrees and submodules), reads
``HEAD``, and resolves a symbolic ref through the loose ref file, then
``packed-refs``. Anything unexpected (not a work tree, an unborn branch, an odd
layout) is "no revision", never an error: the revision is information, not a gate.
Whether the folder is dirty (``+dirty``) does take one ``git status`` (``dirty``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

SHA = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")  # SHA-1, or SHA-256 repositories
MAX_HOPS = 5  # symbolic refs pointing at symbolic refs


def git_dirs(folder: Path) -> tuple[Path, Path] | None:
    """(the repository's git dir for HEAD, the common dir for refs), or None."""
    for parent in (folder, *folder.parents):
        dot = parent / ".git"
        try:
            if dot.is_dir():
                return dot, dot
            if dot.is_file():
                return _linked(dot)
        except OSError:  # a folder this user may not search (EACCES): no revision, no error
            return None
    return None


def _linked(dot: Path) -> tuple[Path, Path] | None:
    text = _read(dot)
    if not text or not text.startswith("gitdir:"):
        return None
    gitdir = Path(text.removeprefix("gitdir:").strip())
    gitdir = gitdir if gitdir.is_absolute() else (dot.parent / gitdir).resolve()
    common = _read(gitdir / "commondir")  # worktrees keep refs in the main repository
    if common is None:
        return gitdir, gitdir
    common_dir = Path(common)
    return gitdir, common_dir if common_dir.is_absolute() else (gitdir / common_dir).resolve()


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def resolve_ref(gitdir: Path, common: Path, ref: str) -> str | None:
    for _ in range(MAX_HOPS):
        value = _read(gitdir / ref) or _read(common / ref) or _packed(common, ref)
        if value is None:
            return None
        if not value.startswith("ref:"):
            return value if SHA.match(value) else None
        ref = value.removeprefix("ref:").strip()
    return None


def _packed(common: Path, ref: str) -> str | None:
    text = _read(common / "packed-refs")
    for line in (text or "").splitlines():
        sha, _, name = line.partition(" ")
        if name == ref and SHA.match(sha):
            return sha
    return None


def revision(folder: Path) -> str | None:
    """The commit ``folder`` is checked out at, or None outside a git work tree."""
    dirs = git_dirs(folder.absolute())
    if dirs is None:
        return None
    gitdir, common = dirs
    return resolve_ref(gitdir, common, "HEAD")


def dirty(folder: Path) -> bool:
    """Whether the folder's files (or the one file ``-f`` names) differ from the commit
    (edited, added, removed).

    The one ``git`` process here: a checkout the user manages (``-f`` on a clone) may hold
    an edit, and a record must not claim the clean commit for it. Only folders inside a
    work tree pay for it; no git, or git failing, is "not known dirty"."""
    import subprocess

    where, what = (folder, ".") if folder.is_dir() else (folder.parent, folder.name)
    try:
        proc = subprocess.run(
            ["git", "-C", str(where), "status", "--porcelain", "--untracked-files=all", "--", what],
            capture_output=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and bool(proc.stdout.strip())


def revision_of(folders: Iterable[Path], *, check_dirty: bool = True) -> str | None:
    """One revision for a pass: the folders' commit (distinct ones joined by ','), each
    with ``+dirty`` when its files differ from that commit (``check_dirty``: not for
    reconcile's own git checkout, which nothing edits)."""
    found: list[str] = []
    for folder in folders:
        rev = revision(folder)
        if rev and check_dirty and dirty(folder):
            rev += "+dirty"
        if rev and rev not in found:
            found.append(rev)
    return ",".join(found) or None
