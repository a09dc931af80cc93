"""What a recipe sets itself, refused when the spec sets it again. Pure.

spec.args is appended after the recipe's flags, and every engine's parser keeps the
last of a repeated flag (argparse for vLLM and SGLang, llama.cpp's own; TGI's clap
refuses the repeat outright). So ``args: [--port, "9000"]`` moved the engine off the
port reconcile had reserved, probed and routed to: a readiness probe that could never
pass, found only at the deadline. spec.env wins over a recipe's environment the same
way (``OLLAMA_HOST``). Both are refused when the manifest is read, naming the spec field
that sets the value instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from controller.core.engines.base import RecipeError
from controller.core.engines.share import has_flag

HOST = "spec.host"
PORT = "spec.port or spec.basePort"
MODEL = "spec.model"
RESERVED = "a port or socket reserved per instance, so engines on one machine never collide"

# Where the value of each variable a recipe sets comes from.
ENV: dict[str, str] = {
    "OLLAMA_HOST": f"{HOST} and {PORT}",
    "VLLM_PORT": RESERVED,
}


def refuse_flags(
    engine: str, args: Sequence[str], owned: Mapping[str, str], *, abbreviated: bool = False
) -> None:
    """RecipeError for the first flag of ``owned`` (flag -> what sets it) in ``args``.
    ``abbreviated``: the engine's parser takes a flag's beginning for the flag (argparse's
    ``allow_abbrev``, on in vLLM's and SGLang's), so ``--por 9000`` sets ``--port``."""
    whole = [(flag, flag) for flag in owned if has_flag(args, flag)]
    # A whole flag first: SGLang's --model is an alias of its own, not --model-path begun.
    found = whole or _beginnings(owned, args, abbreviated)
    if not found:
        return
    written, flag = found[0]
    read = "" if written == flag else f" (read as {flag}: the engine takes a beginning)"
    raise RecipeError(
        f"spec.args sets {written}{read}, which engine {engine!r} sets itself from "
        f"{owned[flag]} (the last {flag} wins, so probes and the gateway would look "
        f"elsewhere): remove it from spec.args"
    )


def _beginnings(
    owned: Mapping[str, str], args: Sequence[str], abbreviated: bool
) -> list[tuple[str, str]]:
    """(written, flag) for each of ``args`` that is a shorter beginning of an owned flag
    (``--por`` of ``--port``), when the engine reads one so."""
    if not abbreviated:
        return []
    names = [arg.partition("=")[0] for arg in args if arg.startswith("--") and len(arg) > 2]
    return [(n, flag) for n in names for flag in owned if flag.startswith(n) and n != flag]


def refuse_env(engine: str, env: Mapping[str, str], recipe_env: Mapping[str, str]) -> None:
    """RecipeError for a variable of ``env`` (spec.env) that the recipe sets itself."""
    for name in sorted(set(env) & set(recipe_env)):
        source = ENV.get(name, "its own settings")
        raise RecipeError(
            f"spec.env sets {name}, which engine {engine!r} sets itself from {source}: "
            f"remove it from spec.env"
        )
