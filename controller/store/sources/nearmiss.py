"""What a manifests folder with no manifest holds instead: the newcomer's near misses.

A folder read as holding no manifest prunes nothing and fails `--once`, but "holds no
manifest" is a puzzle when the files are right there: one folder down (`-f` reads one
folder, not its subfolders), or named `web.YAML` or `web.json` (the reader takes
`*.yaml` and `*.yml`). Read only when a pass found no manifest at all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

SUFFIXES = (".yaml", ".yml")
SHOWN = 3  # names a hint quotes: enough to recognise, short enough for a cron mail


def near_misses(folders: Iterable[Path], named: Callable[[str], str] = str) -> str:
    """`` (…)`` naming what each folder holds that looks meant as a manifest, or ``""``;
    ``named``: a path as its user names it (a git source's, as the repository does)."""
    said = [hint for folder in folders for hint in _of(folder, named)]
    return f" ({'; '.join(said)})" if said else ""


def _of(folder: Path, named: Callable[[str], str]) -> list[str]:
    try:
        children = sorted(c for c in folder.iterdir() if not c.name.startswith("."))
    except OSError:  # not a folder, or not listable: its own error says so
        return []
    below = [c for c in children if _is_dir(c) and _manifests_in(c)]
    cased = [c.name for c in children if _cased(c.name)]
    json = [c.name for c in children if c.name.lower().endswith(".json")]
    where = named(str(folder))
    out = [
        f"{named(str(c))} holds {_manifests_in(c)}: -f reads one folder, not its subfolders"
        for c in below
    ]
    if cased:
        out.append(f"{_names(cased)} in {where}: the suffix is lower-case .yaml or .yml")
    if json:
        out.append(f"{_names(json)} in {where}: manifests are YAML files (.yaml, .yml)")
    return out[:SHOWN]


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:
        return False


def _manifests_in(folder: Path) -> int:
    try:
        return sum(1 for c in folder.iterdir() if c.name.endswith(SUFFIXES))
    except OSError:
        return 0


def _cased(name: str) -> bool:
    return name.lower().endswith(SUFFIXES) and not name.endswith(SUFFIXES)


def _names(names: list[str]) -> str:
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more
