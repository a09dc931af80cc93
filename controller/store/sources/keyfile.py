"""llama.cpp's ``--api-key-file FILE`` in ``spec.args``, read when the manifest is: the
first key, which reconcile's probes present (core/engines/apikey.py).

llama-server reads the file at its start (``common/arg.cpp``): each non-empty line is a
key, and any one of them is accepted. An engine given only the file answered 401 to every
``completion`` probe, which presented no key. A file reconcile cannot read here is an
error at the flag's line, as vLLM's ``--config`` is (engineconfig.py); one it may not
read (a placeholder in its path, the image's own) is the engine's alone, and its probes
go without. The key is never in a message.

The file's bytes join the spec hash as envFrom's values do (DESIGN.md "Secrets"): an
edit restarts the engine, which reads the file only at its start (before, its probes
presented the new key to an engine holding the old one, were refused, and liveness
restarted it as "not live"). Their digest is keyed, as envFrom's (``digest``): a record's
hash lets no one check a guess at a short key.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from pathlib import PurePosixPath

from controller.core.digest import sha256_hex
from controller.core.engines.spelling import value_of
from controller.core.manifest.specs import DeploymentSpec
from controller.store.sources.engineconfig import on_host

FLAG = "--api-key-file"
LIMIT = 1 << 16  # bytes: a few keys, never a model


def key_file_problem(spec: DeploymentSpec) -> tuple[int, str] | None:
    """(the index in spec.args of the flag, why) when llama.cpp's key file cannot be
    read here; None when there is none, it is readable, or it is the engine's alone."""
    found = _key_file(spec)
    if found is None:
        return None
    index, path, host = found
    said = f"spec.args gives llama.cpp {FLAG} {path}"
    if not PurePosixPath(path).is_absolute():
        return index, (
            f"{said}, a relative path: the engine reads it from its own working directory "
            "(the daemon's), so reconcile cannot read the key its probes present: give "
            "the file's absolute path"
        )
    if host is None:
        return None
    try:
        if not stat.S_ISREG(os.stat(host).st_mode):  # a FIFO would hang the load
            return index, f"{said}, which is not a file: give the key file's path"
        with open(host, "rb"):
            pass
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        return index, f"{said}, which reconcile cannot read ({why}): fix the path or its mode"
    return None


def key_file_bytes(spec: DeploymentSpec) -> bytes | None:
    """The file's bytes (at most LIMIT), read once where the engine will read them; None
    when there is none or reconcile cannot read it here (key_file_problem said so at load).
    An empty file is b"": a key written into it later is a change."""
    found = _key_file(spec)
    if found is None or found[2] is None or not found[1].startswith("/"):
        return None
    try:
        with open(found[2], "rb") as file:
            return file.read(LIMIT)
    except OSError:
        return None


def first_key(data: bytes) -> str:
    """The file's first key, as llama-server reads it ("": none)."""
    for line in data.decode("utf-8", "replace").split("\n"):
        if line:  # std::getline: a line as written, the empty ones skipped
            return line
    return ""


def digest(data: bytes, key: bytes | None) -> str:
    """What the spec hash takes in of the file: HMAC-SHA256 under the state dir's secrets
    key (None: a preview before any pass made one, whose hash no record holds)."""
    if key is None:
        return sha256_hex(data)
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def _key_file(spec: DeploymentSpec) -> tuple[int, str, str | None] | None:
    """(the flag's index in spec.args, the engine's path, the host's path or None)."""
    if spec.engine != "llama-cpp":
        return None
    path = value_of("llama-cpp", spec.args, FLAG)
    if path is None or "{" in path:  # a placeholder ({name}) the render fills
        return None
    index = max(i for i, arg in enumerate(spec.args) if arg.partition("=")[0] == FLAG)
    host = on_host(spec, PurePosixPath(path)) if path.startswith("/") else None
    return index, path, host
