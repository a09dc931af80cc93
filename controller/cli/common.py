"""Helpers every verb shares: the node configuration from flags, the output format."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from controller.core.durations import parse_duration
from controller.store.node import Config, resolve

if TYPE_CHECKING:
    from controller.reconciler.run import Preview, Reconciler


def config(args: argparse.Namespace) -> Config:
    return resolve(
        manifests=args.manifests,
        state_dir=args.state_dir,
        node=args.node,
        devices=args.devices,
        owner=args.owner,
        allow_empty=getattr(args, "allow_empty", False),
        lock_timeout=parse_duration(getattr(args, "lock_timeout", "60s")),
        insecure_manifests=getattr(args, "insecure_manifests", False),
        max_instances=getattr(args, "max_instances", None),
        node_config=getattr(args, "node_config", None),
        metrics_file=getattr(args, "metrics_file", None),
        metrics_port=metrics_listen(args)[1] if getattr(args, "metrics_port", None) else None,
        backend=getattr(args, "backend", None),
        ray_address=getattr(args, "ray_address", None),
    )


def metrics_listen(args: argparse.Namespace) -> tuple[str, int]:
    from controller.daemon.metrics import parse_listen
    from controller.errors import ConfigError

    try:
        return parse_listen(args.metrics_port)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def output_format(args: argparse.Namespace, default: str, allowed: tuple[str, ...]) -> str | None:
    fmt: str = args.output or default
    if fmt not in allowed:
        print(f"reconcile: unknown output format {fmt!r} ({', '.join(allowed)})", file=sys.stderr)
        return None
    return fmt


def selected(labels: Mapping[str, str], args: argparse.Namespace) -> bool:
    """``-l key=value`` (repeatable): every pair must match, as kubectl's equality selectors."""
    return all(labels.get(key) == value for key, value in getattr(args, "selector", ()))


def reconciler(cfg: Config) -> Reconciler:
    """A reconciler on the configured backend, with the after-pass hooks the flags ask for."""
    from controller.backends.choose import inventory_for, open_backend
    from controller.reconciler.run import Reconciler

    inventory = inventory_for(cfg)
    hooks = []
    if cfg.metrics_file or cfg.metrics_port:  # imported only then: --once stays fast
        from controller.daemon.metrics import exporters

        hooks = exporters(cfg, inventory)
    return Reconciler(cfg, open_backend(cfg), inventory, hooks)


def preview(cfg: Config) -> Preview:
    """The read-only observer and planner (``reconcile plan``): no executor, no locks."""
    from controller.backends.choose import inventory_for, open_backend
    from controller.reconciler.run import Preview

    return Preview(cfg, open_backend(cfg), inventory_for(cfg))
