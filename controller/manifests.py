"""The only YAML reader: manifest folders -> (specs, per-file errors with file and line).

Each file is bounded (size, node count, depth) so a hostile or broken file costs
little, and a broken file never hides the deployments it declared before: its
path is reported in ``broken_sources`` and the pass leaves those records alone.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import ValidationError
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

from controller import security
from controller.specs import Deployment, Entry, is_dns1123, spec_hash

MAX_FILE_BYTES = 1 << 20  # 1 MiB: a manifest is a few hundred bytes
MAX_NODES = 20_000  # alias expansion counts: a YAML "billion laughs" stops here
MAX_DEPTH = 64
SUFFIXES = (".yaml", ".yml")

Path_ = tuple[str | int, ...]


@dataclass(frozen=True)
class ManifestError:
    file: str
    line: int | None
    field: str | None
    message: str
    name: str | None = None  # the deployment it concerns, when known

    def __str__(self) -> str:
        where = self.file + (f":{self.line}" if self.line else "")
        what = f"{self.field}: " if self.field else ""
        return f"{where}: {what}{self.message}"


@dataclass
class LoadResult:
    entries: dict[str, Entry] = field(default_factory=dict)
    errors: list[ManifestError] = field(default_factory=list)
    # Files that could not be read or parsed at all: the names they declare are unknown.
    broken_sources: set[str] = field(default_factory=set)
    # Names declared by documents that failed validation (or duplicates): leave them be.
    invalid_names: dict[str, str] = field(default_factory=dict)
    missing_folders: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    documents: int = 0  # non-empty YAML documents read, valid or not

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def prune_safe(self) -> bool:
        """False when a folder is missing or holds no manifest (invariant 5).

        A file with no document (empty, all comments: a truncated checkout) is no
        manifest; a file that cannot be parsed may be one, so it counts.
        """
        has_manifest = self.documents > 0 or bool(self.broken_sources)
        return not self.missing_folders and has_manifest


if TYPE_CHECKING:
    _Base = yaml.SafeLoader
elif yaml.__with_libyaml__:
    from yaml._yaml import CParser

    class _Base(Composer, CParser, SafeConstructor, Resolver):
        """libyaml's scanner and parser (C, ~10x faster), PyYAML's own composer on top.

        The events and marks are those of the pure-Python parser, and composing stays
        in Python so the bounds below still apply node by node.
        """

        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)

else:  # PyYAML built without libyaml
    _Base = yaml.SafeLoader


class _BoundedLoader(_Base):
    """Composes at most MAX_NODES nodes per file, MAX_DEPTH deep: a file's cost is bounded.

    The limits bind while the file is parsed, so a megabyte of ``[0,0,0,...`` or of
    ``---`` stops after MAX_NODES nodes instead of building them all first.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.composed = 0
        self.depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        self.composed += 1
        self.depth += 1
        try:
            if self.composed > MAX_NODES or self.depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                if self.composed > MAX_NODES:
                    raise _at(mark, f"more than {MAX_NODES} YAML nodes")
                raise _at(mark, f"nested deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _at(mark: yaml.Mark | None, message: str) -> yaml.MarkedYAMLError:
    return yaml.MarkedYAMLError(problem=message, problem_mark=mark)


def _fail(node: yaml.Node, message: str) -> yaml.MarkedYAMLError:
    return yaml.MarkedYAMLError(problem=message, problem_mark=node.start_mark)


class _Converter:
    """Turn a composed node tree into Python values, remembering each path's line."""

    def __init__(self) -> None:
        self.lines: dict[Path_, int] = {}
        self.nodes = 0
        self._constructor = SafeConstructor()  # scalars only: no stream, no parser

    def convert(self, node: yaml.Node, path: Path_ = (), depth: int = 0) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise _fail(node, f"more than {MAX_NODES} YAML nodes (alias expansion?)")
        if depth > MAX_DEPTH:
            raise _fail(node, f"nested deeper than {MAX_DEPTH} levels")
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path, depth)
        if isinstance(node, yaml.SequenceNode):
            return [self.convert(v, (*path, i), depth + 1) for i, v in enumerate(node.value)]
        return self._constructor.construct_object(node, deep=True)

    def _mapping(self, node: yaml.MappingNode, path: Path_, depth: int) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise _fail(key_node, "merge keys ('<<') are not supported in manifests")
            key = self.convert(key_node, path, depth + 1)
            if not isinstance(key, str):
                raise _fail(key_node, f"mapping key {key!r} must be a string")
            if key in out:
                raise _fail(key_node, f"duplicate key {key!r}")
            out[key] = self.convert(value_node, (*path, key), depth + 1)
        return out


def _field_path(loc: Sequence[str | int]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + item)
    return "".join(parts)


def _line_for(lines: dict[Path_, int], loc: Sequence[str | int]) -> int | None:
    # Pydantic reports paths like ('spec', 'devices', 'count'); fall back to the
    # nearest ancestor that exists in the YAML (a missing field points at its parent).
    probe = tuple(loc)
    while probe:
        if probe in lines:
            return lines[probe]
        probe = probe[:-1]
    return lines.get(())


def _validation_errors(
    exc: ValidationError, file: str, lines: dict[Path_, int], name: str | None
) -> list[ManifestError]:
    out = []
    for err in exc.errors():
        # Drop pydantic's internal step names ('function-after[...]') from the path.
        loc = [p for p in err["loc"] if not (isinstance(p, str) and "[" in p)]
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = "unknown field (check the spelling; `reconcile schema` lists fields)"
        out.append(ManifestError(file, _line_for(lines, loc), _field_path(loc), message, name))
    return out


def _read(path: Path, strict: bool = False) -> bytes:
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        fd = os.open(path.resolve(), flags)  # resolve(): a symlink to a file is fine
    try:
        info = os.fstat(fd)
        if strict:  # as root: the file we opened, not a path someone could swap
            security.check_manifest(info)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"not a regular file (mode {stat.filemode(info.st_mode)})")
        if info.st_size > MAX_FILE_BYTES:
            raise OSError(f"{info.st_size} bytes is over the {MAX_FILE_BYTES}-byte limit")
        data = os.read(fd, MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise OSError(f"over the {MAX_FILE_BYTES}-byte limit")
    return data


def load_file(path: Path, result: LoadResult, strict: bool = False) -> None:
    file = str(path)
    try:
        text = _read(path, strict).decode("utf-8")
    except security.InsecureManifest as exc:
        _broken(result, ManifestError(file, None, None, str(exc)))
        return
    except (OSError, RuntimeError, UnicodeDecodeError) as exc:
        reason = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else str(exc)
        _broken(result, ManifestError(file, None, None, f"cannot read: {reason}"))
        return
    try:
        values = []
        for node in yaml.compose_all(text, Loader=_BoundedLoader):
            if node is not None and not _empty(node):
                converter = _Converter()
                values.append((converter.convert(node), converter.lines, node))
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else None
        _broken(result, ManifestError(file, line, None, f"invalid YAML: {exc.problem}"))
        return
    except yaml.reader.ReaderError as exc:  # a character YAML refuses (NUL, ...): say where
        _broken(result, _reader_error(file, text, exc))
        return
    except (yaml.YAMLError, RecursionError, ValueError) as exc:
        _broken(result, ManifestError(file, None, None, f"invalid YAML: {exc}"))
        return
    result.documents += len(values)
    for value, lines, node in values:
        _load_document(value, lines, node.start_mark.line + 1, file, result)


def _empty(node: yaml.Node) -> bool:
    """An empty document (a trailing ``---``, a commented-out one): skipped, like kubectl."""
    return isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"


def load_mapping(path: Path) -> tuple[dict[str, Any], dict[Path_, int]]:
    """One YAML mapping (the node config file), bounded like a manifest, with its lines.

    Raises ``ValueError`` with a message that names the file and the line.
    """
    try:
        text = _read(path).decode("utf-8")
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        converter = _Converter()
        value = converter.convert(node) if node is not None else {}
    except yaml.MarkedYAMLError as exc:
        line = f":{exc.problem_mark.line + 1}" if exc.problem_mark else ""
        raise ValueError(f"{path}{line}: invalid YAML: {exc.problem}") from exc
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError) as exc:
        raise ValueError(f"{path}: cannot read: {exc}") from exc
    if not isinstance(value, dict):
        raise ValueError(f"{path}: must be a mapping of settings")
    return value, converter.lines if node is not None else {}


