"""What a manifests folder with no manifest holds instead: the newcomer's near misses.

A folder read as holding no manifest prunes nothing and fails `validate` and `--once`,
but "holds no manifest" is a puzzle when the files are right there: one folder down (`-f`
reads one folder, not its subfolders), named `web.YAML` or `web.json` (the reader takes
`*.yaml` and `*.yml`), or a `README.md` the reader passed over. Read only when a pass
found no manifest at all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import islice
from pathlib import Path

from controller.core.manifest.excerpt import did_you_mean

SUFFIXES = (".yaml", ".yml")
SHOWN = 3  # names a hint quotes: enough to recognise, short enough for a cron mail
# What a pass and `plan` add to `no manifest in DIR (…)`: invariant 5, and the way out.
NOTHING_PRUNED = "nothing pruned (--allow-empty to prune)"
LOOKED_AT = 1000  # a missing path's neighbours read for a near one: /tmp may hold many


def near_path(path: str) -> str:
    """`` (did you mean manifests/web.yaml?)`` when a missing ``-f`` path is one slip from
    a name its folder holds (`web.yml` beside `web.yaml`, `manifest` beside `manifests`);
    "" otherwise."""
    missing = Path(path)
    try:
        names = [c.name for c in islice(missing.parent.iterdir(), LOOKED_AT)]
    except OSError:
        return ""
    file = missing.name.endswith(SUFFIXES)  # a file for a folder is no near miss, nor back
    same_kind = (n for n in names if not n.startswith(".") and n.endswith(SUFFIXES) == file)
    meant = did_you_mean(missing.name, same_kind)
    if meant is None or (not file and not _is_dir(missing.parent / meant)):
        return ""
    return f" (did you mean {missing.parent / meant}?)"


def no_manifest(
    paths: Iterable[Path], files: Iterable[str], named: Callable[[str], str] = str
) -> str:
    """``no manifest in DIR (…)``: what the paths ``-f`` named hold instead, the words
    `validate`, `plan`, `--once` and `status` share (kubectl: "no objects passed to
    apply"). ``files``: the manifest files read (each held no document); ``named``: a path
    as its user names it (a git source's, as the repository does)."""
    paths = list(paths)
    folders = [p for p in paths if _is_dir(p)]
    said = [hint for folder in folders for hint in _of(folder, named)]
    said += [hint for folder in folders for hint in _ignored(folder)]
    if files := [Path(f).name for f in files]:
        said.append(f"no document in {_names(files)}: blank or only comments")
    where = ", ".join(named(str(p)) for p in paths)
    return f"no manifest in {where} ({'; '.join(said) or 'it is empty'})"


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


def _ignored(folder: Path) -> list[str]:
    """The files the reader passed over that no near miss names (``README.md``)."""
    try:
        children = sorted(c for c in folder.iterdir() if not c.name.startswith("."))
    except OSError:
        return []
    hinted = (*SUFFIXES, ".json")
    names = [c.name for c in children if not c.name.lower().endswith(hinted) and not _is_dir(c)]
    return [f"ignored {_names(names)}: manifests are .yaml or .yml files"] if names else []


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
