"""pydantic's validation errors as a user reads them: the path they wrote, and what is wrong.

pydantic's ``loc`` mixes the document's keys (camelCase aliases, list indexes) with the
names of its own steps (``function-after[...]``, ``[key]``); only the document's keys
make the path, so the store can find the line each one is on.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from controller.core.manifest import hints
from controller.core.manifest.excerpt import clip, did_you_mean, short

Loc = tuple[str | int, ...]
# How the scalar at a path that YAML read as a value was written (None: not known).
Written = Callable[[Loc, object], str | None]
_MISSING = object()


@dataclass(frozen=True, slots=True)
class Problem:
    loc: Loc  # the path in the document, as written: ("spec", "devices", "count")
    message: str
    unknown: bool = False  # a field the model does not have (extra="forbid")

    @property
    def path(self) -> str:
        return ".".join(map(str, self.loc))


def problems(
    exc: ValidationError, document: object, written: Written | None = None
) -> list[Problem]:
    """Every error of ``exc`` (raised validating ``document``), in the document's terms;
    ``written`` gives a hint the text a value was written as (``0755``, not 493)."""
    return [_problem(err, document, written) for err in exc.errors(include_url=False)]


def _problem(err: ErrorDetails, document: object, written: Written | None) -> Problem:
    path = _path(err["loc"], document)
    message = _message(err, path, written)
    return Problem(_field_named(message, path, document), message, err["type"] == "extra_forbidden")


def _field_named(message: str, path: Loc, document: object) -> Loc:
    """A check across a mapping's fields reports the mapping (`spec:`, its first line); one
    whose message opens with a field written in it (`spec.command is only for ...`) is
    about that field, whose line is the one to show."""
    head = tuple(message.partition(" ")[0].split("."))
    if len(head) != len(path) + 1 or head[:-1] != tuple(map(str, path)):
        return path
    node = document
    for part in path:
        node = _child(node, part)
    return (*path, head[-1]) if _child(node, head[-1]) is not _MISSING else path


def _message(err: ErrorDetails, path: Loc, written: Written | None = None) -> str:
    message = err["msg"].removeprefix("Value error, ")  # a validator's own ValueError
    kind, value = err["type"], err["input"]
    field = next((part for part in reversed(path) if isinstance(part, str)), "")
    if kind == "model_type":  # not "...or instance of DeploymentSpec": Python's words
        message = f"Input should be a mapping of fields, not {_kind(value)}"
    if path[:2] == ("spec", "env") and kind in ("dict_type", "string_type"):
        message += _env_hint(path, value)
    elif kind in ("model_type", "dict_type"):  # `devices: 1`, `env: [A=b]`: what to write
        message += hints.for_mapping(field, value)
    elif kind == "string_type":  # `{port}`, `true`, `1.0` unquoted: YAML's, not text
        message += hints.for_text(value, written(path, value) if written else None)
    elif kind in ("tuple_type", "list_type"):  # YAML has lists, not tuples
        message = _list_message(err["loc"], value, field)
    elif kind == "int_from_float" and path[-2:] == ("devices", "count"):  # half a GPU
        message += hints.PART_OF_A_DEVICE
    elif kind == "string_too_long" and path == ("metadata", "name"):  # pydantic's words alone
        message = f"name of {len(str(value))} characters: {DNS_1123_LONG}"
    elif kind == "missing":  # `apiVersion` left out: the line to add
        message += hints.for_missing(path)
    elif kind in ("literal_error", "enum"):  # `always`, `llamacpp`: say which one
        message += _meant(err)
    elif kind in ("float_parsing", "int_parsing") and _in_seconds(err):
        # `stopGracePeriodSeconds: 30s` (idleTimeout takes "90s"): the name says the unit
        message = f"a number of seconds (e.g. 30), not {short(str(value))}"
    return message


DNS_1123_LONG = (
    "a DNS-1123 label has at most 63 (lower-case letters, digits and '-'): shorten it; "
    "spec.aliases gives the gateway longer model names"
)


def _env_hint(path: Loc, value: object) -> str:
    """spec.env as Kubernetes writes it, or as KEY=VALUE items; never a value quoted."""
    if len(path) == 2 and isinstance(value, list) and value and isinstance(value[0], str):
        return hints.for_mapping("env", value)  # `env: [A=b]`: the mapping to write
    return hints.for_env(path[-1], value)


def _list_message(loc: tuple[str | int, ...], value: object, written: str | int) -> str:
    """A list was wanted; for an argv written as one shell line, the list it should be."""
    field = next((part for part in reversed(loc) if part in ("command", "args")), None)
    if field is None or not isinstance(value, str):
        return f"Input should be a list, not {_kind(value)}" + hints.for_list(written, value)
    try:
        words = shlex.split(value)
    except ValueError:  # unbalanced quotes: show the words split on spaces
        words = value.split()
    example = clip(json.dumps(words), 120)
    return f"an argv list, never a shell line (no shell runs it): write {field}: {example}"


def _meant(err: ErrorDetails) -> str:
    """For a value one slip from an allowed one (case, a dash, a letter): what was written
    and the value it was most likely meant as."""
    written = err["input"]
    allowed = re.findall(r"'([^']*)'", str((err.get("ctx") or {}).get("expected", "")))
    if not isinstance(written, str) or not allowed:
        return ""
    meant = did_you_mean(written, allowed, cutoff=0.75)
    said = f", not {short(written)}"
    return f"{said}: did you mean `{meant}`?" if meant else said


def _in_seconds(err: ErrorDetails) -> bool:
    """A field named for its unit (``stopGracePeriodSeconds``) given a duration string."""
    last = next((k for k in reversed(err["loc"]) if isinstance(k, str)), "")
    return last.endswith("Seconds") and isinstance(err["input"], str)


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _path(loc: tuple[str | int, ...], document: object) -> Loc:
    """The part of ``loc`` that is in ``document``, plus a missing field's name at the end."""
    out: list[str | int] = []
    node = document
    for i, part in enumerate(loc):
        child = _child(node, part)
        if child is not _MISSING:
            out.append(part)
            node = child
        elif i == len(loc) - 1 and part != "[key]":  # a required field not written
            out.append(part)
    return tuple(out)


def _child(node: object, part: str | int) -> object:
    if isinstance(node, dict) and part in node:
        return node[part]
    if isinstance(node, list | tuple) and isinstance(part, int) and 0 <= part < len(node):
        return node[part]
    return _MISSING
