"""Bounded YAML reading: files, documents and the line of every value.

A file costs at most MAX_FILE_BYTES to read and MAX_NODES nodes, MAX_DEPTH deep,
to parse, whatever it holds (alias bombs, a megabyte of ``[0,0,...``). Values come
back with a map from their path to their line, so errors can say where.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

# yaml-free helpers live in store/sources/bounded.py (a pass whose manifests are all in the
# parse cache never imports yaml); re-exported here for the node config reader.
from controller.core.manifest import excerpt
from controller.store.sources.bounded import MAX_FILE_BYTES as MAX_FILE_BYTES
from controller.store.sources.bounded import SPLIT
from controller.store.sources.bounded import Document as Document
from controller.store.sources.bounded import Path_ as Path_
from controller.store.sources.bounded import field_path as field_path
from controller.store.sources.bounded import line_for as line_for
from controller.store.sources.bounded import read_bounded as read_bounded

MAX_NODES = 20_000  # alias expansion counts: a YAML "billion laughs" stops here
MAX_DEPTH = 64


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
                    raise _at(mark, f"more than {MAX_NODES} YAML nodes{SPLIT}")
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
        try:
            return self._constructor.construct_object(node, deep=True)
        except ValueError as exc:  # `2026-13-45` (a date), an int past Python's 4300 digits
            raise _fail(node, _unreadable_scalar(node, exc)) from None

    def _mapping(self, node: yaml.MappingNode, path: Path_, depth: int) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        seen: dict[str, int] = {}  # each key's line, for a duplicate's message
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise _fail(key_node, MERGE_KEYS)
            key = self.convert(key_node, path, depth + 1)
            if isinstance(key, bool):  # YAML 1.1: a bare on/off/yes/no is a boolean
                raise _fail(
                    key_node,
                    f"mapping key {key_node.value!r} reads as {str(key).lower()} in YAML: "
                    f'quote it ("{key_node.value}") to make it a string',
                )
            if not isinstance(key, str):
                raise _fail(key_node, f"mapping key {key!r} must be a string")
            if key in out:
                raise _fail(key_node, _duplicate(key, seen[key], path))
            seen[key] = key_node.start_mark.line + 1
            # A field's line is its key's: a block mapping or list under it starts on
            # the next line, which `export` named for `spec.autoscale` (one line low).
            self.lines.setdefault((*path, key), key_node.start_mark.line + 1)
            out[key] = self.convert(value_node, (*path, key), depth + 1)
        return out


# kubectl's YAML merges `<<: *defaults`; here each manifest says every field it means, so
# a diff, `plan` and an error's line show the field where it is written.
MERGE_KEYS = (
    "merge keys ('<<') are not supported in manifests: write the fields out in full where"
    " the '<<' is"
)


def _duplicate(key: str, first: int, path: Path_) -> str:
    """kubectl's 'mapping key "port" already defined at line 8', with the move."""
    where = f"in {field_path(path)}" if path else "at the top"
    return (
        f"duplicate key {key!r}: already written on line {first} {where}, and YAML takes a"
        " key once: keep the one meant"
    )


def _unreadable_scalar(node: yaml.Node, exc: ValueError) -> str:
    """A plain scalar YAML types (a number, a date) that Python cannot make: what it read
    it as, and to quote it (Python's words for a long int name sys.set_int_max_str_digits)."""
    kind = str(node.tag).rsplit(":", 1)[-1]
    if kind == "int":
        return f"a number of {len(str(node.value))} digits, too long to read: quote it"
    return (
        f"{excerpt.short(str(node.value))} reads as a {kind} in YAML but is none ({exc}): quote it"
    )


