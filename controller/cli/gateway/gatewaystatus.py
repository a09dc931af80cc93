"""What ``reconcile gateway status`` shows, and the gateway's lines of ``reconcile status``:
which gateway serves (or drains), the one that ended without stopping, a stop in force
and what starts it again, and what a reload refused (``store/side/refused.py``). The
verbs that change the gateway (gatewayverbs.py) say the same facts with these.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from controller.cli.common import EXIT_FAIL, EXIT_OK
from controller.cli.gateway.startlock import stopped
from controller.core.manifest.quantity import format_age
from controller.core.statusjson import iso
from controller.gateway.lifecycle import registry
from controller.store.side import daemonset, refused


def status(state_dir: Path, fmt: str) -> int:
    current = registry.current_live(state_dir)
    found = registry.live(state_dir)
    say_unreadable(state_dir, current)
    if fmt == "json":
        print(json.dumps(_status_json(state_dir, current, found), indent=2))
        return EXIT_OK if found else EXIT_FAIL
    crashed = last_crashed(state_dir) if not found else None
    if not found and crashed is None:
        print(none_runs(state_dir))
    elif not found:
        print(f"no gateway runs for state dir {state_dir}")
    if crashed is not None:
        print(
            f"the last one, pid {crashed.ref.pid} ({crashed.address}), ended without stopping "
            f"(killed or crashed) and {_not_started_again(state_dir)}"
        )
    if found:
        print(f"{'PID':<8} {'ADDRESS':<22} {'VERSION':<10} {'AGE':<8} ROLE")
    for info in found:
        role = "serving" if current is not None and info.nonce == current.nonce else "draining"
        age = format_age(time.time() - info.started_at)  # as status shows ages
        print(f"{info.ref.pid:<8} {info.address:<22} {info.version:<10} {age:<8} {role}")
    for line in refusal_lines(state_dir):
        print(f"warning: {line}")
    return EXIT_OK if found else EXIT_FAIL


def _status_json(
    state_dir: Path, current: registry.GatewayInfo | None, found: list[registry.GatewayInfo]
) -> dict[str, Any]:
    serving = current.nonce if current is not None else None
    return {
        "gateways": [
            {
                "pid": info.ref.pid,
                "address": info.address,
                "version": info.version,
                "started_at": iso(datetime.fromtimestamp(info.started_at, UTC)),
                "role": "serving" if info.nonce == serving else "draining",
            }
            for info in found
        ],
        "refused": [
            {"subject": r.subject, "why": r.why, "by": r.by, "since": iso(r.since), "at": iso(r.at)}
            for r in refused.peek(state_dir)
        ],
    }


def summary(state_dir: Path, now: datetime | None = None) -> str | None:
    """The one line `status` prints above its table when this state dir has a gateway:
    the one serving, the one a daemon restarts, or none since the last one ended without
    stopping (None: no gateway runs, or the last one was stopped or forgotten on purpose)."""
    current = registry.current_live(state_dir)
    if current is not None:
        now = now or datetime.now(UTC)
        since = datetime.fromtimestamp(current.started_at, UTC)
        age = format_age((now - since).total_seconds())
        return (
            f"gateway: pid {current.ref.pid} serves {current.address} "
            f"(since {since:%Y-%m-%d %H:%M:%S} UTC, {age} ago)"
        )
    last = registry.read_current(state_dir)
    if last is None or last.alive():
        return None  # none ever, or the last one stopped cleanly (its exit took the file)
    ended = f"pid {last.ref.pid} at {last.address} ended without stopping"
    daemon = daemonset.daemon_pid(state_dir)
    if daemon and stopped(daemon):  # it starts another only once it runs again
        return f"gateway: none serves ({ended}; the daemon, pid {daemon}, is stopped: kill -CONT)"
    if daemon is not None and not registry.stop_asked(state_dir):
        # Its keeper forgot the crashed one's file and starts another (after a back-off):
        # for that second or more the line said nothing, as if no gateway were wanted.
        return f"gateway: restarting ({ended}; the daemon starts another)"
    if registry.crashed(state_dir, last.nonce):
        return f"gateway: none serves ({ended}: reconcile gateway restart)"
    return None  # forgotten (`down --gateway`) with no daemon to start one


def refusal_lines(state_dir: Path, now: datetime | None = None) -> list[str]:
    """What a reload refused and is still in force, one line each, with since when
    (`status` and `gateway status` say them: the log alone let an edit pass for applied)."""
    now = now or datetime.now(UTC)
    return [
        f"{r.said()} (since {r.since.astimezone(UTC):%H:%M:%S} UTC, "
        f"{format_age((now - r.since).total_seconds())} ago)"
        for r in refused.peek(state_dir)
    ]


def none_runs(state_dir: Path) -> str:
    """No gateway runs and none crashed: why, and the move that starts one (a stopped
    one stays stopped until asked: `gateway status` once said only "no gateway runs")."""
    head = f"no gateway runs for state dir {state_dir}"
    since = registry.stopped_since(state_dir)
    if since is None:
        return f"{head}: start the daemon with --listen (or SIGHUP it, if its gateway was stopped)"
    at = datetime.fromtimestamp(since, UTC)
    moves = "SIGHUP (`kill -HUP` the daemon) or its next start"
    if registry.read_stopped(state_dir) is not None:  # its settings: a restart starts it
        moves = f"`reconcile gateway restart`, {moves}"
    return (
        f"{head}: stopped by `reconcile gateway stop` at {at:%Y-%m-%d %H:%M:%S} UTC; a "
        f"daemon leaves it stopped until {moves}"
    )


def _not_started_again(state_dir: Path) -> str:
    """Why a crashed gateway was not started again, and the move that starts it."""
    daemon = daemonset.daemon_pid(state_dir)
    if daemon and stopped(daemon):  # SIGSTOP holds its lock: "no daemon" was wrong
        return (
            f"the daemon (pid {daemon}) that starts it again is stopped (SIGSTOP, a "
            f"debugger): `kill -CONT {daemon}`, and it starts one"
        )
    return (
        "no daemon started it again: `reconcile gateway restart` starts it (as does a "
        "daemon with --listen)"
    )


def last_crashed(state_dir: Path) -> registry.GatewayInfo | None:
    """The gateway that served last, when it ended without stopping (SIGKILL, a crash:
    its member file is left) and nothing started another (no daemon watched it)."""
    last = registry.read_current(state_dir)
    if last is None or last.alive() or not registry.crashed(state_dir, last.nonce):
        return None
    return last


def say_unreadable(state_dir: Path, current: registry.GatewayInfo | None) -> None:
    """A ``current.json`` that cannot be read: said, with whom the members' files name
    as holding the port in its stead (a restart rewrites it)."""
    why = registry.unreadable_current(state_dir)
    if why is None:
        return
    took = (
        f"pid {current.ref.pid}, which holds the port, is taken as serving"
        if current is not None
        else "no live gateway holds the port"
    )
    print(f"warning: {why}: {took}", file=sys.stderr)
