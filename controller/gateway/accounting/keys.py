"""API keys: one per line, ``#`` comments; compared in constant time, never logged.

A key may be followed by its limits, whitespace apart: ``rpm=N`` (requests a minute),
``tpm=N`` (tokens a minute, prompt and completion, as the engines' ``usage`` says)::

    sk-team-a-...   rpm=60 tpm=100000
    sk-batch-...    tpm=2000000
    sk-admin-...

A key is known to logs and metrics only by its label: the first 8 hex characters of
its SHA-256 (short, not reversible).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from controller.errors import ConfigError
from controller.store.sources import security


class KeyFileError(ConfigError):
    """The key file is missing, empty or readable by others: refused at start (exit 64)."""


LIMIT_NAMES = ("rpm", "tpm")


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """Per minute, None for no limit."""

    rpm: int | None = None
    tpm: int | None = None


@dataclass(frozen=True, slots=True)
class Keys:
    digests: tuple[tuple[bytes, str], ...]  # (sha256 of the key, its label: the hex's head)
    limits: dict[str, KeyLimits] = field(default_factory=dict)  # label -> its limits, if any

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
        text = path.read_text(encoding="utf-8-sig")  # an editor's BOM is not the key's
    except FileNotFoundError:
        raise KeyFileError(f"--api-keys {path}: no such file") from None
    except IsADirectoryError:
        raise KeyFileError(f"--api-keys {path} is a folder: give the key file in it") from None
    except OSError as exc:  # its strerror: the exception's text repeats the path
        raise KeyFileError(f"--api-keys {path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise KeyFileError(
            f"--api-keys {path}: byte {exc.start} is not UTF-8 text: the file holds the "
            "keys as text, one a line"
        ) from None
    owner = security.path_problem(path) if security.strict() else None
    if owner is not None:  # the manifests' rule: as root, only root decides who gets in
        raise KeyFileError(
            f"--api-keys {path} is {owner}: whoever owns it decides who may use this "
            f"gateway (run: chown root {path})"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise KeyFileError(
            f"--api-keys {path} has mode {mode:04o}: group and others must have no access "
            f"(run: chmod 600 {path})"
        )
    digests: list[tuple[bytes, str]] = []
    limits: dict[str, KeyLimits] = {}
    first_line: dict[bytes, int] = {}  # digest -> the line that gave it first
    for number, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts or parts[0].startswith("#"):
            continue
        key, *fields = parts
        where = f"--api-keys {path} line {number}"
        if not _sendable(key):
            raise KeyFileError(
                f"{where}: the key holds a character no HTTP header carries (a letter "
                "with an accent, a symbol, a control character: headers are ASCII), so "
                "no client could present it; use ASCII letters, digits and punctuation"
            )
        digest = hashlib.sha256(key.encode()).digest()
        label = digest.hex()[:8]
        said = _limits(fields, where) if fields else KeyLimits()
        if digest in first_line:
            # A line pasted twice was taken before, and is still: one key, nothing to
            # guess. Two lines, one key, other limits: whose hold would be a guess.
            if limits.get(label, KeyLimits()) == said:
                continue
            raise KeyFileError(
                f"{where}: the same key as line {first_line[digest]} with other limits "
                "(keep one line per key, with its limits on it)"
            )
        first_line[digest] = number
        digests.append((digest, label))
        if fields:
            limits[label] = said
    if not digests:
        raise KeyFileError(f"--api-keys {path} holds no key (one per line, # for comments)")
    return Keys(digests=tuple(digests), limits=limits)


def _sendable(key: str) -> bool:
    """Printable ASCII alone: a request's headers come as latin-1 text, so a key with any
    other character (hashed here as UTF-8) could never match what a client sends."""
    return all("!" <= char <= "~" for char in key)


def _limits(fields: list[str], where: str) -> KeyLimits:
    """``rpm=N tpm=N`` after a key (the key itself is never quoted in an error)."""
    found: dict[str, int] = {}
    for text in fields:
        if text.startswith("#"):
            break  # a comment after the limits
        name, _, value = text.partition("=")
        if name not in LIMIT_NAMES or not value.isdigit() or int(value) <= 0:
            # Never quoted: a key pasted with a space in it would be echoed in the log.
            what = f"{name}=" if name in LIMIT_NAMES else "the text"
            raise KeyFileError(
                f"{where}: {what} after the key is not a limit "
                "(expected rpm=N and/or tpm=N, whole numbers above 0)"
            )
        if name in found:  # `rpm=5 rpm=6`: which one was meant is a guess
            raise KeyFileError(f"{where}: {name}= is given twice after the key (keep one)")
        found[name] = int(value)
    return KeyLimits(rpm=found.get("rpm"), tpm=found.get("tpm"))


def presented(authorization: str | None, x_api_key: str | None) -> str | None:
    """The key a request carries: ``Authorization: Bearer <key>`` or ``x-api-key``."""
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return x_api_key.strip() if x_api_key else None
