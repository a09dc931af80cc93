"""``engine: ollama``: ``ollama serve`` on its own address.

Checked against Ollama's docs (FAQ "How do I configure Ollama server?", API reference)
and server code:

* ``ollama serve`` takes no flags for its address: ``OLLAMA_HOST=host:port`` sets it
  (IPv6 hosts in brackets).
* ``GET /`` answers 200 with the text ``Ollama is running`` once the server listens.
* ``ollama serve`` never pulls a model: weights come from ``ollama pull`` into the model
  store (``OLLAMA_MODELS``, shared by every server of the user). So when ``spec.model``
  is set, the deployment is Ready only once ``GET /api/tags`` lists that model (a name
  without a tag means ``:latest``, as Ollama itself reads it): "Ready" then means "can
  serve the model the manifest names", and a model that was never pulled fails the
  readiness deadline with a probe message instead of looking healthy. Without
  ``spec.model`` only the server is checked. ``serve`` loads no weights at start, so the
  default deadline is short (120 s).
* Liveness (default): ``GET /`` (``Ollama is running``); a ``completion`` probe POSTs
  ``/v1/chat/completions`` for ``spec.model`` (Ollama's OpenAI-compatible API).
"""

from __future__ import annotations

from controller.core.engines.base import (
    CHAT,
    CompletionTarget,
    HttpCheck,
    Launch,
    ReadinessChecks,
    RenderContext,
)

# `reconcile export`'s default image (Docker Hub ollama/ollama: CPU and NVIDIA; AMD
# needs the `-rocm` variant, which the user names in spec.image).
IMAGE = "docker.io/ollama/ollama:0.18.2"


def ollama_host(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def model_tag(model: str) -> str:
    """``llama3`` -> ``llama3:latest``; ``llama3:8b`` and ``hf.co/u/r:Q4_K_M`` unchanged."""
    last = model.rsplit("/", 1)[-1]
    return model if ":" in last else f"{model}:latest"


class OllamaRecipe:
    engine = "ollama"
    extra_ports = 0
    deadline_seconds = 120.0  # `serve` loads no weights at start
    caches_prefixes = False  # one model per request, its own scheduling

    def launch(self, ctx: RenderContext) -> Launch:
        running = HttpCheck("/", contains="Ollama is running")
        checks = [running]
        if ctx.model:
            # /api/tags is compact JSON: {"models":[{"name":"llama3:latest",...}]}
            checks.append(HttpCheck("/api/tags", contains=f'"{model_tag(ctx.model)}"'))
        return Launch(
            argv=(ctx.executable or "ollama", "serve", *ctx.args),
            env={"OLLAMA_HOST": ollama_host(ctx.host, ctx.port)},
            readiness=ReadinessChecks(http=tuple(checks)),
            liveness=ReadinessChecks(http=(running,)),
            completion=CompletionTarget(CHAT, model_tag(ctx.model) if ctx.model else ""),
        )


RECIPE = OllamaRecipe()
