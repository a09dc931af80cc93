"""Kubernetes' label syntax: keys, values, and the label selectors of ``-l``.

No pydantic here: ``status -l`` checks its selector without it (``labels.py`` makes a
pydantic field type of the same rules). A selector is read as kubectl reads it:
requirements separated by commas, all of which must hold (``team=search,tier!=batch``);
one that is no selector (``bad key=@``) is an error naming the requirement and what is
wrong in it, where it silently matched nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, assert_never

# Kubernetes' label syntax (apimachinery's validation): a name part of at most 63
# characters, alphanumeric at both ends, '-', '_' and '.' between; a key may carry a
# DNS-1123 subdomain prefix of at most 253 ("example.com/gpu"); a value may be empty.
_NAME = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAME_RULE = "at most 63 characters: letters, digits, '-', '_' and '.', alphanumeric at both ends"

# One requirement, as kubectl's parser takes it (spaces around the operator allowed); the
# key and values are then checked as labels are, so the error names the one that is wrong.
_SET = re.compile(r"(?P<key>.*?)\s+(?P<op>in|notin)\s*\((?P<values>.*)\)")
_EQUAL = re.compile(r"(?P<key>.*?)\s*(?P<op>==|!=|=)\s*(?P<value>.*)")
_SPLIT = re.compile(r",(?![^()]*\))")  # a comma outside the parentheses of `in (a,b)`
SYNTAX = "KEY, !KEY, KEY=VALUE, KEY!=VALUE, KEY in (A,B) or KEY notin (A,B), comma-separated"

Op = Literal["exists", "absent", "in", "notin"]


def key_problem(key: str) -> str | None:
    """Why ``key`` is no label key (None: it is one)."""
    prefix, slash, name = key.rpartition("/")
    if slash and (len(prefix) > 253 or not _PREFIX.fullmatch(prefix)):
        return (
            f"label key {key!r}: the prefix before '/' must be a DNS subdomain"
            " (lower-case, e.g. example.com), at most 253 characters"
        )
    if not name or len(name) > 63 or not _NAME.fullmatch(name):
        return f"label key {key!r}: the name must be {_NAME_RULE}"
    return None


def value_problem(value: str) -> str | None:
    """Why ``value`` is no label value (None: it is one; empty is allowed)."""
    if len(value) > 63 or not _NAME.fullmatch(value):
        return f"label value {value!r} must be empty or {_NAME_RULE}"
    return None


@dataclass(frozen=True, slots=True)
class Requirement:
    """One requirement of a selector: ``KEY=VALUE`` is ``in`` one value, ``!=`` ``notin``."""

    key: str
    op: Op
    values: frozenset[str] = frozenset()

    def holds(self, labels: Mapping[str, str]) -> bool:
        """Kubernetes' meaning: ``!=`` and ``notin`` hold where the label is absent too."""
        match self.op:
            case "exists":
                return self.key in labels
            case "absent":
                return self.key not in labels
            case "in":
                return labels.get(self.key) in self.values
            case "notin":
                return labels.get(self.key) not in self.values
            case _:
                assert_never(self.op)


def parse_selector(text: str) -> tuple[Requirement, ...]:
    """``text`` as kubectl's ``-l`` reads it; ValueError says which requirement is wrong."""
    return tuple(_requirement(part.strip(), text) for part in _SPLIT.split(text))


def _requirement(part: str, text: str) -> Requirement:
    found = _parsed(part)
    if isinstance(found, str):
        where = f"{text!r}" if part == text.strip() else f"{part!r} in {text!r}"
        raise ValueError(f"{where}: {found} (a selector is {SYNTAX})")
    return found


def _parsed(part: str) -> Requirement | str:
    """The requirement ``part`` is, or what is wrong in it."""
    if not part:
        return "an empty requirement (a stray comma?)"
    if found := _SET.fullmatch(part):
        values = [v.strip() for v in found["values"].split(",")]
        op: Op = "in" if found["op"] == "in" else "notin"
        return _checked(found["key"], op, values)
    if "(" in part or ")" in part:
        return "a set needs its values in one pair of parentheses: KEY in (A,B)"
    if found := _EQUAL.fullmatch(part):
        if not found["key"]:
            return f"no key before {found['op']!r}"
        op = "notin" if found["op"] == "!=" else "in"
        return _checked(found["key"], op, [found["value"]])
    absent = part.startswith("!")
    return _checked(part.removeprefix("!").strip(), "absent" if absent else "exists", [])


def _checked(key: str, op: Op, values: list[str]) -> Requirement | str:
    problem = key_problem(key) or next(filter(None, map(value_problem, values)), None)
    return problem or Requirement(key, op, frozenset(values))
