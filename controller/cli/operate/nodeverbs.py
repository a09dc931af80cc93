"""The node's verbs: devices (who holds what), drain / uncordon (cordon with a TTL).

Each only wires the configuration to a view and prints; exit codes come from cli/common.py.
"""

from __future__ import annotations

import argparse
import getpass
import os
import socket
import sys
from datetime import UTC, datetime
from functools import partial
from typing import Any

from controller.cli.common import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_USAGE,
    config,
    output_format,
    reconciler,
)
from controller.cli.render.views import FORMATS, dump, table
from controller.core.devicefaults import DeviceHealth
from controller.core.devices.inventory import Inventory
from controller.core.manifest.backendnames import on_cluster
from controller.core.manifest.quantity import format_age, format_bytes
from controller.core.state import Phase, Record
from controller.core.statusjson import UNKNOWN, device_items, outside_items
from controller.errors import ConfigError
from controller.redact import printable
from controller.store.config.node import Config, read_drain
from controller.store.instances.records import RecordStore, Snapshot, held_by_unreadable
from controller.store.side import daemonset, devicehealth

# -- devices ------------------------------------------------------------


def cmd_devices(args: argparse.Namespace) -> int:
    fmt = output_format(args, "table", FORMATS)
    if fmt is None:
        return EXIT_USAGE
    cfg = config(args, lenient=True)
    # On a cluster the engines hold the cluster's GPUs (asked of it, as a pass does), not
    # this host's: this host's inventory called each of them "not in the inventory".
    inventory, whose, differs = _inventory(cfg)
    if args.clear:
        return _clear(cfg, inventory.keys(), args.clear)
    snap = RecordStore(cfg.state_dir).peek()  # a read verb moves nothing aside
    records = sorted(snap.records.values(), key=lambda r: r.name)
    faults = devicehealth.peek(cfg.state_dir).faults
    held, held_ports, unknown = _held_unread(cfg, snap, inventory)
    items = device_items(inventory.devices, records, faults, held)  # the web page's too
    items = [_unknown_if_free(d, unknown) for d in items]
    outside = outside_items(inventory.keys(), records, cfg.node)
    ports = [
        {"port": port, "held_by": rec.name, "phase": str(rec.phase)}
        for rec in records
        if rec.holds
        for port in ((rec.port,) if rec.port else ()) + rec.extra_ports
    ]
    ports += [{"port": p, "held_by": h, "phase": UNKNOWN} for p, h in sorted(held_ports.items())]
    if fmt == "name":
        print("".join(f"{d['device']}\n" for d in items), end="")
    elif fmt in ("json", "yaml"):
        doc: dict[str, Any] = {"node": cfg.node, "source": inventory.source}
        doc |= {"inventory_from": whose, "devices": items, "ports": ports}
        print(dump({**doc, "outside_inventory": outside}, fmt))
    else:
        notes = [*([differs] if differs else []), *_overcommitted(items), *_outside_text(outside)]
        print(_devices_text(cfg, inventory.source, items, ports, notes))
    for problem in snap.problems:  # what it holds is not known: the table is not whole
        print(f"error: {problem.message}", file=sys.stderr)
    return EXIT_FAIL if snap.problems else EXIT_OK


def _inventory(cfg: Config) -> tuple[Inventory, str, str | None]:
    """This host's devices, or a cluster's GPUs (the backends' code, and the manifest
    models it imports, only then: a read verb on one box loads no pydantic); whose they
    are (``cluster``, ``daemon``, ``shell``); and where the running daemon's differ from
    this shell's, a line saying so."""
    if on_cluster(cfg.backend):
        from controller.backends.choose import inventory_for

        return inventory_for(cfg), "cluster", None
    from controller.host import devices

    pid = daemonset.daemon_pid(cfg.state_dir)
    ran = daemonset.devices_of(cfg.state_dir, pid) if pid else None
    if ran is None:  # no daemon, or one whose note predates the inventory: this shell's
        return devices.resolve(cfg.devices), "shell", None
    differs = None
    if ran.static != cfg.devices:  # the daemon places by its own, as `status` judges
        differs = (
            f"Inventory: the running daemon's (pid {pid}, {_static_words(ran.static)}), "
            f"not this shell's ({_static_words(cfg.devices)})"
        )
    return devices.resolve(ran.static), "daemon", differs


def _static_words(static: str | None) -> str:
    if static is None:
        return "discovered: no --devices / RECONCILE_DEVICES"
    return f"--devices / RECONCILE_DEVICES {static or '(empty)'}"


