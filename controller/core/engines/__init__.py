"""Engine recipes: one module per engine behind :class:`~controller.core.engines.base.Recipe`."""

from __future__ import annotations

import importlib
from typing import Literal

from controller.core.engines.base import (
    CompletionTarget,
    HttpCheck,
    Launch,
    ReadinessChecks,
    Recipe,
    RecipeError,
    RenderContext,
)

# engine name (as written in a manifest) -> module holding RECIPE. Imported lazily so
# `reconcile --once` pays only for the engines it runs.
MODULES: dict[str, str] = {
    "command": "controller.core.engines.command",
    "vllm": "controller.core.engines.vllm",
    "llama-cpp": "controller.core.engines.llama_cpp",
    "sglang": "controller.core.engines.sglang",
    "tgi": "controller.core.engines.tgi",
    "ollama": "controller.core.engines.ollama",
}

__all__ = [
    "MODULES",
    "CompletionTarget",
    "HttpCheck",
    "Launch",
    "ReadinessChecks",
    "Recipe",
    "RecipeError",
    "RenderContext",
    "default_affinity",
    "image_program",
    "pinned_image",
    "readiness_deadline",
    "recipe_for",
]


def recipe_for(engine: str) -> Recipe:
    try:
        module = importlib.import_module(MODULES[engine])
    except KeyError:
        raise RecipeError(f"unknown engine {engine!r}; known: {', '.join(MODULES)}") from None
    recipe: Recipe = module.RECIPE
    return recipe


def readiness_deadline(engine: str, spec_seconds: float | None) -> float:
    """Seconds an engine may take to get Ready: ``readiness.deadlineSeconds`` when the
    spec sets it, else its recipe's. The daemon kills at it and the gateway waits for it,
    both through the record (``Record.ready_deadline_seconds``), so they cannot drift."""
    return recipe_for(engine).deadline_seconds if spec_seconds is None else spec_seconds


def default_affinity(engine: str) -> Literal["none", "prefix"]:
    """The gateway's affinity for a spec that names none: ``prefix`` for an engine that
    caches prompt prefixes (sending a prompt where its beginning was served skips that
    prefill), else ``none``. An unknown engine is judged elsewhere: ``none`` here."""
    try:
        return "prefix" if recipe_for(engine).caches_prefixes else "none"
    except RecipeError:
        return "none"


def image_program(engine: str) -> str | None:
    """The program inside the recipe's pinned image where the image's PATH lacks it
    (``IMAGE_EXECUTABLE`` in its module); None: the recipe's usual program name."""
    program: str | None = getattr(
        importlib.import_module(MODULES[engine]), "IMAGE_EXECUTABLE", None
    )
    return program


def pinned_image(engine: str, *, gpu: bool) -> str:
    """The recipe's pinned image (``IMAGE`` in its module; llama.cpp's ``IMAGE_CUDA`` for
    an instance that holds a GPU). RecipeError for an engine that pins none (``command``)."""
    module = importlib.import_module(MODULES[engine])
    image: str | None = getattr(module, "IMAGE_CUDA", None) if gpu else None
    image = image or getattr(module, "IMAGE", None)
    if image is None:
        raise RecipeError(f"engine {engine!r} has no pinned image")
    return image
