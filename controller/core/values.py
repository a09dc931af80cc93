"""Frozen dataclasses that read and write their own JSON, checked against their fields.

Records and manifests alike: pydantic (~100 ms to import, ~10 MB resident) would cost
every pass and the daemon more than the manifests it checks. The checks are a schema's:
each field's type (``int``, ``float``, ``str``, ``bool``, ``None``, ``datetime`` as
ISO 8601, a ``StrEnum``, a ``Literal``, ``tuple[...]``, ``dict[K, V]``, a nested value),
no unknown fields, no missing required ones, and the bounds a :class:`Rule` puts on a
type (``Annotated[int, Rule(ge=1)]``). Every error is reported with its path, in
pydantic's words (users and tests know them). A class sets ``CAMEL`` to read and write
camelCase keys (``basePort``), and ``LAX`` to take numbers written as strings, as the
manifests always have.
"""

from __future__ import annotations

import dataclasses
import json
import operator
import types
import typing
from collections.abc import Callable, Iterable
from datetime import datetime
from enum import Enum
from typing import Any, ClassVar, Self, TypeVar

Loc = tuple[str | int, ...]
N = TypeVar("N", int, float)
Problem = tuple[Loc, str]


class ValueInvalid(ValueError):
    """A document that does not fit a value's fields: where (a path) and what, each."""

    def __init__(self, loc: Loc, msg: str, more: Iterable[Problem] = ()) -> None:
        self.errors: list[Problem] = [(loc, msg), *more]
        super().__init__("; ".join(f"{dotted(p) or '(top)'}: {m}" for p, m in self.errors))
        self.loc = loc
        self.msg = msg

    @classmethod
    def of(cls, problems: list[Problem]) -> ValueInvalid:
        return cls(*problems[0], problems[1:])


def dotted(loc: Loc) -> str:
    return ".".join(str(p) for p in loc)


# eq=False: hashed by identity (typing hashes Annotated metadata; `accepts` is a dict)
@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class Rule:
    """What a field takes beyond its type: ``Annotated[int, Rule(ge=0, le=64)]``."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    min_length: int | None = None
    max_length: int | None = None
    strict: bool = False  # numbers: no strings, even in a LAX value
    before: Callable[[Any], Any] | None = None  # on the raw input: YAML's 8192 -> "8192"
    check: Callable[[Any], Any] | None = None  # on the typed value; ValueError = invalid
    accepts: dict[str, Any] | None = None  # the JSON Schema of what `before` takes


class Value:
    """The base of the frozen dataclasses: pydantic's few methods we use."""

    __slots__ = ()
    CAMEL: ClassVar[bool] = False  # keys are camelCase in documents
    LAX: ClassVar[bool] = False  # "8080" is a valid int (pydantic's lax mode)

    def model_copy(self, *, update: dict[str, Any] | None = None) -> Self:
        """A copy with ``update`` applied (not checked, as pydantic's is not)."""
        return dataclasses.replace(self, **(update or {}))  # type: ignore[type-var]

    def model_dump(self, *, by_alias: bool = False) -> dict[str, Any]:
        dumped = dump(self, by_alias)
        assert isinstance(dumped, dict)
        return dumped

    def model_dump_json(self, *, indent: int | None = None) -> str:
        return json.dumps(self.model_dump(), indent=indent)

    @classmethod
    def model_validate(cls, data: object, loc: Loc = ()) -> Self:
        made: Self = read(cls, data, loc, cls.LAX)
        return made

    @classmethod
    def model_validate_json(cls, raw: str | bytes) -> Self:
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise ValueInvalid((), f"not JSON: {exc}") from exc
        return cls.model_validate(data)


def to_camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


FieldTable = dict[str, tuple[str, Any, "dataclasses.Field[Any]"]]
_tables: dict[type, FieldTable] = {}


def fields_of(cls: type[Value]) -> FieldTable:
    """key in documents -> (attribute, type with its Annotated rules, the field)."""
    table = _tables.get(cls)
    if table is None:
        hints = typing.get_type_hints(cls, include_extras=True)
        table = {
            (to_camel(f.name) if cls.CAMEL else f.name): (f.name, hints[f.name], f)
            for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        }
        _tables[cls] = table
    return table


def required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def dump(value: object, by_alias: bool) -> object:
    """A value (or a default: a tuple, a dict...) as JSON types, keys camelCase if asked."""
    if isinstance(value, Value):
        return {
            key if by_alias else name: dump(getattr(value, name), by_alias)
            for key, (name, _, _) in fields_of(type(value)).items()
        }
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, tuple | list):
        return [dump(v, by_alias) for v in value]
    if isinstance(value, dict):
        return {k: dump(v, by_alias) for k, v in value.items()}
    return value


