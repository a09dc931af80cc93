"""``engine: vllm``: vLLM's OpenAI-compatible server (``vllm serve``).

Checked against vLLM v0.11.0 (the pinned image's tag): ``vllm/entrypoints/openai/
cli_args.py``, ``vllm/engine/arg_utils.py``, ``vllm/envs.py``, ``_get_open_port`` and
``FlexibleArgumentParser`` in ``vllm/utils/__init__.py``:

* ``vllm serve MODEL --host H --port P``; ``--tensor-parallel-size N`` splits the
  model over the N GPUs the runtime made visible (only passed when N > 1; a ``cpu``
  device is a slot of the node's inventory, no GPU to split over).
* ``VLLM_PORT`` is vLLM's *internal* port (torch.distributed's TCP store, which every
  engine opens, even with one GPU). Unset, vLLM binds port 0, reads the number, closes
  the socket and binds it again later: two engines starting together can pick the
  same one and one dies with EADDRINUSE (vllm-project/vllm#39015, #14919). We give
  each instance its own reserved port instead; vLLM starts its scan there. It is not
  the API port: never pass it to ``--port``.
* Readiness: the API socket opens only once the engine is built, ``/health`` answers
  200 while the engine loop is alive, and ``/v1/models`` lists the served model id
  (``--served-model-name`` if the user gave one, else the model argument). With
  ``--api-key`` in the args the ``/v1`` routes answer 401 to an anonymous probe, so
  only ``/health`` (never behind the key) is checked.
* Liveness (default): ``/health``; a ``completion`` probe POSTs ``/v1/completions`` for
  the served model id (no chat template needed, which base models lack).
* vLLM reads ``--served_model_name`` as ``--served-model-name`` (its parser turns a flag
  name's underscores into dashes) and ``--served-model`` or ``--api-k`` as the whole flag
  (argparse's beginnings), so ``spec.args`` is read through spelling.py before the
  recipe looks in it: such a spelling once left readiness waiting for the wrong model
  id, or probing ``/v1/models`` behind the key, until the deadline.
"""

from __future__ import annotations

from collections.abc import Sequence

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
from controller.core.engines.owned import HOST, PORT, refuse_flags
from controller.core.engines.share import share_args
from controller.core.engines.spelling import as_read, parser, spelling_of, value_of

# `reconcile export`'s default image: vLLM's own OpenAI-server image (Docker Hub
# vllm/vllm-openai; the vLLM docs' "Using Docker" page builds on this tag). A CUDA build.
# Named in full: podman refuses a short name on a host with no unqualified-search
# registries (its default), and Kubernetes takes the full name as it is.
IMAGE = "docker.io/vllm/vllm-openai:v0.11.0"

# Flags this recipe sets that spec.args may not set again (see owned.py).
OWNED = {"--host": HOST, "--port": PORT}


def as_vllm_reads(args: Sequence[str]) -> tuple[str, ...]:
    """``args`` with each flag's name spelled as vLLM reads it (spelling.py)."""
    return as_read("vllm", args)


def served_model_name(engine: str, model: str, args: Sequence[str]) -> str:
    """The id ``/v1/models`` reports: ``--served-model-name``'s first value, in any
    spelling the engine reads as it (spelling.py), else the model."""
    return value_of(engine, args, "--served-model-name") or model


class VllmRecipe:
    engine = "vllm"
    extra_ports = 1  # VLLM_PORT: torch.distributed's rendezvous port
    deadline_seconds = 600.0  # loading weights may take minutes
    caches_prefixes = True  # automatic prefix caching

    def launch(self, ctx: RenderContext) -> Launch:
        if not ctx.model:
            raise RecipeError(
                "engine 'vllm' needs spec.model (a Hugging Face id or a local model folder)"
            )
        if len(ctx.extra_ports) < self.extra_ports:
            raise RecipeError("engine 'vllm' needs 1 reserved internal port (VLLM_PORT)")
        begun = parser(self.engine).abbreviations
        refuse_flags(self.engine, as_vllm_reads(ctx.args), OWNED, abbreviated=begun)
        argv: list[str] = [
            ctx.executable or "vllm",
            "serve",
            ctx.model,
            "--host",
            ctx.host,
            "--port",
            str(ctx.port),
        ]
        if ctx.gpus > 1:
            argv += ["--tensor-parallel-size", str(ctx.gpus)]
        read = as_vllm_reads(ctx.args)  # what vLLM will make of the user's flags
        argv += share_args(self.engine, ctx.memory, ctx.devices, read)
        argv += ctx.args
        checks = [HttpCheck("/health")]
        name = served_model_name(self.engine, ctx.model, ctx.args)
        if spelling_of(self.engine, ctx.args, "--api-key") is None:
            checks.append(HttpCheck("/v1/models", contains=f'"{name}"'))
        return Launch(
            argv=tuple(argv),
            env={"VLLM_PORT": str(ctx.extra_ports[0])},
            readiness=ReadinessChecks(http=tuple(checks)),
            liveness=HEALTH,
            completion=CompletionTarget(COMPLETIONS, name),
        )


RECIPE = VllmRecipe()