def _held_unread(
    cfg: Config, snap: Snapshot, inventory: Inventory
) -> tuple[dict[str, str], dict[int, str], list[str]]:
    """What the records this verb cannot read hold (device -> holder, port -> holder): a
    record of an unknown version what it names, as every pass counts it; a torn one's
    engine what its marker and environment say, as the pass that adopts it tells it (a
    /proc scan; a cluster's engines are not this host's); a live engine no record
    accounts for (its record lost: its spawn note names it), what it holds, as a pass
    spares it holding that. Last, the torn record files whose engine's holdings cannot
    be told."""
    devices, ports = held_by_unreadable(snap.problems)
    recorded = {r.nonce for r in snap.records.values() if r.nonce}
    if not any(p.torn for p in snap.problems) and not _unrecorded(cfg, recorded):
        return devices, ports, []  # no scan, nor what it imports
    from controller.backends.choose import open_backend
    from controller.reconciler.strays import held_by_torn

    backend = None if on_cluster(cfg.backend) else open_backend(cfg)
    torn = held_by_torn(snap.problems, backend, inventory, recorded=recorded)
    return {**devices, **torn.devices}, {**ports, **torn.ports}, torn.unknown


def _unrecorded(cfg: Config, recorded: set[str]) -> bool:
    """A spawn note of a live engine whose nonce no record holds: only then is the /proc
    scan worth its cost (every spawn notes its engine; a teardown removes the note)."""
    if on_cluster(cfg.backend):
        return False
    from controller.cli.look.unrecorded import unrecorded

    return bool(unrecorded(cfg.state_dir, recorded))


def _unknown_if_free(item: dict[str, Any], torn: list[str]) -> dict[str, Any]:
    """A device nothing is seen holding while a torn record's holdings cannot be told: not
    free, but unknown (the record may name it), until a pass adopts its engine."""
    if item["holders"] or not torn:
        return item
    holders = [{"name": f"unknown (torn record {f})", "memory": None, "phase": UNKNOWN}
               for f in torn]  # fmt: skip
    shown = {**item, "held_by": [h["name"] for h in holders], "holders": holders}
    if item["memory"] is not None:
        shown.update(memory_allocated=item["memory"], memory_free=0)
    return shown


def _overcommitted(items: list[dict[str, Any]]) -> list[str]:
    """A device whose size was lowered under its engines: they run on, nothing new fits."""
    return [
        f"{d['device']}: {format_bytes(d['memory_allocated'])} allocated of "
        f"{format_bytes(d['memory'])}: its size was lowered under its engines (they run "
        "on; nothing new is packed on it until they go)"
        for d in items
        if d["memory"] is not None and d["memory_allocated"] > d["memory"]
    ]


def _outside_text(outside: list[dict[str, Any]]) -> list[str]:
    return [
        f"{o['device']} is not in the inventory but held by {', '.join(o['held_by'])} "
        "(it runs on; check --devices / RECONCILE_DEVICES)"
        for o in outside
    ]


def _devices_text(
    cfg: Config,
    source: str,
    items: list[dict[str, Any]],
    ports: list[dict[str, Any]],
    notes: list[str],
) -> str:
    where = f"Ray cluster {cfg.ray_address}" if on_cluster(cfg.backend) else f"Node {cfg.node}"
    out = [f"{where}: {len(items)} device(s), inventory: {source}"]
    if items:
        head = ["DEVICE", "KIND", "ID", "UUID", "NAME", "MEMORY", "ALLOCATED", "FREE", "HEALTH"]
        rows = [[*head, "HELD BY"]]
        for d in items:
            cells = [d["device"], d["kind"], d["id"], d["uuid"], d["name"], *_memory_cells(d)]
            rows.append([str(c or "-") for c in cells] + [d["health"], _held(d["holders"])])
        out += ["", table(rows)]
        out += [
            f"{d['device']} Unhealthy since {d['unhealthy_since']}: "
            f"{printable(str(d['health_reason']))}; "
            f"nothing new is placed on it (`reconcile devices --clear {d['device']}` returns it)"
            for d in items
            if d["health"] == "Unhealthy"
        ]
    out += notes
    if ports:
        rows = [["PORT", "HELD BY", "PHASE"]]
        rows += [[str(p["port"]), str(p["held_by"]), str(p["phase"])] for p in ports]
        out += ["", table(rows)]
    if cfg.limits.max_instances is not None or cfg.limits.per_kind:
        out += ["", f"Limits: maxInstances {cfg.limits.describe()}"]
    return "\n".join(out)