Convert = Callable[[object, Loc], Any]
_converters: dict[tuple[Any, bool], Convert] = {}
_plans: dict[tuple[type, bool], list[tuple[str, str, Convert, bool]]] = {}


def converter(kind: Any, lax: bool) -> Convert:
    """The check of one type, worked out once per (type, lax) and reused by every document."""
    made = _converters.get((kind, lax))
    if made is None:
        made = _converters[(kind, lax)] = _compile(kind, lax)
    return made


def _compile(kind: Any, lax: bool) -> Convert:
    origin = typing.get_origin(kind)
    args = typing.get_args(kind)
    if origin is typing.Annotated:
        return _ruled(args[0], [r for r in args[1:] if isinstance(r, Rule)], lax)
    if origin in (types.UnionType, typing.Union):
        return _union(args, lax)
    if origin is typing.Literal:
        return lambda value, loc: _literal(args, value, loc)
    if origin is tuple:
        return _sequence(args, lax)
    if origin is dict:
        return _mapping(converter(args[0], lax), converter(args[1], lax))
    if kind is Any:
        return lambda value, loc: value
    if isinstance(kind, type) and issubclass(kind, Value):
        return lambda value, loc: read(kind, value, loc, lax)
    if kind is str:  # the most common by far: checked without a call to _scalar
        return lambda value, loc: value if type(value) is str else _scalar(str, value, loc, lax)
    if kind in (int, float):  # an exact int (or float) as it is; the rest by the rules
        return lambda value, loc: value if type(value) is kind else _scalar(kind, value, loc, lax)
    if kind in (bool, datetime) or (isinstance(kind, type) and issubclass(kind, Enum)):
        return lambda value, loc: _scalar(kind, value, loc, lax)
    raise TypeError(f"no JSON rule for {kind!r}")


def read(cls: type[Any], data: object, loc: Loc, lax: bool) -> Any:
    """A value of ``cls`` from a document, or ValueInvalid listing every problem."""
    if not isinstance(data, dict):
        raise ValueInvalid(
            loc, f"Input should be an object (a mapping of fields), not {_kind(data)}"
        )
    plan = _plans.get((cls, lax))
    if plan is None:
        plan = _plans[(cls, lax)] = [
            (key, name, converter(kind, lax), required(f))
            for key, (name, kind, f) in fields_of(cls).items()
        ]
    table = fields_of(cls)
    problems: list[Problem] = [
        ((*loc, str(k)), "Extra inputs are not permitted") for k in data if k not in table
    ]
    values: dict[str, Any] = {}
    for key, name, convert, needed in plan:
        if key not in data:
            if needed:
                problems.append(((*loc, key), "Field required"))
            continue
        try:
            values[name] = convert(data[key], (*loc, key))
        except ValueInvalid as exc:
            problems.extend(exc.errors)
    if problems:
        raise ValueInvalid.of(problems)
    try:
        return cls(**values)
    except ValueInvalid as exc:  # a value's own check (__post_init__): where it sits
        raise ValueInvalid.of([((*loc, *p), m) for p, m in exc.errors]) from None


def _ruled(base: Any, rules: list[Rule], lax: bool) -> Convert:
    convert = converter(base, lax and not any(r.strict for r in rules))
    befores = [r.before for r in rules if r.before is not None]

    def check(value: object, loc: Loc) -> Any:
        for before in befores:
            try:
                value = before(value)
            except ValueError as exc:
                raise ValueInvalid(loc, str(exc)) from None
        converted = convert(value, loc)
        for rule in rules:
            _bounds(rule, converted, loc)
            if rule.check is not None:
                try:
                    converted = rule.check(converted)
                except ValueError as exc:
                    raise ValueInvalid(loc, str(exc)) from None
        return converted

    return check


def _union(options: tuple[Any, ...], lax: bool) -> Convert:
    takes_none = type(None) in options
    converts = [converter(o, lax) for o in options if o is not type(None)]

    def check(value: object, loc: Loc) -> Any:
        if value is None and takes_none:
            return None
        errors: list[ValueInvalid] = []
        for convert in converts:
            try:
                return convert(value, loc)
            except ValueInvalid as exc:
                errors.append(exc)
        if len(errors) == 1:  # `X | None`: X's own error says where
            raise errors[0]
        raise ValueInvalid(loc, " or ".join(e.msg for e in errors))

    return check


