"""``@frozen``: a frozen dataclass that writes no code when it is defined.

``dataclasses`` compiles every method it writes with ``exec``: six for a frozen class
(``__init__``, ``__repr__``, ``__eq__``, ``__hash__``, ``__setattr__``, ``__delattr__``),
~1 ms per class, and a pass imports some 70 classes. Here five are shared functions over
the field names a class lists, and ``__init__`` is written for a class when it is first
instantiated (:func:`_init`), so defining a class costs what ``dataclasses`` spends
reading its fields. Same behaviour as ``@dataclass(frozen=True)`` for what this project
uses (keyword-only or positional fields, defaults and factories, ``__post_init__``,
``slots``, ``replace``, pickling, ``match``); no ``order``, no ``InitVar``. A test pins
it against a real frozen dataclass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform, overload

T = TypeVar("T")
MISSING: Any = dataclasses.MISSING


@overload
def frozen(cls: type[T], /) -> type[T]: ...


@overload
def frozen(*, kw_only: bool = False, slots: bool = False) -> Callable[[type[T]], type[T]]: ...


@dataclass_transform(frozen_default=True)
def frozen(
    cls: type[T] | None = None, /, *, kw_only: bool = False, slots: bool = False
) -> type[T] | Callable[[type[T]], type[T]]:
    def wrap(plain: type[T]) -> type[T]:
        for name, method in SHARED.items():
            if name not in plain.__dict__:  # a class's own method wins, as with dataclasses
                setattr(plain, name, method)
        made = dataclasses.dataclass(
            init=False, repr=False, eq=False, kw_only=kw_only, slots=slots
        )(plain)
        if slots:  # the default pickling of slots sets attributes, which __setattr__ refuses
            made.__getstate__ = _getstate  # type: ignore[method-assign]
            made.__setstate__ = _setstate  # type: ignore[attr-defined]
        listed = dataclasses.fields(made)  # type: ignore[arg-type]
        made._names = tuple(f.name for f in listed)  # type: ignore[attr-defined]
        made._compared = tuple(f.name for f in listed if f.compare)  # type: ignore[attr-defined]
        made._shown = tuple(f.name for f in listed if f.repr)  # type: ignore[attr-defined]
        return made

    return wrap if cls is None else wrap(cls)


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    """The first instance of a class writes the class's own ``__init__``, then uses it.

    Most classes a command imports are never instantiated, so none pays up front; the
    ones that are (records, specs: thousands per pass) get one as fast as a dataclass's.
    """
    cls = self.__class__
    if cls.__init__ is _init:  # not yet written for this class (a subclass inherits _init)
        cls.__init__ = _written_init(cls)
    cls.__init__(self, *args, **kwargs)


def _written_init(cls: type) -> Callable[..., None]:
    names: dict[str, Any] = {"_set": object.__setattr__, "_MISSING": MISSING}
    positional: list[str] = []
    keyword: list[str] = []
    body: list[str] = []
    for f in dataclasses.fields(cls):
        if f.default_factory is not MISSING:
            names[f"_factory_{f.name}"] = f.default_factory
            param = f"{f.name}=_MISSING"
            body.append(f"  if {f.name} is _MISSING: {f.name} = _factory_{f.name}()")
        elif f.default is not MISSING:
            names[f"_default_{f.name}"] = f.default
            param = f"{f.name}=_default_{f.name}"
        else:
            param = f.name
        (keyword if f.kw_only else positional).append(param)
        body.append(f"  _set(self, {f.name!r}, {f.name})")
    if hasattr(cls, "__post_init__"):
        body.append("  self.__post_init__()")
    params = ", ".join(["self", *positional, *(["*", *keyword] if keyword else [])])
    source = f"def __init__({params}):\n" + "\n".join(body or ["  pass"])
    exec(source, names)  # the one piece of generated code: per class, on first use
    init: Callable[..., None] = names["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    return init


def _setattr(self: Any, name: str, value: Any) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")


def _delattr(self: Any, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


def _values(self: Any, names: tuple[str, ...]) -> tuple[Any, ...]:
    return tuple(getattr(self, name) for name in names)


def _eq(self: Any, other: Any) -> object:  # bool, or NotImplemented for another class
    if other.__class__ is not self.__class__:
        return NotImplemented
    names: tuple[str, ...] = self._compared
    return _values(self, names) == _values(other, names)


def _hash(self: Any) -> int:
    return hash(_values(self, self._compared))


def _repr(self: Any) -> str:
    shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._shown)
    return f"{self.__class__.__qualname__}({shown})"


def _getstate(self: Any) -> tuple[Any, ...]:
    return _values(self, self._names)


def _setstate(self: Any, state: tuple[Any, ...]) -> None:
    for name, value in zip(self._names, state, strict=True):
        object.__setattr__(self, name, value)


SHARED: dict[str, Callable[..., Any]] = {
    "__init__": _init,
    "__setattr__": _setattr,
    "__delattr__": _delattr,
    "__eq__": _eq,
    "__hash__": _hash,
    "__repr__": _repr,
}