def _reader_error(file: str, text: str, exc: yaml.reader.ReaderError) -> ManifestError:
    # libyaml counts the offset in UTF-8 bytes, the pure-Python reader in characters.
    offset = exc.position if isinstance(exc.position, int) else 0
    before = text.encode()[:offset] if yaml.__with_libyaml__ else text[:offset].encode()
    char = f"#x{exc.character:04x}" if isinstance(exc.character, int) else repr(exc.character)
    message = f"invalid YAML: character {char} is not allowed ({exc.reason})"
    return ManifestError(file, before.count(b"\n") + 1, None, message)


def _broken(result: LoadResult, error: ManifestError) -> None:
    result.errors.append(error)
    result.broken_sources.add(error.file)


def _load_document(
    value: Any, lines: dict[Path_, int], line: int, file: str, result: LoadResult
) -> None:
    if not isinstance(value, dict):
        result.errors.append(ManifestError(file, line, None, "a document must be a mapping"))
        result.broken_sources.add(file)
        return
    meta = value.get("metadata")
    raw_name = meta.get("name") if isinstance(meta, dict) else None
    name = raw_name if is_dns1123(raw_name) else None
    try:
        deployment = Deployment.model_validate(value)
    except ValidationError as exc:
        errors = _validation_errors(exc, file, lines, name)
        result.errors.extend(errors)
        if name is None:
            result.broken_sources.add(file)  # which deployment it was is unknown
        else:
            result.invalid_names.setdefault(name, str(errors[0]))
        return
    problem = _recipe_problem(deployment)
    if problem is not None:  # a spec its engine's recipe refuses (no model...): invalid too
        field_ = re.search(r"\bspec\.\w+", problem)
        loc = tuple(field_.group().split(".")) if field_ else ("spec",)
        error = ManifestError(file, _line_for(lines, loc), ".".join(loc), problem, deployment.name)
        result.errors.append(error)
        result.invalid_names.setdefault(deployment.name, str(error))
        return
    _add(result, Entry(deployment, file, line, spec_hash(deployment.spec)))


