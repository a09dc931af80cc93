"""`reconcile restart NAME...` (kubectl's `rollout restart`): a new instance of each
replica, rolling where the deployment's strategy is RollingUpdate, recreated otherwise.

The request is desired state (``<state>/restart/<name>.json``, store/side/restart.py); the
planner replaces every instance started before it. With a daemon on the state dir, it
is woken (the gateway's wake-up datagram, where the daemon serves one; else its resync
pass reads the request) and this command watches the records; without one (cron), it
runs the passes itself, as ``--once --wait`` does. Either way it returns once every
instance is new and Ready (exit 0), or one cannot come up (exit 1), or ``--timeout``.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from controller.cli.common import (
    EXIT_FAIL,
    EXIT_OK,
    config,
    looks,
    no_such,
    reconciler,
    stopped_daemon,
)
from controller.cli.gateway.startlock import stopped
from controller.core.manifest.names import base_name, is_next
from controller.core.plan import RESTARTED
from controller.core.state import STUCK, Phase, Record, backoff_cause
from controller.host import bootclock, procs
from controller.redact import printable
from controller.store.config.node import Config
from controller.store.instances.records import RecordStore
from controller.store.side import daemonset, restart
from controller.store.side.daemonset import daemon_pid as daemon_pid  # its verbs import it here
from controller.store.sidefiles import SideFileError
from controller.store.statedir import StateDir


def cmd_restart(args: argparse.Namespace) -> int:
    names = list(dict.fromkeys(args.names))  # invariant 9: _known lets only records' names on
    cfg = config(args)
    records = RecordStore(cfg.state_dir).peek().records
    if not _known(names, records, cfg.state_dir):
        return EXIT_FAIL
    at = datetime.now(UTC)
    refused = [
        why for n in names if (why := restart.refusal(cfg.state_dir, n, at, bootclock.read()))
    ]
    if refused:  # nothing asked: a drained node would only stop them
        for why in refused:
            print(f"reconcile: restart refused: {why}", file=sys.stderr)
        return EXIT_FAIL
    for name in names:
        try:
            restart.request(cfg.state_dir, name, at)
        except SideFileError as exc:  # say which file, at once: no pass could see it
            print(f"reconcile: {exc}", file=sys.stderr)
            return EXIT_FAIL
        print(f"restart of {name} requested ({_how(_instances(records.values(), name))})")
    daemon = daemon_running(
        cfg.state_dir, [r.owner for n in names for r in _instances(records.values(), n)]
    )
    if daemon is not None:
        woken = wake(cfg.state_dir, daemon)
        if not woken and procs.catches(daemon, signal.SIGUSR1) is False:
            # Older than SIGUSR1's pass, so (but for an hour's releases) than `restart`:
            # waiting the 10 minutes for it said nothing the operator could act on.
            print(_older_daemon(daemon), file=sys.stderr)
            return EXIT_OK if args.no_wait else EXIT_FAIL
        if stopped(daemon):  # its lock held, nothing done: waiting 10 minutes said nothing
            then = f"it restarts {', '.join(names)} once it runs again; the request is kept"
            print(f"reconcile: {stopped_daemon(daemon)}: {then}", file=sys.stderr)
            return EXIT_OK if args.no_wait else EXIT_FAIL
        when = "now" if woken else "at its next resync"
        print(f"the daemon (pid {daemon}) restarts it {when}", file=sys.stderr)
        if args.no_wait:
            return EXIT_OK
        return _watch(cfg, _expected(records, names), at, args.restart_timeout, lambda: None)
    foreign = {n: r for n in names for r in _instances(records.values(), n) if r.owner != cfg.owner}
    for name, rec in foreign.items():
        source = StateDir(cfg.state_dir).in_repo(rec.source)
        print(
            f"reconcile: {name} belongs to another manifest set ({rec.owner}, from "
            f"{source}): its next pass restarts it; run `reconcile restart` with that "
            "set's -f or --owner to restart it now",
            file=sys.stderr,
        )
    mine = [n for n in names if n not in foreign]
    if not mine or args.no_wait:
        return EXIT_OK
    passes = reconciler(cfg)
    return _watch(cfg, _expected(records, mine), at, args.restart_timeout, passes.run_pass)


Expected = dict[str, dict[str, str | None]]  # deployment -> its instances' nonces when asked


def _expected(records: dict[str, Record], names: Sequence[str]) -> Expected:
    """Each deployment's instances when the restart was asked: each must come back new."""
    return {
        n: {r.name: r.nonce for r in _instances(records.values(), n) if not is_next(r.name)}
        for n in names
    }


def _known(names: Sequence[str], records: dict[str, Record], state_dir: Path) -> bool:
    """Each name is a deployment the state dir has records of; else say which is meant."""
    known = {base_name(n) for n in records}
    unknown = [name for name in names if name not in known]
    for name in unknown:
        print(no_such(name, known, state_dir), file=sys.stderr)
    return not unknown


def _instances(records: Iterable[Record], name: str) -> list[Record]:
    return sorted((r for r in records if base_name(r.name) == name), key=lambda r: r.name)


def _how(instances: list[Record]) -> str:
    rolling = any(r.stored_spec.get("strategy") == "RollingUpdate" for r in instances)
    count = sum(not is_next(r.name) for r in instances)
    how = "rolling: RollingUpdate" if rolling else "recreate"
    return f"{count} replica{'s' if count != 1 else ''}, {how}"


