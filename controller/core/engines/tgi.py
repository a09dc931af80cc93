"""``engine: tgi``: Hugging Face Text Generation Inference (``text-generation-launcher``).

Checked against TGI v3.3.5 (the pinned image's tag): ``launcher/src/main.rs`` (``Args``)
and ``router/src/server.rs``:

* ``--model-id M --hostname H --port P``; ``--num-shard N`` when the instance holds
  N > 1 GPUs (TGI would otherwise shard over every GPU it can see; the runtime's
  ``CUDA_VISIBLE_DEVICES`` limits that, ``--num-shard`` makes it explicit). A ``cpu``
  device is a slot of the node's inventory, no GPU to shard over.
* ``--shard-uds-path`` (default ``/tmp/text-generation-server``; shard *r* listens on
  ``<path>-<r>``) and ``--master-port`` (default 29500, torch.distributed) are the same
  for every launcher on a box unless set: a second instance would remove the first
  one's sockets and fail to bind the port. Hugging Face's own two-models-on-one-box
  example sets both. The socket goes in the instance's private runtime folder; the
  master port is a reserved per-instance port.
* ``--prometheus-port`` (since v3.3.0, default 9000): the router also binds a Prometheus
  listener there (``PrometheusBuilder::with_http_listener`` in ``server.rs``), and a
  second launcher on the box could not bind it. It is the second reserved port. A
  record reserved before this flag was passed holds one port: it restarts as it ran.
  ``/metrics`` is served on the API port as well; the gateway reads that one.
* ``--hostname`` must be an IP address: the router parses it as one and, failing,
  warns "Invalid hostname, defaulting to 0.0.0.0" (``server.rs``), so ``host: localhost``
  put the engine on every interface. A host name is refused, naming the address to use.
* Readiness: the router serves ``GET /health`` only after every shard is ready, and
  answers 200 while the model is healthy.
* Liveness (default): the same ``/health``; a ``completion`` probe POSTs the router's
  OpenAI ``/v1/completions``; TGI serves one model and ignores the request's ``model``
  (``completions`` in ``server.rs``), so it asks for ``tgi``, as TGI's own examples do.
"""

from __future__ import annotations

import ipaddress

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
    "--prometheus-port": RESERVED,
    "--shard-uds-path": RESERVED,
}


def ip_address(host: str) -> str:
    """``host`` itself when it is an IP address; else a RecipeError saying which to use."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        loopback = " (127.0.0.1 for localhost)" if host == "localhost" else ""
        raise RecipeError(
            f"engine 'tgi' takes spec.host as an IP address, and {host!r} is a name: TGI's "
            f"router would listen on 0.0.0.0, every interface, instead; write the "
            f"address{loopback}"
        ) from None
    return host


def shard_uds_path(runtime_dir: str) -> str:
    return runtime_dir.rstrip("/") + "/tgi-shard"


class TgiRecipe:
    engine = "tgi"
    extra_ports = 2  # --master-port, --prometheus-port
    deadline_seconds = 600.0  # loading weights may take minutes
    caches_prefixes = True  # prefix caching (v3)

    def launch(self, ctx: RenderContext) -> Launch:
        if not ctx.model:
            raise RecipeError(
                "engine 'tgi' needs spec.model (a Hugging Face id or a local model folder)"
            )
        if not ctx.extra_ports:
            raise RecipeError(
                "engine 'tgi' needs 2 reserved internal ports (--master-port, --prometheus-port)"
            )
        refuse_flags(self.engine, ctx.args, OWNED)
        shards = max(ctx.gpus, 1)
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
            ip_address(ctx.host),
            "--port",
            str(ctx.port),
            "--shard-uds-path",
            uds,
            "--master-port",
            str(ctx.extra_ports[0]),
        ]
        if len(ctx.extra_ports) > 1:  # else a record reserved before: as it ran then
            argv += ["--prometheus-port", str(ctx.extra_ports[1])]
        if ctx.gpus > 1:
            argv += ["--num-shard", str(ctx.gpus)]
        argv += ctx.args
        return Launch(
            argv=tuple(argv),
            readiness=ReadinessChecks(http=(HttpCheck("/health"),)),
            liveness=HEALTH,
            completion=CompletionTarget(COMPLETIONS, "tgi"),
        )


RECIPE = TgiRecipe()