def written_scalar(text: str, line: int, value: object) -> str | None:
    """How the plain scalar on ``line`` (1-based) of ``text`` that YAML read as ``value``
    was written: ``0755`` for 493, ``1.10`` for 1.1. Values keep no text of their own, so
    this scans the file again (for a hint, or a number not as it reads on its line).
    None unless one text fits."""
    resolver, constructor = Resolver(), SafeConstructor()
    found: set[str] = set()
    try:
        for token in yaml.scan(text, Loader=yaml.SafeLoader):
            at = token.start_mark.line + 1
            if at > line:
                break
            if at == line and isinstance(token, yaml.ScalarToken) and token.plain:
                tag = resolver.resolve(yaml.ScalarNode, token.value, (True, False))  # type: ignore[no-untyped-call]
                read = constructor.construct_object(yaml.ScalarNode(tag, token.value))
                if type(read) is type(value) and read == value:
                    found.add(token.value)
    except (yaml.YAMLError, ValueError):  # a number past Python's digits: not this one
        return None
    return found.pop() if len(found) == 1 else None


def documents(text: str) -> list[Document]:
    """Every non-empty document of a YAML stream, bounded; raises yaml.YAMLError."""
    out = []
    for node in yaml.compose_all(text, Loader=_BoundedLoader):
        if node is not None and not _empty(node):
            converter = _Converter()
            out.append((converter.convert(node), converter.lines, node.start_mark.line + 1))
    return out


def _empty(node: yaml.Node) -> bool:
    """An empty document (a trailing ``---``, a commented-out one): skipped, like kubectl."""
    return isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"


# A node config of no byte but blanks is the instant of a write (`cat > node.yaml`, an
# editor's save, a full disk): read as no settings, a `--once` or a daemon's start there
# took the node for one with no labels and stopped every deployment they had selected.
# It is refused, as a half-written one is; a node with no settings may say so.
EMPTY_NODE_FILE = (
    "is empty (a write cut short, or a full disk?): refused, since read as no settings it"
    " would drop this node's labels and stop what they select; write its settings again"
    " (a node with none: a comment, `# no settings`, or no file)"
)


def load_mapping(path: Path) -> tuple[dict[str, Any], dict[Path_, int]]:
    """One YAML mapping (the node config file), bounded like a manifest, with its lines.

    Raises ``ValueError`` with a message that names the file and the line.
    """
    try:
        text = read_bounded(path).decode("utf-8")
        if not text.strip():
            raise ValueError(f"{path}: {EMPTY_NODE_FILE}")
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        converter = _Converter()
        value = converter.convert(node) if node is not None else {}
    except yaml.MarkedYAMLError as exc:
        from controller.store.sources.yamlwords import syntax_error

        at, problem = syntax_error(exc, text)
        raise ValueError(f"{path}{f':{at}' if at else ''}: {problem}") from exc
    except UnicodeDecodeError as exc:
        line, problem = not_utf8(exc)
        raise ValueError(f"{path}:{line}: cannot read: {problem}") from exc
    except (OSError, yaml.YAMLError, RecursionError) as exc:
        raise ValueError(f"{path}: cannot read: {exc}") from exc
    if not isinstance(value, dict):
        raise ValueError(f"{path}: must be a mapping of settings")
    return value, converter.lines if node is not None else {}


def not_utf8(exc: UnicodeDecodeError) -> tuple[int, str]:
    """The line of a byte UTF-8 refuses, and what to do: the codec's "can't decode byte 0xe9
    in position 60" named neither the line nor the next move."""
    raw = bytes(exc.object)
    line = raw.count(b"\n", 0, exc.start) + 1
    column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
    byte = raw[exc.start]
    return line, f"not UTF-8 text (byte 0x{byte:02x} at column {column}): save the file as UTF-8"


def reader_error_line(text: str, exc: yaml.reader.ReaderError) -> tuple[int, str]:
    """The line and message of a character YAML refuses (NUL, ...)."""
    # libyaml counts the offset in UTF-8 bytes, the pure-Python reader in characters.
    offset = exc.position if isinstance(exc.position, int) else 0
    before = text.encode()[:offset] if yaml.__with_libyaml__ else text[:offset].encode()
    char = f"#x{exc.character:04x}" if isinstance(exc.character, int) else repr(exc.character)
    message = f"invalid YAML: character {char} is not allowed ({exc.reason})"
    return before.count(b"\n") + 1, message
