"""``engine: sglang``: SGLang's server (``python -m sglang.launch_server``).

Checked against SGLang 0.5.19 (the release of the pinned image): ``server_args.py``
(``ServerArgs``, ``PortArgs.init_new``) and ``entrypoints/http_server.py`` under
``python/sglang/srt/``:

* ``--model-path M --host H --port P``; ``--tp-size N`` (alias ``--tensor-parallel-size``)
  when the instance holds N > 1 GPUs (a ``cpu`` device is none).
* ``--enable-metrics`` (default off): without it SGLang mounts no ``/metrics`` at all
  (``http_server.py``: ``add_prometheus_middleware`` only ``if enable_metrics``), and the
  gateway could read neither ``sglang:num_queue_reqs`` nor ``sglang:token_usage``
  (``gateway/accounting/enginemetrics.py``, ``autoscale.metric``).
* ``--nccl-port``: the torch.distributed port. Unset, SGLang picks one itself (older
  releases: ``port`` + a random 100..1000, which can land on another instance's API
  port; newer: a kernel-chosen free port, racy between instances starting together).
  Each instance gets its own reserved port instead. The tokenizer/scheduler/detokenizer
  links are IPC sockets on one node, so nothing else needs a port (DP attention, which
  derives ``port + 233``, is the user's choice to make with ``--dist-init-addr``).
* Readiness: ``/health``, not ``/health_generate``. Since sglang#8444 both routes share
  one handler: 503 while the server is ``Starting`` (until the warm-up request has
  succeeded), and ``/health`` by default (``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION``)
  already runs the same one-token generation round trip. ``/health_generate`` always
  forces that generation, even when the operator turned it off to keep probes cheap, so
  ``/health`` is the right readiness gate: same answer by default, and it follows the
  operator's choice.
* Liveness (default): the same ``/health``; a ``completion`` probe POSTs
  ``/v1/completions`` for ``--served-model-name`` (else the model path).
"""

from __future__ import annotations

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
from controller.core.engines.owned import HOST, MODEL, PORT, RESERVED, refuse_flags
from controller.core.engines.share import share_args
from controller.core.engines.spelling import parser
from controller.core.engines.vllm import served_model_name

# `reconcile export`'s default image (Docker Hub lmsysorg/sglang). SGLang's install docs
# name v0.5.19-cu129 as the last CUDA 12 tag; newer tags need a CUDA 13 driver.
IMAGE = "docker.io/lmsysorg/sglang:v0.5.19-cu129"

# Flags this recipe sets that spec.args may not set again (see owned.py).
OWNED = {
    "--host": HOST,
    "--port": PORT,
    "--model-path": MODEL,
    "--model": MODEL,  # --model-path's alias
    "--nccl-port": RESERVED,
}


class SglangRecipe:
    engine = "sglang"
    extra_ports = 1  # --nccl-port
    deadline_seconds = 600.0  # loading weights may take minutes
    caches_prefixes = True  # the radix cache

    def launch(self, ctx: RenderContext) -> Launch:
        if not ctx.model:
            raise RecipeError(
                "engine 'sglang' needs spec.model (a Hugging Face id or a local model folder)"
            )
        if len(ctx.extra_ports) < self.extra_ports:
            raise RecipeError("engine 'sglang' needs 1 reserved internal port (--nccl-port)")
        refuse_flags(self.engine, ctx.args, OWNED, abbreviated=parser(self.engine).abbreviations)
        # `python -m` recipe: spec.executable names the interpreter (a venv's python).
        argv: list[str] = [
            ctx.executable or "python3",
            "-m",
            "sglang.launch_server",
            "--model-path",
            ctx.model,
            "--host",
            ctx.host,
            "--port",
            str(ctx.port),
            "--nccl-port",
            str(ctx.extra_ports[0]),
            "--enable-metrics",  # its /metrics: the queue and KV cache the gateway reads
        ]
        if ctx.gpus > 1:
            argv += ["--tp-size", str(ctx.gpus)]
        argv += share_args(self.engine, ctx.memory, ctx.devices, ctx.args)
        argv += ctx.args
        return Launch(
            argv=tuple(argv),
            readiness=ReadinessChecks(http=(HttpCheck("/health"),)),
            liveness=HEALTH,
            completion=CompletionTarget(
                COMPLETIONS, served_model_name(self.engine, ctx.model, ctx.args)
            ),
        )


RECIPE = SglangRecipe()
