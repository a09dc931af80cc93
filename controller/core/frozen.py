"""``@frozen``: a frozen dataclass whose ``__eq__``, ``__hash__`` and ``__repr__`` are shared.

``dataclasses`` compiles each method it writes with ``exec``, six for a frozen class, and
a pass imports some 70 classes: ~1 ms each of every verb's start-up. Three of the six
(equality, hash, repr) read the same for every class, so they are written once, here,
over the field names the class lists; ``dataclasses`` still writes ``__init__`` and the
two frozen setters. Same semantics as ``@dataclass(frozen=True)``; no ``order``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform, overload

T = TypeVar("T")


@overload
def frozen(cls: type[T], /) -> type[T]: ...


@overload
def frozen(*, kw_only: bool = False, slots: bool = False) -> Callable[[type[T]], type[T]]: ...


@dataclass_transform(frozen_default=True)
def frozen(
    cls: type[T] | None = None, /, *, kw_only: bool = False, slots: bool = False
) -> type[T] | Callable[[type[T]], type[T]]:
    def wrap(plain: type[T]) -> type[T]:
        made = dataclasses.dataclass(
            frozen=True, eq=False, repr=False, kw_only=kw_only, slots=slots
        )(plain)
        listed = dataclasses.fields(made)  # type: ignore[arg-type]
        made._compared = tuple(f.name for f in listed if f.compare)  # type: ignore[attr-defined]
        made._shown = tuple(f.name for f in listed if f.repr)  # type: ignore[attr-defined]
        made.__eq__ = _eq  # type: ignore[assignment,method-assign]
        made.__hash__ = _hash  # type: ignore[method-assign]
        made.__repr__ = _repr  # type: ignore[method-assign]
        return made

    return wrap if cls is None else wrap(cls)


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
