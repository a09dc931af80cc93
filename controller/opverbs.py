"""The operator's verbs: status, describe, logs, devices, drain, uncordon, plan, schema.

Each only wires the configuration to a view and prints; exit codes come from cli.py.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import os
import socket
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO

from controller import logfiles
from controller.cli import EXIT_CHANGES, EXIT_FAIL, EXIT_OK, EXIT_USAGE
from controller.commands import config
from controller.durations import format_age, parse_duration
from controller.node import Config, read_drain
from controller.records import RecordStore
from controller.state import Phase, Record
from controller.views import FORMATS, dump, table


def _fmt(args: argparse.Namespace, default: str, allowed: tuple[str, ...]) -> str | None:
    fmt: str = args.output or default
    if fmt not in allowed:
        print(f"reconcile: unknown output format {fmt!r} ({', '.join(allowed)})", file=sys.stderr)
        return None
    return fmt


def _problems(problems: list[object]) -> None:
    for problem in problems:
        print(f"error: {getattr(problem, 'message', problem)}", file=sys.stderr)


# -- status / describe ------------------------------------------------------------


def cmd_status(args: argparse.Namespace) -> int:
    from controller.views import drain_line, status_item, status_table

    fmt = _fmt(args, "table", FORMATS)
    if fmt is None:
        return EXIT_USAGE
    cfg = config(args)
    snap = RecordStore(cfg.state_dir).load()
    records = [r for n, r in sorted(snap.records.items()) if args.name in (None, n)]
    if args.name and not records:
        print(f"reconcile: no deployment named {args.name!r} in {cfg.state_dir}", file=sys.stderr)
        return EXIT_FAIL
    if fmt in ("json", "yaml"):
        print(dump([status_item(r) for r in records], fmt))
    else:
        banner = drain_line(cfg.node, read_drain(cfg.state_dir), datetime.now(UTC))
        if banner:
            print(banner, file=sys.stderr)
        print(status_table(records, wide=fmt == "wide") if records else "No deployments.")
    _problems(list(snap.problems))
    return EXIT_OK


def cmd_describe(args: argparse.Namespace) -> int:
    from controller.describe import describe

    text = describe(config(args).state_dir, args.name)
    if text is None:
        print(f"reconcile: no deployment named {args.name!r}", file=sys.stderr)
        return EXIT_FAIL
    print(text)
    return EXIT_OK


# -- logs ------------------------------------------------------------


def cmd_logs(args: argparse.Namespace) -> int:
    if args.previous and args.follow:
        print("reconcile: --previous cannot be followed (that run is over)", file=sys.stderr)
        return EXIT_USAGE
    store = RecordStore(config(args).state_dir)
    path = store.log_path(args.name)
    if not logfiles.stream_files(path):
        print(f"reconcile: no log for {args.name!r} at {path} (never started?)", file=sys.stderr)
        return EXIT_FAIL
    out = sys.stdout.buffer
    try:
        if args.previous:
            return _previous(path, args.name, args.tail, out.write)
        if args.tail is not None:
            out.write(b"".join(logfiles.tail_lines(path, args.tail)))
        else:
            logfiles.copy_stream(path, out)
        out.flush()
        if args.follow:
            logfiles.follow(path, _flushing(out), lambda: store.read(args.name) is not None)
    except BrokenPipeError:  # `reconcile logs x | head`
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_OK


def _previous(path: Path, name: str, tail: int | None, write: Callable[[bytes], object]) -> int:
    found = logfiles.previous_run(path)
    if found is None:
        print(
            f"reconcile: {name} has no previous run in its log (it has not restarted, "
            "or rotation dropped that run)",
            file=sys.stderr,
        )
        return EXIT_FAIL
    lines, intact = found
    if not intact:
        print("reconcile: the start of that run was rotated away", file=sys.stderr)
    write(b"".join(lines[-tail:] if tail is not None and tail > 0 else lines))
    sys.stdout.flush()
    return EXIT_OK


def _flushing(out: BinaryIO) -> Callable[[bytes], None]:
    def write(chunk: bytes) -> None:
        out.write(chunk)
        out.flush()

    return write


# -- devices ------------------------------------------------------------


def cmd_devices(args: argparse.Namespace) -> int:
    from controller import devices

    fmt = _fmt(args, "table", FORMATS)
    if fmt is None:
        return EXIT_USAGE
    cfg = config(args)
    inventory = devices.resolve(cfg.devices)
    records = sorted(RecordStore(cfg.state_dir).load().records.values(), key=lambda r: r.name)
    holders: dict[str, list[str]] = {}
    for rec in records:
        for key in rec.devices if rec.holds else ():
            holders.setdefault(key, []).append(rec.name)
    items = [
        {
            "device": d.key,
            "kind": d.kind,
            "id": d.id,
            "uuid": d.uuid,
            "name": d.name,
            "memory_total_mb": d.memory_total_mb,
            "memory_free_mb": d.memory_free_mb,
            "held_by": holders.get(d.key, []),
        }
        for d in inventory.devices
    ]
    ports = [
        {"port": port, "held_by": rec.name, "phase": str(rec.phase)}
        for rec in records
        if rec.holds
        for port in ((rec.port,) if rec.port else ()) + rec.extra_ports
    ]
    if fmt in ("json", "yaml"):
        doc = {"node": cfg.node, "source": inventory.source, "devices": items, "ports": ports}
        print(dump(doc, fmt))
        return EXIT_OK
    print(_devices_text(cfg, inventory.source, items, ports))
    return EXIT_OK


def _devices_text(
    cfg: Config, source: str, items: list[dict[str, Any]], ports: list[dict[str, Any]]
) -> str:
    out = [f"Node {cfg.node}: {len(items)} device(s), inventory: {source}"]
    if items:
        rows = [["DEVICE", "KIND", "ID", "UUID", "NAME", "MEMORY", "HELD BY"]]
        for d in items:
            mem = f"{d['memory_total_mb']} MiB" if d["memory_total_mb"] else "-"
            cells = [d["device"], d["kind"], d["id"], d["uuid"], d["name"], mem]
            rows.append([str(c or "-") for c in cells] + [",".join(d["held_by"]) or "-"])
        out += ["", table(rows)]
    if ports:
        rows = [["PORT", "HELD BY", "PHASE"]]
        rows += [[str(p["port"]), str(p["held_by"]), str(p["phase"])] for p in ports]
        out += ["", table(rows)]
    if cfg.limits.max_instances is not None or cfg.limits.per_kind:
        out += ["", f"Limits: maxInstances {cfg.limits.describe()}"]
    return "\n".join(out)


# -- drain / uncordon ------------------------------------------------------------


def cmd_drain(args: argparse.Namespace) -> int:
    from controller.node import write_drain
    from controller.state import Drain

    try:
        ttl = parse_duration(args.ttl)
    except ValueError as exc:
        print(f"reconcile: --ttl: {exc}", file=sys.stderr)
        return EXIT_USAGE
    cfg = config(args)
    RecordStore(cfg.state_dir).ensure()
    before = read_drain(cfg.state_dir)
    now = datetime.now(UTC)
    until = now + timedelta(seconds=ttl)
    drain = Drain(until=until, reason=args.reason, by=_who(), evict=args.evict)
    write_drain(cfg.state_dir, drain)
    verb = "renewed" if before is not None and before.active(now) else "drained"
    print(
        f"node {cfg.node} {verb} until {until.isoformat(timespec='seconds')} "
        f"({format_age(ttl)}) by {drain.by}" + (f" ({args.reason})" if args.reason else "")
    )
    print("nothing new starts or restarts; `reconcile uncordon` ends it, or it expires")
    if args.evict:
        for name in _evict(cfg):
            print(f"evicted {name}")
    return EXIT_OK


def _who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()} (pid {os.getppid()})"


def _evict(cfg: Config) -> list[str]:
    """Stop every running engine on the node now, whoever owns it (kubectl drain)."""
    from concurrent.futures import ThreadPoolExecutor

    from controller.actions import Stop
    from controller.reconciler import Reconciler

    reconciler = Reconciler(cfg)
    with reconciler.pass_lock.hold(cfg.lock_timeout):
        running = [r for r in reconciler.store.load().records.values() if _evictable(r)]
        stops = [Stop(name=r.name, reason="evicted: node drained") for r in running]
        if stops:
            with ThreadPoolExecutor(max_workers=min(16, len(stops))) as pool:
                list(pool.map(reconciler.executor.apply, stops))
    return [s.name for s in stops]


def _evictable(rec: Record) -> bool:
    return rec.holds and rec.phase is not Phase.RESERVED


def cmd_uncordon(args: argparse.Namespace) -> int:
    from controller.node import clear_drain

    cfg = config(args)
    try:
        before = read_drain(cfg.state_dir)
    except Exception:  # an unreadable drain file: uncordon is how it gets cleared
        before = None
    if not clear_drain(cfg.state_dir):
        print(f"node {cfg.node} was not drained")
        return EXIT_OK
    was = f" (drained by {before.by}: {before.reason or 'no reason given'})" if before else ""
    print(f"node {cfg.node} uncordoned{was}; deployments start on the next pass")
    return EXIT_OK


# -- plan / schema ------------------------------------------------------------


def cmd_plan(args: argparse.Namespace) -> int:
    from controller import planview
    from controller.manifests import load
    from controller.reconciler import Reconciler

    fmt = _fmt(args, "text", ("text", "json"))
    if fmt is None:
        return EXIT_USAGE
    cfg = config(args)
    loaded = load(cfg.manifests, insecure=cfg.insecure_manifests)
    reconciler = Reconciler(cfg)
    observed, problems = reconciler.observe()
    desired = reconciler.desired(loaded)
    found = planview.changes(reconciler.plan(desired, observed), desired, observed)
    errors = [str(e) for e in loaded.errors] + [p.message for p in problems]
    pending = planview.pending(found)
    if fmt == "json":
        doc = {
            "node": cfg.node,
            "in_sync": not pending,
            "changes": [c.as_json() for c in found if c.kind != "unchanged"],
            "unchanged": [
                {"name": c.name, "phase": c.reason} for c in found if c.kind == "unchanged"
            ],
            "summary": planview.summary(found),
            "errors": errors,
        }
        print(json.dumps(doc, indent=2))
    else:
        print(planview.text(found, errors))
    if errors:
        return EXIT_FAIL
    return EXIT_CHANGES if pending else EXIT_OK


def cmd_schema(args: argparse.Namespace) -> int:
    from controller.schemadoc import documented_schema

    print(json.dumps(documented_schema(), indent=2))
    return EXIT_OK
