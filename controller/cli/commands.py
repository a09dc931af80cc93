"""One function per verb: wire the configuration to the reconciler and print."""

from __future__ import annotations

import argparse
import sys

from controller.cli.common import config, metrics_listen
from controller.cli.common import reconciler as build
from controller.cli.exitcodes import EXIT_FAIL, EXIT_OK, EXIT_USAGE
from controller.core.durations import parse_duration


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

            serve(*metrics_listen(args))
        return run_daemon(cfg, resync=parse_duration(args.resync), reload=lambda: config(args))
    reconciler = build(cfg)
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
    loaded = load(cfg.manifests, insecure=cfg.insecure_manifests, backend=cfg.backend)
    _print_errors(list(loaded.errors))
    for folder in loaded.missing_folders:
        print(f"warning: manifests folder {folder} does not exist", file=sys.stderr)
    if not loaded.errors:
        print(f"{len(loaded.entries)} deployment(s) in {len(loaded.files)} file(s): valid")
    return EXIT_FAIL if loaded.errors else EXIT_OK


def cmd_down(args: argparse.Namespace) -> int:
    stopped = build(config(args)).down()
    for name in stopped:
        print(f"stopped {name}")
    return EXIT_OK
