"""docs/design.md's module map names every module under controller/, and only modules that exist.

The map is the design page's module tables: the ``| folder | module | owns |`` table under
"The layers" (a blank folder cell carries the folder above it on; ``leaves`` is the top of
``controller/``), and any ``| module | owns |`` table, whose folder is the first
``controller/<folder>/`` its section's text names before it (the gateway's).

A module is named when its folder's rows say its file name in their module cell
(``inflight.py`` under ``core/scaling/`` and under ``store/`` are two modules, each found in its
own folder's rows). A module of a sub-folder is named by ``sub/name.py`` in the module
cell, or by ``sub/`` there and ``name.py`` anywhere in that row (the ``planner/`` and
``engines/`` rows). Packages are named by their folder: a package's ``__init__.py`` and
``__main__.py`` count as the package, named when its folder is (a top folder by its own
rows, a sub-folder by ``sub/`` or ``sub/x.py`` in a module cell); ``controller/`` itself is
the map's subject and needs no line.

The other way round, every ``.py`` file a row names, and every folder a module cell names,
must exist: in the row's folder, in a sub-folder its module cell names, or (a pointer
such as ``core/scaling/inflight.py`` from a ``store/`` row) under ``controller/`` or the
repository (``tests/...``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "controller"
DESIGN = ROOT / "docs" / "design.md"
PACKAGE_FILES = frozenset({"__init__.py", "__main__.py"})
TOKEN = re.compile(r"`([\w./]+)`")
FOLDER_IN_TEXT = re.compile(r"`controller/(\w+)/`")
LEAVES = "leaves"
CELL_EDGE = re.compile(r"(?<!\\)\|")


@dataclass(frozen=True, slots=True)
class Row:
    folder: str  # "core", "gateway", "" for the top of controller/
    where: str  # the table, as a person finds it
    modules: tuple[str, ...]  # tokens of the module cell
    mentions: tuple[str, ...]  # tokens anywhere in the row

    def subfolders(self) -> list[str]:
        return [t for t in self.modules if t.endswith("/")]


def _cells(line: str) -> list[str]:
    """A row's cells; ``\\|`` is a pipe inside a cell, as Markdown escapes it."""
    return [cell.strip() for cell in CELL_EDGE.split(line.strip().strip("|"))]


def _tokens(text: str) -> tuple[str, ...]:
    return tuple(t for t in TOKEN.findall(text) if t.endswith((".py", "/")))


def map_rows(text: str) -> list[Row]:
    """Every row of the module tables, each with its folder."""
    rows: list[Row] = []
    section, heading, header, folder = "", "", None, ""
    for line in text.splitlines():
        if line.startswith("## "):
            section, heading = "", line[3:].strip()
        if not line.startswith("|"):
            section += line + "\n"
            header = None
            continue
        cells = _cells(line)
        if header is None:
            header = cells
            if header == ["module", "owns"]:
                found = FOLDER_IN_TEXT.search(section)
                folder = found.group(1) if found else ""
            continue
        if set(line) <= set("|-: ") or header[-2:] != ["module", "owns"]:
            continue
        if header == ["folder", "module", "owns"] and cells[0]:
            folder = cells[0].strip("`").rstrip("/")
            folder = "" if folder == LEAVES else folder
        where = f"the `| {' | '.join(header)} |` table under '## {heading}'"
        rows.append(Row(folder, where, _tokens(cells[-2]), _tokens(line)))
    return rows


def modules() -> list[Path]:
    return sorted(p.relative_to(PACKAGE) for p in PACKAGE.rglob("*.py"))


def is_named(module: Path, rows: list[Row]) -> bool:
    if module.name in PACKAGE_FILES:
        return _package_named(module.parent, rows)
    top, inner = (
        (module.parts[0], Path(*module.parts[1:])) if len(module.parts) > 1 else ("", module)
    )
    for row in (r for r in rows if r.folder == top):
        if inner.as_posix() in row.modules:
            return True
        sub = inner.parent.as_posix() + "/"
        if inner.parent != Path() and sub in row.modules and inner.name in row.mentions:
            return True
    return False


def _package_named(package: Path, rows: list[Row]) -> bool:
    if package == Path():
        return True
    top, rest = package.parts[0], Path(*package.parts[1:]).as_posix() + "/"
    mine = [r for r in rows if r.folder == top]
    if len(package.parts) == 1:
        return bool(mine)
    return any(t.startswith(rest) for r in mine for t in r.modules)


def where_to_add(module: Path, rows: list[Row]) -> str:
    top = module.parts[0] if len(module.parts) > 1 else ""
    mine = [r for r in rows if r.folder == top]
    if mine:
        label = f"`{top}/`" if top else LEAVES
        return f"a line in {label}'s rows of {mine[0].where}"
    return f"a `{top}/` row in {rows[0].where}"


def stale_names(rows: list[Row]) -> list[str]:
    """Names a row gives that are no module or folder under controller/."""
    stale = []
    for row in rows:
        bases = [PACKAGE / row.folder] + [PACKAGE / row.folder / s for s in row.subfolders()]
        named = [*row.modules, *(t for t in row.mentions if t.endswith(".py"))]
        for name in dict.fromkeys(named):
            if not any((base / name).exists() for base in [*bases, PACKAGE, ROOT]):
                stale.append(f"`{name}` in `{row.folder or LEAVES}`'s rows of {row.where}")
    return stale


def test_every_module_has_a_line_in_the_map() -> None:
    rows = map_rows(DESIGN.read_text())
    missing = [
        f"controller/{m.as_posix()}: add {where_to_add(m, rows)}"
        for m in modules()
        if not is_named(m, rows)
    ]
    assert not missing, "docs/design.md's module map has no line for:\n" + "\n".join(missing)


def test_the_map_names_no_module_that_is_gone() -> None:
    stale = stale_names(map_rows(DESIGN.read_text()))
    assert not stale, "docs/design.md's module map names what is not there:\n" + "\n".join(stale)


def test_the_map_is_read_as_meant() -> None:
    """The reader itself: each folder's rows, the gateway's table, a sub-folder's row."""
    rows = map_rows(DESIGN.read_text())
    folders = {r.folder for r in rows}
    assert {"core", "store", "host", "gateway", ""} <= folders
    for same_name in (
        "core/scaling/inflight.py",
        "store/side/inflight.py",
        "gateway/accounting/inflight.py",
    ):
        assert is_named(Path(same_name), rows), same_name
    assert is_named(Path("core/planner/ledger.py"), rows)
    assert not is_named(Path("store/capacity.py"), rows)
    assert not is_named(Path("core/planner/nosuch.py"), rows)
    gone = Row("core", "t", ("nosuch.py", "ghost/"), ("nosuch.py", "ghost/", "state.py"))
    assert stale_names([gone]) == [f"`{n}` in `core`'s rows of t" for n in ("nosuch.py", "ghost/")]
