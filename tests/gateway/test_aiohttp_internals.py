"""What the gateway takes from aiohttp's internals (controller/gateway/http/aiohttp_internals.py)
is all there on the installed aiohttp, and none of our own names on its connection handler
lands on one of aiohttp's: the check to run before raising pyproject's cap on aiohttp."""

from __future__ import annotations

import types
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from controller.gateway.http.aiohttp_internals import FIELDS, METHODS, Handler, missing
from controller.gateway.http.server import Protocol

NEXT_MOVE = (
    "controller/gateway/http/aiohttp_internals.py relies on it: adapt that module "
    "(and server.py) to this aiohttp before raising its cap in pyproject.toml"
)


def test_the_installed_aiohttp_has_every_internal_the_gateway_touches() -> None:
    lacking = missing()
    assert not lacking, "\n".join([*lacking, NEXT_MOVE])


def test_an_aiohttp_without_a_field_or_parameter_we_use_is_named() -> None:
    """A stand-in for a newer aiohttp: the in-progress flag gone, handle_error without
    ``exc``. Both are named, with the version."""

    class Newer(RequestHandler):
        @property
        def _request_in_progress(self) -> bool:
            raise AttributeError("_request_in_progress")

        @_request_in_progress.setter
        def _request_in_progress(self, value: bool) -> None:
            pass  # kept elsewhere, as a newer aiohttp might

        def handle_error(  # type: ignore[override]
            self, request: web.BaseRequest, status: int = 500
        ) -> web.StreamResponse:
            return web.Response(status=status)

    lacking = missing(Newer)
    assert any("Newer._request_in_progress (a field read)" in line for line in lacking)
    assert any("Newer.handle_error(..., exc=...)" in line for line in lacking)
    assert all(line.startswith("aiohttp 3.") for line in lacking)


def test_our_names_on_the_handler_are_none_of_aiohttps() -> None:
    """Protocol and Handler add fields and methods to a class aiohttp owns (with
    ``__slots__``): one that aiohttp also defines would silently replace its own."""
    clashes = []
    for kind in (Handler, Protocol):
        for name, value in vars(kind).items():
            # dunders, and the overrides aiohttp_internals.METHODS declares, are meant
            if not name.startswith("__") and name not in METHODS and hasattr(RequestHandler, name):
                clashes.append(f"{kind.__name__}.{name} (a method)")
            clashes += [
                f"{kind.__name__}.{name} uses self.{field}"
                for field in _fields_used(value)
                if field not in FIELDS and hasattr(RequestHandler, field)
            ]
    assert not clashes, "\n".join([*clashes, "rename ours: aiohttp defines the same name"])


def _fields_used(value: Any) -> list[str]:
    """The private names a function's code uses (``self._x``, besides globals)."""
    code = getattr(value, "__code__", None)
    if not isinstance(code, types.CodeType):
        return []
    return [n for n in code.co_names if n.startswith("_") and not n.startswith("__")]
