"""The state dir's secrets key: ``<state>/secrets-key`` (0600, ``privatefile.py``'s rule).

A record keeps the hash of its spec, and for a spec with ``envFrom`` that hash covers the
values' digest (``host/secrets.py``), for llama.cpp's ``--api-key-file`` the file's
(``store/sources/keyfile.py``): the digest changes when a secret does, so the engine
restarts. Unkeyed, that digest let anyone who reads the state dir try guesses of a short
secret (a password) offline against it, knowing the key names; keyed with this random
value (HMAC-SHA256), a guess cannot be checked without the key, which only the state
dir's owner reads. A pass makes it when a spec first names envFrom or a key file; ``plan``
only reads it. Removing it restarts every engine with either once (their hashes change).
"""

from __future__ import annotations

import secrets
from pathlib import Path

from controller.store.config.privatefile import PrivateFile
from controller.store.statedir import StateDir

REMEDY = "the next pass makes a new one; each engine with envFrom or a key file restarts once"


def _file(state_dir: Path) -> PrivateFile:
    return PrivateFile(StateDir(state_dir).secrets_key, "secrets key", REMEDY)


def ensure(state_dir: Path) -> bytes:
    """The key, made first when there is none (a pass)."""
    return _file(state_dir).ensure(lambda: secrets.token_hex(32)).encode()


def peek(state_dir: Path) -> bytes | None:
    """The key, or None when no pass made one yet (``plan``: nothing written)."""
    text = _file(state_dir).peek()
    return None if text is None else text.encode()