def _sequence(args: tuple[Any, ...], lax: bool) -> Convert:
    each = converter(args[0], lax) if len(args) == 2 and args[1] is Ellipsis else None
    fixed = [converter(a, lax) for a in args] if each is None else []

    def check(value: object, loc: Loc) -> tuple[Any, ...]:
        if not isinstance(value, list | tuple):
            raise ValueInvalid(loc, f"Input should be a valid list, not {_kind(value)}")
        if each is None and len(value) != len(fixed):
            raise ValueInvalid(loc, f"Input should have {len(fixed)} items, not {len(value)}")
        converts = [each] * len(value) if each is not None else fixed
        out: list[Any] = []
        problems: list[Problem] = []
        for i, (convert, item) in enumerate(zip(converts, value, strict=True)):
            try:
                out.append(convert(item, (*loc, i)))
            except ValueInvalid as exc:
                problems.extend(exc.errors)
        if problems:
            raise ValueInvalid.of(problems)
        return tuple(out)

    return check


def _mapping(key: Convert, item: Convert) -> Convert:
    def check(value: object, loc: Loc) -> dict[Any, Any]:
        if not isinstance(value, dict):
            raise ValueInvalid(loc, f"Input should be a valid dictionary, not {_kind(value)}")
        out: dict[Any, Any] = {}
        problems: list[Problem] = []
        for k, v in value.items():
            where = (*loc, str(k))
            try:
                out[key(k, where)] = item(v, where)
            except ValueInvalid as exc:
                problems.extend(exc.errors)
        if problems:
            raise ValueInvalid.of(problems)
        return out

    return check


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _number(n: float) -> str:
    return str(int(n)) if float(n).is_integer() else str(n)


def _bounds(rule: Rule, value: Any, loc: Loc) -> None:
    if value is None:
        return
    checks = (
        (rule.ge, operator.ge, "greater than or equal to"),
        (rule.gt, operator.gt, "greater than"),
        (rule.le, operator.le, "less than or equal to"),
        (rule.lt, operator.lt, "less than"),
    )
    for bound, holds, words in checks:
        if bound is not None and not holds(value, bound):
            raise ValueInvalid(loc, f"Input should be {words} {_number(bound)}")
    if rule.max_length is not None and len(value) > rule.max_length:
        raise ValueInvalid(loc, f"String should have at most {rule.max_length} characters")
    if rule.min_length is not None and len(value) < rule.min_length:
        s = "" if rule.min_length == 1 else "s"
        raise ValueInvalid(loc, f"String should have at least {rule.min_length} character{s}")


def _literal(allowed: tuple[Any, ...], value: object, loc: Loc) -> Any:
    if any(value == a and type(value) is type(a) for a in allowed):
        return value
    raise ValueInvalid(loc, f"Input should be {_choices(allowed)}")


def _choices(allowed: Iterable[object]) -> str:
    words = [repr(a) for a in allowed]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


TRUE = frozenset({"true", "yes", "on", "1", "t", "y"})
FALSE = frozenset({"false", "no", "off", "0", "f", "n"})


def _scalar(kind: Any, value: object, loc: Loc, lax: bool) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
        if lax and isinstance(value, str) and value.lower() in TRUE | FALSE:
            return value.lower() in TRUE
        if lax and type(value) is int and value in (0, 1):  # pydantic's lax mode took them
            return bool(value)
        raise ValueInvalid(loc, "Input should be a valid boolean")
    if kind is int:
        return _int(value, loc, lax)
    if kind is float:
        return _float(value, loc, lax)
    if kind is str:
        if isinstance(value, str):
            return value
        raise ValueInvalid(loc, "Input should be a valid string")
    if kind is datetime:
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value)
            except ValueError:
                pass
        raise ValueInvalid(loc, f"Input should be an ISO 8601 time, not {value!r}")
    if isinstance(kind, type) and issubclass(kind, Enum):
        try:
            return kind(value)
        except ValueError:
            raise ValueInvalid(loc, f"Input should be {_choices(m.value for m in kind)}") from None
    raise TypeError(f"no JSON rule for {kind!r}")


def _int(value: object, loc: Loc, lax: bool) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if lax and isinstance(value, float) and value.is_integer():
        return int(value)
    number = _from_text(int, value, lax)
    if number is None:
        raise ValueInvalid(loc, "Input should be a valid integer")
    return number


def _float(value: object, loc: Loc, lax: bool) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    number = _from_text(float, value, lax)
    if number is None:
        raise ValueInvalid(loc, "Input should be a valid number")
    return number


def _from_text(parse: Callable[[str], N], value: object, lax: bool) -> N | None:
    """A number written as a string ("8080"), taken in a LAX value; None if not one."""
    if lax and isinstance(value, str):
        try:
            return parse(value.strip())
        except ValueError:
            return None
    return None