def _clear(cfg: Config, known: tuple[str, ...], names: list[str]) -> int:
    """``devices --clear``: the devices are healthy again (their next reading is new)."""
    unknown = [n for n in names if n not in known]
    if unknown:
        shown = ", ".join(known) or "none"
        print(
            f"reconcile: no device {', '.join(unknown)} on node {cfg.node} (its devices: "
            f"{shown}): name one of those, as `reconcile devices` lists them",
            file=sys.stderr,
        )
        return EXIT_USAGE
    RecordStore(cfg.state_dir).ensure()
    now = datetime.now(UTC)
    for name in names:
        before = devicehealth.read(cfg.state_dir).faults.get(name)
        devicehealth.update(cfg.state_dir, partial(DeviceHealth.cleared_now, device=name, now=now))
        if before is None:
            print(f"{name} was not Unhealthy")
            continue
        since = before.since.isoformat(timespec="seconds")
        print(
            f"{name} cleared (Unhealthy since {since}: {printable(before.reason)}); "
            "engines may be placed on it from the next pass"
        )
    return EXIT_OK


def _memory_cells(item: dict[str, Any]) -> list[str]:
    """MEMORY, ALLOCATED and FREE: `-o json`'s ``memory``, ``memory_allocated`` and
    ``memory_free`` (a whole-device lease allocates all of it)."""
    total, used, free = item["memory"], item["memory_allocated"], item["memory_free"]
    if total is None:
        return ["-", format_bytes(used) if used else "-", "-"]
    left = format_bytes(free) if free else "0"
    if any(h["memory"] is None for h in item["holders"]):
        left = "0 (whole lease)"  # a whole-device lease leaves nothing to share
    return [format_bytes(total), format_bytes(used) if used else "0", left]


def _held(holders: list[dict[str, Any]]) -> str:
    shown = [
        h["name"] + (f" ({format_bytes(h['memory'])})" if h["memory"] else "") for h in holders
    ]
    return ", ".join(shown) or "-"


# -- drain / uncordon ------------------------------------------------------------


def cmd_drain(args: argparse.Namespace) -> int:
    from controller.core.state import Drain
    from controller.host import bootclock
    from controller.store.config.node import write_drain

    ttl: float = args.ttl  # seconds, more than 0 (the parser's type)
    cfg = config(args)
    RecordStore(cfg.state_dir).ensure()
    before = read_drain(cfg.state_dir)
    now, boot = datetime.now(UTC), bootclock.read()
    # The boot clock's reading beside the wall clock's: the ttl runs on it (a clock step
    # neither keeps the node drained longer nor ends it early; docs/design.md).
    drain = Drain.asked(now, ttl, boot, reason=args.reason, by=_who(), evict=args.evict)
    write_drain(cfg.state_dir, drain)
    verb = "renewed" if before is not None and before.active(now, boot) else "drained"
    print(
        f"node {cfg.node} {verb} until {drain.until.isoformat(timespec='seconds')} "
        f"({format_age(ttl)}) by {drain.by}"
        + (f" ({printable(args.reason)})" if args.reason else "")
    )
    print("nothing new starts or restarts; `reconcile uncordon` ends it, or it expires")
    if args.evict:
        evicted, kept = _evict(cfg)
        for name in evicted:
            print(f"evicted {name}")
        for name, why in sorted(kept.items()):
            print(f"reconcile: {name}: {why}", file=sys.stderr)
        return EXIT_FAIL if kept else EXIT_OK
    return EXIT_OK


def _who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()} (pid {os.getppid()})"


def _evict(cfg: Config) -> tuple[list[str], dict[str, str]]:
    """Stop every running engine on the node now, whoever owns it (kubectl drain)."""
    return reconciler(cfg).stop_where(_evictable, "evicted: node drained", evict=True)


def _evictable(rec: Record) -> bool:
    return rec.holds and rec.phase is not Phase.RESERVED


def cmd_uncordon(args: argparse.Namespace) -> int:
    from controller.store.config.node import clear_drain

    cfg = config(args)
    try:
        before = read_drain(cfg.state_dir)
    except ConfigError:  # an unreadable drain file: uncordon is how it gets cleared
        before = None
    if not clear_drain(cfg.state_dir):
        print(f"node {cfg.node} was not drained")
        return EXIT_OK
    said = printable(before.reason) if before and before.reason else "no reason given"
    was = f" (drained by {printable(before.by)}: {said})" if before else ""
    print(f"node {cfg.node} uncordoned{was}; {_started_when(cfg)}")
    return EXIT_OK


def _started_when(cfg: Config) -> str:
    """When the held deployments start: a daemon is woken now (its resync may be an hour
    away), else the next pass (cron's) starts them."""
    from controller.cli.common import stopped_daemon
    from controller.cli.gateway.startlock import stopped
    from controller.cli.operate.restartverb import daemon_pid, wake

    daemon = daemon_pid(cfg.state_dir)
    if daemon and wake(cfg.state_dir, daemon):
        if stopped(daemon):  # woken, it goes on with the pass asked for
            return f"{stopped_daemon(daemon)}: it starts its deployments once it runs again"
        return f"the daemon (pid {daemon}) starts its deployments now"
    return "deployments start on the next pass"
