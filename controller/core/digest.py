"""sha256 without OpenSSL: ``hashlib`` loads libcrypto (~3.7 MB resident for the daemon's
whole life, ~5 ms at start-up) for a hash CPython also builds in. Same digests."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def _builtin() -> Callable[[bytes], Any]:
    for name in ("_sha2", "_sha256"):  # CPython 3.12+, then 3.11
        try:
            return importlib.import_module(name).sha256  # type: ignore[no-any-return]
        except ImportError:
            continue
    import hashlib  # a Python built without them

    return hashlib.sha256


_sha256 = _builtin()


def sha256_hex(data: bytes) -> str:
    return str(_sha256(data).hexdigest())
