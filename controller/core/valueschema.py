"""The JSON Schema (draft 2020-12) of a :class:`~controller.core.values.Value`.

Read from the same fields, types and :class:`Rule` bounds that check documents, so
an editor's schema and the loader never disagree. Nested values go to ``$defs``.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from controller.core.values import Rule, Value, dump, fields_of, required

BOUNDS = {
    "ge": "minimum",
    "gt": "exclusiveMinimum",
    "le": "maximum",
    "lt": "exclusiveMaximum",
    "min_length": "minLength",
    "max_length": "maxLength",
}
SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean"}


def schema_of(root: type[Value]) -> dict[str, Any]:
    defs: dict[str, dict[str, Any]] = {}
    schema = _object(root, defs)
    if defs:
        schema = {"$defs": dict(sorted(defs.items())), **schema}
    return schema


def _object(cls: type[Value], defs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    needed: list[str] = []
    for key, (_, kind, f) in fields_of(cls).items():
        prop = _type(kind, defs)
        if required(f):
            needed.append(key)
        else:
            default = f.default_factory() if callable(f.default_factory) else f.default
            prop = {**prop, "default": dump(default, True)}
        properties[key] = {**prop, "title": key[:1].upper() + key[1:].lower()}
    out: dict[str, Any] = {"additionalProperties": False, "properties": properties}
    if needed:
        out["required"] = needed
    return {**out, "title": cls.__name__, "type": "object"}


def _type(kind: Any, defs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    origin = typing.get_origin(kind)
    if origin is typing.Annotated:
        base, *extras = typing.get_args(kind)
        out = _type(base, defs)
        for rule in (r for r in extras if isinstance(r, Rule)):
            if rule.accepts is not None:
                out = dict(rule.accepts)
            out.update(
                {BOUNDS[k]: getattr(rule, k) for k in BOUNDS if getattr(rule, k) is not None}
            )
        return out
    if origin in (types.UnionType, typing.Union):
        options = typing.get_args(kind)
        return {"anyOf": [_type(o, defs) for o in options]}
    if origin is typing.Literal:
        values = list(typing.get_args(kind))
        shape = {"const": values[0]} if len(values) == 1 else {"enum": values}
        return {**shape, "type": "string"}
    if origin is tuple:
        return {"items": _type(typing.get_args(kind)[0], defs), "type": "array"}
    if origin is dict:
        key, item = typing.get_args(kind)
        out = {"additionalProperties": _type(item, defs), "type": "object"}
        if typing.get_origin(key) is typing.Literal:
            out["propertyNames"] = {"enum": list(typing.get_args(key))}
        return out
    if kind is type(None):
        return {"type": "null"}
    if isinstance(kind, type) and issubclass(kind, Value):
        if kind.__name__ not in defs:
            defs[kind.__name__] = {}  # claimed first: a value that nests itself ends here
            defs[kind.__name__] = _object(kind, defs)
        return {"$ref": f"#/$defs/{kind.__name__}"}
    return {"type": SCALARS[kind]}