def daemon_running(state_dir: Path, owners: Iterable[str]) -> int | None:
    """The daemon's pid when one runs and its passes are the ones that act on records of
    ``owners`` (its own set's); None when none runs, or it runs another set (a cron set
    beside it: only that set's own passes act on its records). A daemon that names no
    set (one from before ``daemon.json``) is taken to run them, as it always was."""
    pid = daemon_pid(state_dir)
    if not pid:
        return pid
    runs = daemonset.owner_of(state_dir, pid)
    return pid if runs is None or all(owner == runs for owner in owners) else None


def _older_daemon(daemon: int) -> str:
    return (
        f"reconcile: the daemon (pid {daemon}) on this state dir is of an older reconcile"
        " (it does not catch SIGUSR1: the package was upgraded, the service not restarted);"
        " it may never act on this request. Restart it (`systemctl restart reconcile`): the"
        " new daemon carries the request out"
    )


def wake(state_dir: Path, daemon: int) -> bool:
    """Ask the daemon for a pass now: the gateway's wake-up datagram where it serves one,
    else SIGUSR1 to the pid that holds the daemon lock right now. False if neither
    reached it: then its resync timer's pass reads the request."""
    from controller.gateway.lifecycle import registry

    address = registry.wake_address(state_dir)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            if address is not None:
                sock.sendto(b"!", address)
                return True
        except OSError:
            pass
    # One that does not catch SIGUSR1 (an older reconcile's, still running after an
    # upgrade of the package) would die of it: its resync reads the request instead.
    if procs.catches(daemon, signal.SIGUSR1) is False:
        return False
    try:
        os.kill(daemon, signal.SIGUSR1)
    except OSError:
        return False
    return True


def _watch(
    cfg: Config,
    expected: Expected,
    at: datetime,
    timeout: float,
    step: Callable[[], object],
) -> int:
    """Until every instance in ``expected`` started after ``at`` and is Ready (``step``:
    run a pass, or nothing while the daemon passes)."""
    names = list(expected)
    deadline = time.monotonic() + timeout
    store = RecordStore(cfg.state_dir)
    shown: dict[str, str] = {}
    for _ in looks(reader=False):  # ends by a return: done, stuck or timed out
        step()
        records = list(store.peek().records.values())
        left = {n: _left(_instances(records, n), expected[n], at) for n in names}
        for name, why in left.items():
            if why and shown.get(name) != why:
                print(f"{name}: {printable(why)}", file=sys.stderr)
            shown[name] = why
        stuck = [f"{n}: {w}" for n, w in left.items() if w.startswith("cannot")]
        if stuck:
            said = printable("; ".join(stuck))
            print(f"reconcile: restart cannot progress: {said}", file=sys.stderr)
            return EXIT_FAIL
        if not any(left.values()):
            for name in names:
                pids = [str(r.ref.pid) for r in _instances(records, name) if r.ref]
                print(f"restarted {name} (pid {', '.join(pids) or '-'})")
            return EXIT_OK
        if time.monotonic() >= deadline:
            waiting = printable("; ".join(f"{n}: {w}" for n, w in left.items() if w))
            print(
                f"reconcile: timed out waiting for the restart ({waiting}): `reconcile "
                "describe NAME` and `reconcile events NAME` say why (with a daemon, its log "
                "too); the restart goes on: wait with `reconcile status -w`, or ask again with "
                "a longer --timeout",
                file=sys.stderr,
            )
            return EXIT_FAIL
    return EXIT_FAIL


def _left(instances: list[Record], expected: dict[str, str | None], at: datetime) -> str:
    """What keeps one deployment's restart from being done ("" when done); "cannot ..."
    when a new instance will not get there by itself (the old ones are the pass's to
    replace, however they are doing)."""
    missing = sorted(set(expected) - {r.name for r in instances})
    if missing:  # between the old one's stop and the new one's reservation
        return f"replacing {', '.join(missing)}"
    for rec in instances:
        if is_next(rec.name):
            return f"rolling: {rec.name} {rec.phase}"
        started = rec.started_at is not None and rec.started_at >= at
        if not started and rec.nonce == expected.get(rec.name):  # still the old one
            if rec.phase is Phase.IDLE:
                continue  # nothing runs: the next start is a fresh one anyway
            if rec.phase is not Phase.PENDING:  # Pending: no room now, a restart or not
                return f"waiting to replace {rec.name} ({rec.phase})"
        if rec.phase is Phase.PENDING and rec.message == RESTARTED:
            # Stopped, its start still to come in the same pass (which may first spend
            # another engine's grace period): a pass that cannot place it says why.
            return f"replacing {rec.name}"
        if rec.phase in STUCK:
            return f"cannot start {rec.name} ({rec.phase}): {rec.message}"
        if rec.exec_failed:  # its program's words and the next move, not "exit 127"
            return f"cannot start {rec.name}: {backoff_cause(rec.message)}"
        if rec.phase is Phase.BACKOFF and rec.restarts > 0 and rec.ready_at is None:
            why = str(rec.last_exit) if rec.last_exit else backoff_cause(rec.message)
            return f"cannot bring {rec.name} up: crash-looping ({why})"
        if rec.phase not in (Phase.READY, Phase.SUCCEEDED):  # a Job's new run may be done
            return f"{rec.name} {rec.phase}"
    return ""
