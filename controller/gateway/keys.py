"""API keys: one per line, ``#`` comments; compared in constant time, never logged.

A key is known to logs and metrics only by its label: the first 8 hex characters of
its SHA-256 (short, not reversible).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from controller.errors import ConfigError


class KeyFileError(ConfigError):
    """The key file is missing, empty or readable by others: refused at start (exit 64)."""


@dataclass(frozen=True, slots=True)
class Keys:
    digests: tuple[tuple[bytes, str], ...]  # (sha256 of the key, its label: the hex's head)

    def match(self, presented: str | None) -> str | None:
        """The label of the key presented, or None. Every key is compared (no early exit)."""
        if not presented:
            return None
        digest = hashlib.sha256(presented.encode()).digest()
        found = None
        for known, name in self.digests:
            if hmac.compare_digest(digest, known):
                found = name
        return found


def load(path: Path) -> Keys:
    try:
        info = os.stat(path)
        text = path.read_text()
    except FileNotFoundError:
        raise KeyFileError(f"--api-keys {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"--api-keys {path}: cannot read: {exc}") from None
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise KeyFileError(
            f"--api-keys {path} has mode {mode:04o}: group and others must have no access "
            f"(run: chmod 600 {path})"
        )
    keys = [line.strip() for line in text.splitlines()]
    keys = [k for k in keys if k and not k.startswith("#")]
    if not keys:
        raise KeyFileError(f"--api-keys {path} holds no key (one per line, # for comments)")
    hashed = [hashlib.sha256(k.encode()).digest() for k in keys]
    return Keys(digests=tuple((digest, digest.hex()[:8]) for digest in hashed))


def presented(authorization: str | None, x_api_key: str | None) -> str | None:
    """The key a request carries: ``Authorization: Bearer <key>`` or ``x-api-key``."""
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return x_api_key.strip() if x_api_key else None
