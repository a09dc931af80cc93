"""The API key an engine demands of its clients, read as the engine reads it. Pure.

reconcile's own readiness and liveness probes present it (``Authorization: Bearer``):
an engine given a key answers 401 to an anonymous completion, or GET of a path behind
the key, and would never get Ready. Checked against each engine's sources:

* vLLM: ``--api-key`` (any spelling its parser reads as it), else ``VLLM_API_KEY``.
* SGLang: ``--api-key`` only.
* llama.cpp: ``--api-key`` (comma-separated keys: any one will do), else
  ``LLAMA_API_KEY`` (its flag's environment twin, read only where the flag is not given),
  else the first key of ``--api-key-file`` (one key a line; every key of the file and
  the flag is accepted), which the loader reads on the host (store/sources/keyfile.py).
* TGI (v3.3.5): the launcher's ``--api-key`` (clap's ``long, env``: ``API_KEY`` where the
  flag is not given), passed to the router, which keeps ``/generate``,
  ``/v1/completions`` and ``/v1/chat/completions`` behind it and leaves ``/health``,
  ``/info``, ``/metrics`` and ``/v1/models`` public (``router/src/server.rs``).

The key is found where a probe is made, never kept: no record holds it (DESIGN.md
"Secrets"). A pass finds it from the entry it loaded (its args, its env over envFrom's
values, its key file's first key, all in memory: reconciler/probekeys.py); what has only
a record (the gateway, a record whose manifest is gone or changed) finds it with
:func:`document_key` from the record's spec document, which holds the args and env as
the manifest spelled them and nothing read from a file (docs/design.md, "API keys").
Imports no pydantic: the gateway process asks it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from controller.core.engines.spelling import value_of

FLAG = "--api-key"
KEYED = frozenset({"vllm", "sglang", "llama-cpp", "tgi"})
ENV: dict[str, str] = {"vllm": "VLLM_API_KEY", "llama-cpp": "LLAMA_API_KEY", "tgi": "API_KEY"}


def api_key(engine: str, args: Sequence[str], env: Mapping[str, str], file_key: str = "") -> str:
    """The key a client of ``engine`` must present ("": none, or none reconcile knows).
    ``file_key``: the first key of llama.cpp's ``--api-key-file``, as the loader read it."""
    if engine not in KEYED:
        return ""
    key = value_of(engine, args, FLAG)
    if key is None and engine in ENV:
        key = env.get(ENV[engine])
    if engine == "llama-cpp" and key:
        key = key.split(",")[0]
    if engine == "llama-cpp" and not key:
        key = file_key
    return key or ""


def document_key(document: Mapping[str, Any]) -> str:
    """The key a record's spec document gives: its args and env alone (a key from envFrom
    or a key file was never written there)."""
    engine, args, env = document.get("engine"), document.get("args"), document.get("env")
    if not isinstance(engine, str) or not isinstance(args, list) or not isinstance(env, dict):
        return ""
    return api_key(engine, [str(a) for a in args], {str(k): str(v) for k, v in env.items()})
