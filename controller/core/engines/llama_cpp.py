"""``engine: llama-cpp``: llama.cpp's ``llama-server``.

Checked against llama.cpp's ``tools/server/README.md`` (the tree vendored by
llama-cpp-python 0.3.36, which ``scripts/build-llama-server`` builds):

* ``-m FNAME`` model file, ``--host``, ``--port``;
* ``-ngl N`` (``--n-gpu-layers``): layers offloaded to the GPU. Its default is now
  ``auto``; we pin it: 999 (every layer) when the instance holds a GPU, 0 when it holds
  none, so a CPU-only instance never touches a GPU whatever the build.
* ``GET /health``: 503 ``{"error": {"message": "Loading model"}}`` while the model
  loads, 200 ``{"status": "ok"}`` once it can serve. The default liveness probe too.
* ``--metrics``: ``GET /metrics`` in Prometheus text (``llamacpp:requests_deferred``,
  ``llamacpp:kv_cache_usage_ratio``), off by default; on, so the gateway reads the
  engine's own load (``gateway/accounting/enginemetrics.py``, ``autoscale.metric``).
* ``POST /v1/completions``: a ``completion`` probe's path (no chat template needed; the
  one model it serves answers whatever ``model`` says).
"""

from __future__ import annotations

import re

from controller.core.engines.base import (
    COMPLETIONS,
    HEALTH,
    CompletionTarget,
    HttpCheck,
    Launch,
    ReadinessChecks,
    RecipeError,
    RenderContext,
)
from controller.core.engines.owned import HOST, MODEL, PORT, refuse_flags

# `reconcile export`'s default images, one llama.cpp build (ghcr.io/ggml-org/llama.cpp):
# the `server` image is a CPU build, so an instance that holds a GPU gets the CUDA one.
# Both run /app/llama-server (their ENTRYPOINT; /app is not on PATH).
IMAGE = "ghcr.io/ggml-org/llama.cpp:server-b9628"
IMAGE_CUDA = "ghcr.io/ggml-org/llama.cpp:server-cuda-b9628"
IMAGE_EXECUTABLE = "/app/llama-server"

# Flags this recipe sets that spec.args may not set again (see owned.py). -ngl is not
# one: a partial offload (`args: [-ngl, "20"]`) is the user's to choose.
OWNED = {"--host": HOST, "--port": PORT, "-m": MODEL, "--model": MODEL}


# `Qwen/Qwen2.5-0.5B-Instruct-GGUF`: a repository of the hub, as vLLM's spec.model takes it.
# llama-server's -m takes a file; `-m owner/repo` died at every start ("failed to load").
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _hub_id(model: str) -> str:
    return (
        f"engine 'llama-cpp' takes spec.model as the path of a .gguf file, and {model!r} "
        "reads as a Hugging Face repository: pull a file of it with spec.source: "
        f'{{huggingFace: {{repo: {model}, files: ["*q4_k_m.gguf"]}}}} and leave spec.model '
        "out, or give the file's path"
    )


class LlamaCppRecipe:
    engine = "llama-cpp"
    extra_ports = 0
    deadline_seconds = 600.0  # loading weights may take minutes
    caches_prefixes = True  # slots keep their prompt's cache (and --cache-ram a pool of them)

    def launch(self, ctx: RenderContext) -> Launch:
        if not ctx.model:
            raise RecipeError("engine 'llama-cpp' needs spec.model (the path of a .gguf file)")
        if HUB_ID.match(ctx.model) and not ctx.model.lower().endswith(".gguf"):
            raise RecipeError(_hub_id(ctx.model))
        refuse_flags(self.engine, ctx.args, OWNED)
        has_gpu = ctx.gpus > 0
        argv = (
            ctx.executable or "llama-server",
            "-m",
            ctx.model,
            "--host",
            ctx.host,
            "--port",
            str(ctx.port),
            "--metrics",  # its /metrics: the queue and KV cache the gateway reads
            "-ngl",
            "999" if has_gpu else "0",
            *ctx.args,
        )
        return Launch(
            argv=argv,
            readiness=ReadinessChecks(http=(HttpCheck("/health"),)),
            liveness=HEALTH,
            completion=CompletionTarget(COMPLETIONS, ctx.model),
        )


RECIPE = LlamaCppRecipe()
