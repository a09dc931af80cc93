"""Hypothesis strategies for bad input: valid-looking manifests gone wrong, and raw bytes."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

BASE: dict[str, Any] = {
    "apiVersion": "reconcile/v1",
    "kind": "Deployment",
    "metadata": {"name": "fuzzed", "labels": {"team": "x"}},
    "spec": {
        "engine": "command",
        "command": ["/bin/false", "{port}"],
        "env": {"A": "1"},
        "devices": {"count": 99, "kind": "nvidia"},  # never placeable: nothing fuzzed runs
        "basePort": 8000,
        "readiness": {"tcpSocket": {}, "deadlineSeconds": 5},
        "stopGracePeriodSeconds": 1,
        "restartPolicy": "Never",
    },
}

SCHEMA = Path(__file__).parents[2] / "schema" / "deployment.schema.json"


def _walk(
    node: dict[str, Any], defs: dict[str, Any], path: tuple[str, ...]
) -> Iterator[tuple[str, ...]]:
    """Every field path under ``node`` (``$ref``s and ``anyOf`` branches followed)."""
    ref = node.get("$ref")
    if isinstance(ref, str):
        node = defs[ref.rsplit("/", 1)[-1]]
    for branch in node.get("anyOf", ()):
        yield from _walk(branch, defs, path)
    for key, sub in node.get("properties", {}).items():
        yield (*path, key)
        yield from _walk(sub, defs, (*path, key))


def schema_paths() -> tuple[tuple[str, ...], ...]:
    """Every field of the manifest's schema: a field added later is fuzzed too (the
    hand-kept list this replaced missed ``devices.memory``, whose float crashed passes)."""
    schema = json.loads(SCHEMA.read_text())
    return tuple(dict.fromkeys(_walk(schema, schema.get("$defs", {}), ())))


PATHS = schema_paths()

huge = st.sampled_from([2**63, -(2**63) - 1, 10**100, 1e308, float("inf"), float("-inf")])
unicode_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=80)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    huge,
    st.floats(allow_nan=True),
    unicode_text,
    st.sampled_from(["", "0", "-1", "yes", "~", "null", "{port}", "../../etc/passwd", "a" * 300]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(unicode_text, inner, max_size=4)
    ),
    max_leaves=8,
)


def set_path(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node: Any = doc
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value


def _drop(doc: dict[str, Any], path: tuple[str, ...]) -> None:
    node: Any = doc
    for key in path[:-1]:
        node = node.get(key)
        if not isinstance(node, dict):
            return
    node.pop(path[-1], None)


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    """The base manifest with 1-4 mutations: wrong types, unknown fields, missing fields."""
    doc = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(PATHS))
        kind = draw(st.sampled_from(("set", "unknown", "drop")))
        if kind == "set":
            set_path(doc, path, draw(values))
        elif kind == "unknown":
            set_path(doc, (*path[:-1], draw(unicode_text.filter(bool))), draw(values))
        else:
            _drop(doc, path)
    if draw(st.booleans()):
        set_path(doc, ("metadata", "name"), draw(unicode_text))
    return doc


def _dump(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


@st.composite
def manifest_texts(draw: st.DrawFn) -> bytes:
    """A fuzzed manifest as a file would hold it: whole, duplicated keys, cut, or spliced."""
    text = _dump(draw(documents()))
    how = draw(st.sampled_from(("whole", "dup-key", "truncate", "splice", "two-docs", "bytes")))
    if how == "dup-key":
        lines = text.splitlines(keepends=True)
        i = draw(st.integers(0, len(lines) - 1))
        text = "".join([*lines[: i + 1], lines[i], *lines[i + 1 :]])
    elif how == "truncate":
        text = text[: draw(st.integers(0, len(text)))]
    elif how == "splice":
        i = draw(st.integers(0, len(text)))
        text = text[:i] + draw(st.text(max_size=20)) + text[i:]
    elif how == "two-docs":
        text = text + "---\n" + _dump(draw(documents()))
    data = text.encode("utf-8", "surrogatepass")
    if how == "bytes":
        i = draw(st.integers(0, len(data)))
        data = data[:i] + draw(st.binary(min_size=1, max_size=16)) + data[i:]
    return data


raw_bytes = st.one_of(
    st.binary(max_size=512),
    st.binary(max_size=64).map(lambda b: b"\xff\xfe" + b),  # never UTF-8
    manifest_texts(),
)
