"""Frozen dataclasses that read and write their own JSON, checked against their fields.

Records are internal values, not manifests: pydantic (~100 ms to import) stays for
the manifests and the schema, and a read verb (``status``) never pays for it. The
checks are the record schema's: each field's type (``int``, ``float``, ``str``,
``bool``, ``None``, ``datetime`` as ISO 8601, a ``StrEnum``, ``tuple[...]``,
``dict[str, ...]``, a nested value), no unknown fields, no missing required ones.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from datetime import datetime
from enum import Enum
from typing import Any, Self

Loc = tuple[str | int, ...]


class ValueInvalid(ValueError):
    """A document that does not fit a value's fields: where (a path) and what."""

    def __init__(self, loc: Loc, msg: str) -> None:
        super().__init__(f"{'.'.join(str(p) for p in loc) or '(top)'}: {msg}")
        self.loc = loc
        self.msg = msg


class Value:
    """The base of the frozen dataclasses below: pydantic's few methods we use."""

    __slots__ = ()

    def model_copy(self, *, update: dict[str, Any] | None = None) -> Self:
        """A copy with ``update`` applied (not checked, as pydantic's is not)."""
        return dataclasses.replace(self, **(update or {}))  # type: ignore[type-var]

    def model_dump(self) -> dict[str, Any]:
        dumped = _dump(self)
        assert isinstance(dumped, dict)
        return dumped

    def model_dump_json(self, *, indent: int | None = None) -> str:
        return json.dumps(self.model_dump(), indent=indent)

    @classmethod
    def model_validate(cls, data: object, loc: Loc = ()) -> Self:
        if not isinstance(data, dict):
            raise ValueInvalid(loc, f"expected an object, got {type(data).__name__}")
        hints = _hints(cls)  # type: ignore[arg-type]
        unknown = sorted(set(data) - set(hints))
        if unknown:
            raise ValueInvalid((*loc, str(unknown[0])), "extra fields not permitted")
        for name in _required(cls):  # type: ignore[arg-type]
            if name not in data:
                raise ValueInvalid((*loc, name), "field required")
        values = {k: _convert(hints[k], v, (*loc, k)) for k, v in data.items()}
        try:
            return cls(**values)
        except ValueInvalid as exc:  # a value's own check (__post_init__): where it sits
            raise ValueInvalid((*loc, *exc.loc), exc.msg) from None

    @classmethod
    def model_validate_json(cls, raw: str | bytes) -> Self:
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise ValueInvalid((), f"not JSON: {exc}") from exc
        return cls.model_validate(data)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in typing.get_type_hints(cls).items() if k in names}


@functools.cache
def _required(cls: type) -> tuple[str, ...]:
    missing = dataclasses.MISSING
    return tuple(
        f.name
        for f in dataclasses.fields(cls)
        if f.default is missing and f.default_factory is missing
    )


def _dump(value: object) -> object:
    if isinstance(value, Value):
        return {f.name: _dump(getattr(value, f.name)) for f in dataclasses.fields(value)}  # type: ignore[arg-type]
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, tuple | list):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value


def _convert(kind: Any, value: object, loc: Loc) -> Any:
    origin = typing.get_origin(kind)
    if origin in (types.UnionType, typing.Union):
        return _union(typing.get_args(kind), value, loc)
    if origin is tuple:
        return _tuple(typing.get_args(kind), value, loc)
    if origin is dict:
        return _dict(typing.get_args(kind)[1], value, loc)
    if kind is Any:
        return value
    if isinstance(kind, type) and issubclass(kind, Value):
        return kind.model_validate(value, loc)
    return _scalar(kind, value, loc)


def _union(options: tuple[Any, ...], value: object, loc: Loc) -> Any:
    if value is None and type(None) in options:
        return None
    errors: list[ValueInvalid] = []
    for option in options:
        if option is type(None):
            continue
        try:
            return _convert(option, value, loc)
        except ValueInvalid as exc:
            errors.append(exc)
    if len(errors) == 1:  # `X | None`: X's own error says where
        raise errors[0]
    raise ValueInvalid(loc, " or ".join(e.msg for e in errors))


def _tuple(args: tuple[Any, ...], value: object, loc: Loc) -> tuple[Any, ...]:
    if not isinstance(value, list | tuple):
        raise ValueInvalid(loc, f"expected a list, got {type(value).__name__}")
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_convert(args[0], v, (*loc, i)) for i, v in enumerate(value))
    if len(value) != len(args):
        raise ValueInvalid(loc, f"expected {len(args)} items, got {len(value)}")
    return tuple(
        _convert(a, v, (*loc, i)) for i, (a, v) in enumerate(zip(args, value, strict=True))
    )


def _dict(item: Any, value: object, loc: Loc) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueInvalid(loc, f"expected an object, got {type(value).__name__}")
    return {str(k): _convert(item, v, (*loc, str(k))) for k, v in value.items()}


def _scalar(kind: Any, value: object, loc: Loc) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif kind is str:
        if isinstance(value, str):
            return value
    elif kind is datetime:
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value)
            except ValueError:
                pass
        raise ValueInvalid(loc, f"expected an ISO 8601 time, got {value!r}")
    elif isinstance(kind, type) and issubclass(kind, Enum):
        try:
            return kind(value)
        except ValueError:
            allowed = ", ".join(repr(m.value) for m in kind)
            raise ValueInvalid(loc, f"expected one of {allowed}, got {value!r}") from None
    else:
        raise TypeError(f"no JSON rule for {kind!r}")
    raise ValueInvalid(loc, f"expected {kind.__name__}, got {type(value).__name__}")