def _recipe_problem(deployment: Deployment) -> str | None:
    """Render the spec once with stand-in ports: what the recipe refuses, before any pass."""
    from controller.engines import RecipeError, recipe_for
    from controller.render import render

    extra = tuple(range(2, 2 + recipe_for(deployment.spec.engine).extra_ports))
    try:
        render(Entry(deployment, "", 0, ""), devices=(), port=1, extra_ports=extra)
    except RecipeError as exc:
        return str(exc)
    return None


def _add(result: LoadResult, entry: Entry) -> None:
    name = entry.name
    first = result.entries.get(name)
    if first is None and name not in result.invalid_names:
        result.entries[name] = entry
        return
    where = f"{first.source}:{first.line}" if first else "an invalid document"
    message = f"duplicate deployment name {name!r}: also declared in {where}"
    result.errors.append(ManifestError(entry.source, entry.line, "metadata.name", message, name))
    if first is not None:
        del result.entries[name]
        other = f"duplicate deployment name {name!r}: also declared in {entry.source}:{entry.line}"
        result.errors.append(ManifestError(first.source, first.line, "metadata.name", other, name))
    result.invalid_names[name] = message


def manifest_files(folder: Path) -> list[Path]:
    """``*.yaml``/``*.yml`` in one folder (not recursive), skipping hidden and editor temp files."""
    out = []
    for child in sorted(folder.iterdir()):
        if child.name.startswith(".") or not child.name.endswith(SUFFIXES):
            continue
        out.append(child)
    return out


def load(folders: Iterable[Path], *, insecure: bool = False) -> LoadResult:
    """Every manifest of ``folders``; as root, only files and folders root alone can write."""
    result = LoadResult()
    strict = security.strict(insecure)
    for folder in folders:
        try:
            if strict:
                security.check_folder(folder)
            files = manifest_files(folder)
        except FileNotFoundError:
            result.missing_folders.append(str(folder))
            continue
        except security.InsecureManifest as exc:  # prunes nothing, like a missing folder
            result.missing_folders.append(str(folder))
            result.errors.append(ManifestError(str(folder), None, None, str(exc)))
            continue
        except OSError as exc:  # not a folder, no permission, a symlink loop (ELOOP)...
            result.missing_folders.append(str(folder))
            result.errors.append(ManifestError(str(folder), None, None, f"cannot list: {exc}"))
            continue
        for path in files:
            result.files.append(str(path))
            load_file(path, result, strict)
    return result
