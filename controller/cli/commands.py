"""One function per verb: wire the configuration to the reconciler and print."""

from __future__ import annotations

import argparse
import sys

from controller.cli.main import EXIT_FAIL, EXIT_OK, EXIT_USAGE
from controller.core.durations import parse_duration
from controller.store.node import Config, resolve


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
        metrics_port=_metrics_listen(args)[1] if getattr(args, "metrics_port", None) else None,
    )


def _metrics_listen(args: argparse.Namespace) -> tuple[str, int]:
    from controller.daemon.metrics import parse_listen
    from controller.errors import ConfigError

    try:
        return parse_listen(args.metrics_port)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def dispatch(args: argparse.Namespace) -> int:
    from controller.cli import exportverb, nodeverbs, opverbs  # status... / drain... / export

    name = f"cmd_{(args.verb or 'run').replace('get', 'status')}"
    handler = (
        getattr(opverbs, name, None)
        or getattr(nodeverbs, name, None)
        or getattr(exportverb, name, None)
        or globals()[name]
    )
    code: int = handler(args)
    return code


def _print_errors(result_errors: list[object]) -> None:
    for error in result_errors:
        print(f"error: {error}", file=sys.stderr)


# -- the control loop and --once ---------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    cfg = config(args)
    if args.wait and not args.once:
        print("reconcile: --wait needs --once", file=sys.stderr)
        return EXIT_USAGE
    if args.dry_run:
        from controller.cli.opverbs import cmd_plan

        return cmd_plan(args)
    if args.metrics_port and args.once:
        print("reconcile: --metrics-port is for the daemon; use --metrics-file", file=sys.stderr)
        return EXIT_USAGE
    if not args.once:
        from controller.daemon.loop import run_daemon

        if args.metrics_port:
            from controller.daemon.metrics import serve

            serve(*_metrics_listen(args))
        return run_daemon(cfg, resync=parse_duration(args.resync), reload=lambda: config(args))
    from controller.reconciler.run import Reconciler

    reconciler = Reconciler(cfg)
    if args.wait:
        from controller.cli.waiting import wait_until_ready

        return EXIT_OK if wait_until_ready(reconciler, parse_duration(args.timeout)) else EXIT_FAIL
    result = reconciler.run_pass()
    report(result)
    return EXIT_OK if result.ok else EXIT_FAIL


def report(result: object) -> None:
    from controller.reconciler.run import PassResult

    assert isinstance(result, PassResult)
    _print_errors(list(result.errors))
    for problem in result.problems:
        print(f"error: {problem.message}", file=sys.stderr)
    if result.prune_blocked:
        print(
            f"warning: {result.prune_blocked}: pruning nothing (use --allow-empty to prune)",
            file=sys.stderr,
        )
    for rec in result.ours():
        if rec.message:
            print(f"{rec.name}: {rec.phase}: {rec.message}", file=sys.stderr)


def cmd_validate(args: argparse.Namespace) -> int:
    from controller.store.manifests import load

    cfg = config(args)
    loaded = load(cfg.manifests, insecure=cfg.insecure_manifests)
    _print_errors(list(loaded.errors))
    for folder in loaded.missing_folders:
        print(f"warning: manifests folder {folder} does not exist", file=sys.stderr)
    if not loaded.errors:
        print(f"{len(loaded.entries)} deployment(s) in {len(loaded.files)} file(s): valid")
    return EXIT_FAIL if loaded.errors else EXIT_OK


def cmd_down(args: argparse.Namespace) -> int:
    from controller.reconciler.run import Reconciler

    stopped = Reconciler(config(args)).down()
    for name in stopped:
        print(f"stopped {name}")
    return EXIT_OK
