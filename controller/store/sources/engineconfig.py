"""vLLM's ``--config FILE`` in ``spec.args``, read when the manifest is: the flags the
file sets that reconcile sets or reads itself.

vLLM turns each key of the YAML file into a flag (``port: 9000`` is ``--port 9000``)
and puts them after ``serve MODEL``, before the rest of the command line
(``FlexibleArgumentParser._pull_args_from_config``, v0.11.0). So the file's ``port`` and
``host`` are silently beaten by the recipe's own, and its ``served-model-name`` and
``api-key`` are never seen by the recipe, which reads ``spec.args`` for them: readiness
then waits for the wrong model id, or asks ``/v1/models`` behind the key, until the
deadline. Each is refused at load, at the file's line, as in ``spec.args`` (owned.py).

The file's bytes join the spec hash (``config_digest``), as envFrom's values do
(DESIGN.md "Secrets"): an edit of the file restarts the engine with its new flags. A file
reconcile cannot read here (a placeholder in its path, the image's own, a cluster
worker's) is the engine's alone: editing it restarts nothing (``reconcile restart``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import PurePosixPath

from controller.core.digest import sha256_hex
from controller.core.engines.owned import HOST, PORT
from controller.core.engines.spelling import as_read, spelling_of
from controller.core.manifest.specs import DeploymentSpec

FLAG = "--config"
# What each flag the file may not set is to reconcile, and where the user sets it instead.
SET = "vLLM reads the command line's after the file's, so the file's is ignored"
READ = "reconcile reads from spec.args to probe readiness, and never sees the file's"
REFUSED: dict[str, tuple[str, str]] = {
    "--host": (f"which reconcile sets from {HOST} ({SET})", "remove it from the file"),
    "--port": (f"which reconcile sets from {PORT} ({SET})", "remove it from the file"),
    "--served-model-name": (f"which {READ}", "move it to spec.args"),
    "--api-key": (f"which {READ}", "move it to spec.args"),
}
LIMIT = 1 << 20  # bytes: a flags file, never a model


def config_problem(spec: DeploymentSpec) -> tuple[int, str] | None:
    """(the index in spec.args of the flag, why) when vLLM's config file sets a flag
    of ``REFUSED`` or cannot be read here; None when there is none or it is fine."""
    found = _config_of(spec)
    if found is None:
        return None
    index, path = found
    where = PurePosixPath(path)
    if not where.is_absolute():
        return index, (
            f"spec.args gives vLLM {FLAG} {path}, a relative path: the engine reads it from "
            "its own working directory (the daemon's), so reconcile cannot check it: give "
            "the file's absolute path"
        )
    host = on_host(spec, where)
    if host is None:  # inside the image: only the engine can read it
        return None
    return _file_problem(index, path, host)


def config_digest(spec: DeploymentSpec) -> str:
    """sha256 of the --config file's bytes, read where the engine will read them; "" when
    there is none or reconcile cannot read it here (see the module's docstring)."""
    found = _config_of(spec)
    if found is None or not found[1].startswith("/"):  # config_problem said it at load
        return ""
    host = on_host(spec, PurePosixPath(found[1]))
    if host is None:
        return ""
    try:
        with open(host, "rb") as file:
            return sha256_hex(file.read(LIMIT + 1))
    except OSError:  # config_problem said it at load; gone since: the engine will say
        return ""


def _config_of(spec: DeploymentSpec) -> tuple[int, str] | None:
    """(the index in spec.args of vLLM's --config flag, its path as given), or None: no
    such flag, or a placeholder ({name}) the render fills: the engine's file to read."""
    found = _config_path(spec.args) if spec.engine == "vllm" else None
    return None if found is None or "{" in found[1] else found


def _config_path(args: Sequence[str]) -> tuple[int, str] | None:
    read = as_read("vllm", args)
    for i, arg in enumerate(read):
        if arg == FLAG and i + 1 < len(read):
            return i, args[i + 1]
        if arg.startswith(FLAG + "="):
            return i, arg.partition("=")[2]
    return None


def on_host(spec: DeploymentSpec, path: PurePosixPath) -> str | None:
    """The host's path of the engine's ``path``: itself for a process; through a bind
    mount for a container (None: the image's own file)."""
    if spec.container is None:
        return str(path)
    for volume in spec.container.volumes:
        host, inside, *_ = volume.split(":")
        if path.is_relative_to(inside):
            return str(PurePosixPath(host) / path.relative_to(inside))
    return None


def _file_problem(index: int, path: str, host: str) -> tuple[int, str] | None:
    import yaml  # only for a manifest that names such a file: a plain pass reads no YAML

    said = f"spec.args gives vLLM {FLAG} {path}"
    try:
        if not stat.S_ISREG(os.stat(host).st_mode):  # a FIFO would hang the load
            return index, f"{said}, which is not a file: give the YAML file's path"
        with open(host, "rb") as file:
            text = file.read(LIMIT + 1)
        node = yaml.compose(text[:LIMIT], Loader=yaml.SafeLoader)
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        return index, f"{said}, which reconcile cannot read ({why}): fix the path or its mode"
    except yaml.YAMLError:
        return index, f"{said}, which is no YAML (vLLM would refuse it too): fix the file"
    if len(text) > LIMIT or not isinstance(node, yaml.MappingNode):
        return index, f"{said}, which is no mapping of flags (vLLM's form): fix the file"
    for key, _ in node.value:
        if not isinstance(key, yaml.ScalarNode):
            continue
        name = f"--{key.value}"
        for flag, (why, move) in REFUSED.items():
            if spelling_of("vllm", [name], flag) is not None:
                line = key.start_mark.line + 1
                return index, f"{said}, and {path}:{line} sets {key.value}, {why}: {move}"
    return None
