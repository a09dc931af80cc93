"""One function per verb: wire the configuration to the reconciler and print."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from controller.cli import EXIT_CHANGES, EXIT_FAIL, EXIT_OK, EXIT_USAGE
from controller.durations import parse_duration
from controller.node import Config, resolve


def config(args: argparse.Namespace) -> Config:
    return resolve(
        manifests=args.manifests,
        state_dir=args.state_dir,
        node=args.node,
        devices=args.devices,
        owner=args.owner,
        allow_empty=getattr(args, "allow_empty", False),
        lock_timeout=parse_duration(getattr(args, "lock_timeout", "60s")),
    )


def dispatch(args: argparse.Namespace) -> int:
    verb = args.verb or "run"
    handler = globals()[f"cmd_{verb.replace('get', 'status')}"]
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
        return cmd_plan(args)
    if not args.once:
        from controller.watcher import run_daemon

        return run_daemon(cfg, resync=parse_duration(args.resync))
    from controller.reconciler import Reconciler

    reconciler = Reconciler(cfg)
    if args.wait:
        from controller.waiting import wait_until_ready

        return EXIT_OK if wait_until_ready(reconciler, parse_duration(args.timeout)) else EXIT_FAIL
    result = reconciler.run_pass()
    report(result)
    return EXIT_OK if result.ok else EXIT_FAIL


def report(result: object) -> None:
    from controller.reconciler import PassResult

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


# -- plan ----------------------------------------------------------------------------------


def cmd_plan(args: argparse.Namespace) -> int:
    from controller.manifests import load
    from controller.reconciler import Reconciler

    cfg = config(args)
    loaded = load(cfg.manifests)
    reconciler = Reconciler(cfg)
    observed, problems = reconciler.observe()
    actions = reconciler.plan(reconciler.desired(loaded), observed)
    changes = [a for a in actions if _is_change(a, observed)]
    if (args.output or "text") == "json":
        items = [
            {"name": a.name, "action": a.verb, "change": a.change, "reason": a.reason}
            for a in changes
        ]
        errors = [str(e) for e in loaded.errors] + [p.message for p in problems]
        print(json.dumps({"changes": items, "errors": errors}, indent=2))
    else:
        _print_errors(list(loaded.errors))
        for a in changes:
            print(f"{_SYMBOL.get(a.change, '~')} {a.name}: {a.verb}: {a.reason}")
        if not changes:
            print("in sync: no changes")
    if loaded.errors or problems:
        return EXIT_FAIL
    return EXIT_CHANGES if changes else EXIT_OK


_SYMBOL = {"create": "+", "destroy": "-", "replace": "-/+", "update": "~", "wait": "="}


def _is_change(action: object, observed: object) -> bool:
    from controller.actions import Conflict, Hold
    from controller.state import Observed, Phase

    assert isinstance(observed, Observed)
    if isinstance(action, Conflict):
        return False
    if isinstance(action, Hold):
        view = observed.records.get(action.name)
        return (
            view is None
            or view.record.phase is not Phase.PENDING
            or (view.record.message != action.reason)
        )
    return True


# -- read-only views -------------------------------------------------------------------


def _records(cfg: Config) -> list[object]:
    from controller.records import RecordStore

    return list(RecordStore(cfg.state_dir).load().records.values())


def cmd_status(args: argparse.Namespace) -> int:
    from controller.records import RecordStore
    from controller.views import dump, status_item, status_table

    cfg = config(args)
    snap = RecordStore(cfg.state_dir).load()
    records = [r for n, r in sorted(snap.records.items()) if args.name in (None, n)]
    if args.name and not records:
        print(f"reconcile: no deployment named {args.name!r} in {cfg.state_dir}", file=sys.stderr)
        return EXIT_FAIL
    fmt = args.output or "table"
    if fmt in ("json", "yaml"):
        print(dump([status_item(r) for r in records], fmt))
    elif fmt in ("table", "wide"):
        print(status_table(records) if records else "No deployments.")
    else:
        print(
            f"reconcile: unknown output format {fmt!r} (table, wide, json, yaml)", file=sys.stderr
        )
        return EXIT_USAGE
    for problem in snap.problems:
        print(f"error: {problem.message}", file=sys.stderr)
    return EXIT_OK


def cmd_describe(args: argparse.Namespace) -> int:
    from controller.describe import describe

    text = describe(config(args).state_dir, args.name)
    if text is None:
        print(f"reconcile: no deployment named {args.name!r}", file=sys.stderr)
        return EXIT_FAIL
    print(text)
    return EXIT_OK


def cmd_logs(args: argparse.Namespace) -> int:
    from controller.records import RecordStore

    path = RecordStore(config(args).state_dir).log_path(args.name)
    if not path.exists():
        print(f"reconcile: no log for {args.name!r} at {path}", file=sys.stderr)
        return EXIT_FAIL
    with open(path, "rb") as f:
        lines = f.read().splitlines(keepends=True)
        tail = lines[-args.tail :] if args.tail else lines
        sys.stdout.buffer.write(b"".join(tail))
        sys.stdout.flush()
        while args.follow:
            chunk = f.read()
            if chunk:
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
            else:
                time.sleep(0.2)
    return EXIT_OK


def cmd_validate(args: argparse.Namespace) -> int:
    from controller.manifests import load

    loaded = load(config(args).manifests)
    _print_errors(list(loaded.errors))
    for folder in loaded.missing_folders:
        print(f"warning: manifests folder {folder} does not exist", file=sys.stderr)
    if not loaded.errors:
        print(f"{len(loaded.entries)} deployment(s) in {len(loaded.files)} file(s): valid")
    return EXIT_FAIL if loaded.errors else EXIT_OK


def cmd_schema(args: argparse.Namespace) -> int:
    from controller.specs import json_schema

    print(json.dumps(json_schema(), indent=2))
    return EXIT_OK


def cmd_devices(args: argparse.Namespace) -> int:
    from controller import devices
    from controller.records import RecordStore
    from controller.views import dump, table

    cfg = config(args)
    inventory = devices.resolve(cfg.devices)
    holders: dict[str, list[str]] = {}
    for rec in RecordStore(cfg.state_dir).load().records.values():
        if rec.holds:
            for key in rec.devices:
                holders.setdefault(key, []).append(rec.name)
    items = [
        {
            "device": d.key,
            "kind": d.kind,
            "id": d.id,
            "uuid": d.uuid,
            "name": d.name,
            "memory_total_mb": d.memory_total_mb,
            "held_by": holders.get(d.key, []),
        }
        for d in inventory.devices
    ]
    if args.output in ("json", "yaml"):
        print(dump(items, args.output))
        return EXIT_OK
    rows = [["DEVICE", "UUID", "NAME", "MEMORY", "HELD BY"]]
    for d in inventory.devices:
        mem = f"{d.memory_total_mb} MiB" if d.memory_total_mb else "-"
        held = ",".join(holders.get(d.key, [])) or "-"
        rows.append([d.key, d.uuid or "-", d.name or "-", mem, held])
    print(table(rows) if items else f"No devices (inventory source: {inventory.source}).")
    return EXIT_OK


# -- node controls ----------------------------------------------------------------------


def cmd_drain(args: argparse.Namespace) -> int:
    from controller.node import write_drain
    from controller.records import RecordStore
    from controller.state import Drain

    cfg = config(args)
    RecordStore(cfg.state_dir).ensure()
    until = datetime.now(UTC) + timedelta(seconds=parse_duration(args.ttl))
    who = f"{os.environ.get('USER') or os.getuid()} (pid {os.getpid()})"
    write_drain(cfg.state_dir, Drain(until=until, reason=args.reason, by=who, evict=args.evict))
    print(
        f"node {cfg.node} drained until {until.isoformat(timespec='seconds')}"
        + (" (evicting)" if args.evict else "")
    )
    return EXIT_OK


def cmd_uncordon(args: argparse.Namespace) -> int:
    from controller.node import clear_drain

    cfg = config(args)
    print(f"node {cfg.node} uncordoned" if clear_drain(cfg.state_dir) else "node was not drained")
    return EXIT_OK


def cmd_down(args: argparse.Namespace) -> int:
    from controller.reconciler import Reconciler

    stopped = Reconciler(config(args)).down()
    for name in stopped:
        print(f"stopped {name}")
    return EXIT_OK


__all__ = ["Path", "dispatch"]
