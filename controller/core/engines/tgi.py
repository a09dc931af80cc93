"""``engine: tgi``: Hugging Face Text Generation Inference (``text-generation-launcher``).

Checked against TGI's launcher reference (``docs/source/reference/launcher.md``) and
``launcher/src/main.rs``:

* ``--model-id M --hostname H --port P``; ``--num-shard N`` when the instance holds
  N > 1 devices (TGI would otherwise shard over every GPU it can see; the runtime's
  ``CUDA_VISIBLE_DEVICES`` limits that, ``--num-shard`` makes it explicit).
* ``--shard-uds-path`` (default ``/tmp/text-generation-server``; shard *r* listens on
  ``<path>-<r>``) and ``--master-port`` (default 29500, torch.distributed) are the same
  for every launcher on a box unless set: a second instance would remove the first
  one's sockets and fail to bind the port. Hugging Face's own two-models-on-one-box
  example sets both. The socket goes in the instance's private runtime folder; the
  master port is a reserved per-instance port.
* Readiness: the router serves ``GET /health`` only after every shard is ready, and
  answers 200 while the model is healthy.
* Liveness (default): the same ``/health``; a ``completion`` probe POSTs the router's
  OpenAI ``/v1/completions`` (TGI serves one model: its id there is ``tgi``).
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

# `reconcile export`'s default image: the one TGI's README runs (a CUDA build).
IMAGE = "ghcr.io/huggingface/text-generation-inference:3.3.5"

# sockaddr_un.sun_path is 108 bytes with the trailing NUL; TGI appends "-<rank>".
_UDS_MAX = 107

# Flags this recipe sets that spec.args may not set again (see owned.py).
OWNED = {
    "--hostname": HOST,
    "--port": PORT,
    "-p": PORT,
    "--model-id": MODEL,
    "--master-port": RESERVED,
    "--shard-uds-path": RESERVED,
}


def shard_uds_path(runtime_dir: str) -> str:
    return runtime_dir.rstrip("/") + "/tgi-shard"


class TgiRecipe:
    engine = "tgi"
    extra_ports = 1  # --master-port
    deadline_seconds = 600.0  # loading weights may take minutes
    caches_prefixes = True  # prefix caching (v3)

    def launch(self, ctx: RenderContext) -> Launch:
        if not ctx.model:
            raise RecipeError(
                "engine 'tgi' needs spec.model (a Hugging Face id or a local model folder)"
            )
        if len(ctx.extra_ports) < self.extra_ports:
            raise RecipeError("engine 'tgi' needs 1 reserved internal port (--master-port)")
        refuse_flags(self.engine, ctx.args, OWNED)
        shards = max(len(ctx.devices), 1)
        uds = shard_uds_path(ctx.runtime_dir)
        longest = f"{uds}-{shards - 1}"
        if len(longest.encode()) > _UDS_MAX:
            raise RecipeError(
                f"TGI's shard socket path {longest!r} is longer than a unix socket allows "
                f"({_UDS_MAX} bytes); use a shorter --state-dir"
            )
        argv: list[str] = [
            ctx.executable or "text-generation-launcher",
            "--model-id",
            ctx.model,
            "--hostname",
            ctx.host,
            "--port",
            str(ctx.port),
            "--shard-uds-path",
            uds,
            "--master-port",
            str(ctx.extra_ports[0]),
        ]
        if len(ctx.devices) > 1:
            argv += ["--num-shard", str(len(ctx.devices))]
        argv += ctx.args
        return Launch(
            argv=tuple(argv),
            readiness=ReadinessChecks(http=(HttpCheck("/health"),)),
            liveness=HEALTH,
            completion=CompletionTarget(COMPLETIONS, "tgi"),
        )


RECIPE = TgiRecipe()
