"""PyYAML's syntax errors in the words of the slip that made them, with the line it is on.

PyYAML names the parser's state ("mapping values are not allowed in this context", "could
not find expected ':'") and often the line after the slip (the end of the file, for a
quote never closed). What people actually got wrong is nearly always one of a few things:
a tab, a ': ' inside an unquoted value, a key without its space, a line indented off its
neighbours, a quote or a bracket never closed, an alias to an anchor of another document.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

from controller.core.manifest.excerpt import clip

if TYPE_CHECKING:
    import yaml


def syntax_error(exc: yaml.MarkedYAMLError, text: str) -> tuple[int | None, str]:
    """The line to show for ``exc`` and its message (``invalid YAML: ...``, then what to do)."""
    rows = text.splitlines()
    line = exc.problem_mark.line + 1 if exc.problem_mark else None
    opened = exc.context_mark.line + 1 if exc.context_mark else None
    problem = str(exc.problem)
    pasted = _pasted(rows, line)
    if pasted is not None:  # a README block copied with its fence, or a web page's spaces
        return pasted[0], f"invalid YAML: {problem}{pasted[1]}"
    hint = _tab(rows, line) or _hint(problem, str(exc.context or ""), rows, line, opened)
    if _begun_above(exc):
        line = opened  # found past the end, or a line below: the slip is where it began
    slip = _key_slip_above(rows, line) if problem.startswith("mapping values") else None
    if slip is not None:  # `port:8000` ran on into this line as one plain value
        line, hint = slip, _key_hint(rows[slip - 1])
    return line, f"invalid YAML: {problem}{hint}"


def _begun_above(exc: yaml.MarkedYAMLError) -> bool:
    """A key's colon or a quote's end looked for and not found before a later line (or the
    end of the file): the line the key or the quote began on is the slip. (A bracket never
    closed keeps the line it was found on: its message names where it opened.)"""
    mark, begun = exc.problem_mark, exc.context_mark
    return (
        mark is not None
        and begun is not None
        and mark.line > begun.line
        and ("simple key" in str(exc.context) or "quoted scalar" in str(exc.context))
    )


def _hint(problem: str, context: str, rows: list[str], line: int | None, opened: int | None) -> str:
    row = rows[line - 1] if line is not None and 0 < line <= len(rows) else ""
    if problem.startswith("mapping values are not allowed"):
        return _colon_hint(row)
    if problem == "could not find expected ':'" and "simple key" in context:
        return _key_hint(rows[opened - 1] if opened is not None and opened <= len(rows) else "")
    if "quoted scalar" in context and opened is not None:
        return f" (a quote opened on line {opened} is never closed)"
    if "flow" in context and opened is not None and opened != line:
        bracket = "[" if "']'" in problem else "{"
        return (
            f" (the '{bracket}' opened on line {opened} is never closed, or an item in it "
            "has an unquoted ':' or '#': quote that item)"
        )
    if problem.startswith(_OFF_INDENT):  # libyaml's words, then PyYAML's own
        return " (this line is not indented as the keys above it: the keys of one mapping line up)"
    if problem.startswith("found undefined alias"):
        return (
            " (an alias *name needs its anchor &name above it in the same document; "
            "anchors do not carry over '---')"
        )
    return ""


def _colon_hint(row: str) -> str:
    """A second ': ' on the line is a value with a colon; one alone, a line indented deeper
    than the keys above it (YAML reads it as the previous value's continuation)."""
    body = row.lstrip(" ")
    key, sep, value = body.partition(": ")
    if sep and (": " in value or value.endswith(":")):
        quoted = clip(json.dumps(value, ensure_ascii=False), 60)
        return f' (a value with ": " in it needs quotes: `{key}: {quoted}`)'
    return " (this line is indented deeper than the key above it: the keys of one mapping line up)"


_KEY_OR_ITEM = re.compile(r"- |[\w.-]+:( |$)")  # what an indent leads to in a mapping
_OFF_INDENT = ("did not find expected key", "did not find expected '-'", "expected <block end>")
_KEY_SLIP = re.compile(r"\s*([A-Za-z_][\w.-]*):(\S.*)")  # `port:8000`, not `url: http://`


def _key_slip_above(rows: list[str], line: int | None) -> int | None:
    """The line of ``port:8000`` when it is the nearest line above ``line`` with text."""
    for number in range((line or 1) - 1, 0, -1):
        if rows[number - 1].strip():
            return number if _KEY_SLIP.fullmatch(rows[number - 1]) else None
    return None


def _key_hint(row: str) -> str:
    """A line that is neither ``key: value`` nor a list item: most often ``port:8000``."""
    slip = _KEY_SLIP.fullmatch(row)
    if slip is not None:
        key, value = slip.groups()
        fixed = clip(f"{key}: {value}", 60)
        return f" (a key needs ': ', a colon and a space: write `{fixed}`)"
    return " (this line is neither `key: value` nor a list item `- value`)"


def _tab(rows: list[str], line: int | None) -> str:
    """PyYAML's words for a tab ("found character that cannot start any token") never say
    tab: name it, and where, when the line the error is on indents with one."""
    if line is None or not 0 < line <= len(rows):
        return ""
    row = rows[line - 1]
    indent = row[: len(row) - len(row.lstrip(" \t"))]
    if "\t" not in indent:
        return ""
    column = indent.index("\t") + 1
    return f" (a tab at column {column}: YAML indents with spaces only)"


def _pasted(rows: list[str], line: int | None) -> tuple[int, str] | None:
    """What copying from a page leaves that YAML cannot read, and its line: a Markdown
    fence (```yaml) on the line of the error, or an indent of no-break or other Unicode
    spaces on it or above it (YAML reads those as text, so the error comes a line late)."""
    if line is None or not 0 < line <= len(rows):
        return None
    if rows[line - 1].lstrip().startswith(("```", "~~~")):
        return line, " (a Markdown code fence: keep only the lines between the fences)"
    for number in range(1, line + 1):
        row = rows[number - 1]
        indent = row[: len(row) - len(row.lstrip())]
        odd = next((char for char in indent if char not in " \t"), None)
        if odd is not None and _KEY_OR_ITEM.match(row[len(indent) :]):  # not a string's text
            column = indent.index(odd) + 1
            return number, (
                f" (a U+{ord(odd):04X} space at column {column}, pasted from a page: "
                "YAML indents with plain spaces only: retype the indent)"
            )
    return None
